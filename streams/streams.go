package streams

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

//go:embed *.json
var files embed.FS

// Options are the deployment settings that override the embedded definitions.
type Options struct {
	// Replicas for every stream and bucket. Defaults to 1.
	Replicas int
	// TaskShards is the number of task streams. Defaults to 4.
	TaskShards int
	// Partitions is the number of scheduler partitions submissions and
	// results are split into by job id. Defaults to 8.
	Partitions int
	// PresenceTTL is the presence bucket's TTL. Defaults to the file's (3s).
	PresenceTTL time.Duration
	// LeaseTTL is the leases bucket's TTL. Defaults to the file's (5s).
	LeaseTTL time.Duration
}

// DefaultTaskShards is the task shard count when none is configured.
const DefaultTaskShards = 4

// DefaultPartitions is the scheduler partition count when none is configured.
const DefaultPartitions = 8

func (o Options) withDefaults() Options {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.TaskShards <= 0 {
		o.TaskShards = DefaultTaskShards
	}
	if o.Partitions <= 0 {
		o.Partitions = DefaultPartitions
	}
	return o
}

// IncompatibleError says an existing stream or bucket differs from its
// definition in a way the server will not update.
type IncompatibleError struct {
	Name string
	Err  error
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("stream %s exists with a configuration incompatible with streams/*.json "+
		"(inspect it with `nats stream info %s`; back it up and delete it, or fix the deployment settings): %v",
		e.Name, e.Name, e.Err)
}

func (e *IncompatibleError) Unwrap() error { return e.Err }

func decode(name string, v any) error {
	b, err := files.ReadFile(name)
	if err != nil {
		return fmt.Errorf("read embedded %s: %w", name, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode embedded %s: %w", name, err)
	}
	return nil
}

// StreamConfigs returns every stream definition with the options applied:
// submit, results, events, dead letters and one stream per task shard.
func StreamConfigs(opts Options) ([]jetstream.StreamConfig, error) {
	opts = opts.withDefaults()
	var out []jetstream.StreamConfig
	for _, f := range []string{"submit.json", "results.json", "events.json", "dlq.json"} {
		var c jetstream.StreamConfig
		if err := decode(f, &c); err != nil {
			return nil, err
		}
		c.Replicas = opts.Replicas
		switch c.Name {
		case protocol.StreamSubmit:
			src, dst := protocol.SubmitTransform(opts.Partitions)
			c.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dst}
		case protocol.StreamResults:
			src, dst := protocol.ResultTransform(opts.Partitions)
			c.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dst}
		}
		out = append(out, anchored(c))
	}
	// Delayed submissions: a work queue, but no anchor (it is not on the
	// data path's hot loop, and only schedulers write it).
	var delay jetstream.StreamConfig
	if err := decode("delay.json", &delay); err != nil {
		return nil, err
	}
	delay.Replicas = opts.Replicas
	out = append(out, delay)
	var adv jetstream.StreamConfig
	if err := decode("advisories.json", &adv); err != nil {
		return nil, err
	}
	adv.Replicas = opts.Replicas
	adv.Subjects = nil
	for i := 0; i < opts.TaskShards; i++ {
		adv.Subjects = append(adv.Subjects,
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+protocol.TaskStream(i)+".*",
			"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."+protocol.TaskStream(i)+".*")
	}
	out = append(out, adv)
	var task jetstream.StreamConfig
	if err := decode("tasks.json", &task); err != nil {
		return nil, err
	}
	for i := 0; i < opts.TaskShards; i++ {
		c := task
		c.Name = protocol.TaskStream(i)
		c.Subjects = []string{protocol.TaskStreamSubjects(i)}
		c.Description = fmt.Sprintf("Task shard %d of %d: warden.task.%d.<pool>.<agent>.", i, opts.TaskShards, i)
		c.Replicas = opts.Replicas
		out = append(out, anchored(c))
	}
	return out, nil
}

// anchored adds a work-queue stream's anchor subject (protocol.AnchorSubject)
// to its subjects.
func anchored(c jetstream.StreamConfig) jetstream.StreamConfig {
	if c.Retention == jetstream.WorkQueuePolicy {
		c.Subjects = append(slices.Clone(c.Subjects), protocol.AnchorSubject(c.Name))
	}
	return c
}

// Anchored returns the names of the streams that have an anchor: the
// work-queue streams of the data path (submissions, results and every task
// shard). WARDEN_ADVISORIES is a work queue too, but written only when a
// task exhausts its deliveries.
func Anchored(opts Options) ([]string, error) {
	cs, err := StreamConfigs(opts)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range cs {
		if slices.Contains(c.Subjects, protocol.AnchorSubject(c.Name)) {
			out = append(out, c.Name)
		}
	}
	return out, nil
}

// KeyValueConfigs returns the job store, presence, leases, health,
// cluster definitions, cluster runtime, cluster leases and deployment
// buckets, in nats.go's form (which cannot say whether a bucket refuses
// roll-ups: Ensure applies that, see rollups.go).
func KeyValueConfigs(opts Options) ([]jetstream.KeyValueConfig, error) {
	bs, err := buckets(opts)
	return kvConfigs(bs), err
}

// buckets returns the definitions KeyValueConfigs describes.
func buckets(opts Options) ([]bucketDef, error) {
	opts = opts.withDefaults()
	var out []bucketDef
	for _, f := range []string{"kv_jobs.json", "kv_presence.json", "kv_leases.json", "kv_health.json", "kv_clusters.json", "kv_cluster_runtime.json", "kv_cluster_leases.json", "kv_deployment.json"} {
		b, err := decodeBucket(f)
		if err != nil {
			return nil, err
		}
		b.Replicas = opts.Replicas
		switch b.Bucket {
		case protocol.BucketPresence:
			if opts.PresenceTTL > 0 {
				b.TTL = opts.PresenceTTL
			}
		case protocol.BucketLeases, protocol.BucketClusterLeases:
			if opts.LeaseTTL > 0 {
				b.TTL = opts.LeaseTTL
			}
		}
		out = append(out, b)
	}
	return out, nil
}

func kvConfigs(bs []bucketDef) []jetstream.KeyValueConfig {
	out := make([]jetstream.KeyValueConfig, 0, len(bs))
	for _, b := range bs {
		out = append(out, b.KeyValueConfig)
	}
	return out
}

// TaskConsumer returns an agent's task consumer on its shard stream.
func TaskConsumer(shard int, pool, agent string, lease time.Duration, maxDeliver, maxAckPending int) (jetstream.ConsumerConfig, error) {
	var c jetstream.ConsumerConfig
	if err := decode("consumer_task.json", &c); err != nil {
		return c, err
	}
	c.Durable = agent
	c.Description = fmt.Sprintf("Tasks of agent %s in pool %s", agent, pool)
	c.FilterSubject = protocol.TaskSubject(shard, pool, agent)
	if lease > 0 {
		c.AckWait = lease
	}
	if maxDeliver != 0 {
		c.MaxDeliver = maxDeliver
	}
	if maxAckPending > 0 {
		c.MaxAckPending = maxAckPending
	}
	return c, nil
}

// SupervisorConsumer returns the consumer the supervisor leader uses on
// WARDEN_ADVISORIES; it has the same shape as the schedulers'.
func SupervisorConsumer() (jetstream.ConsumerConfig, error) {
	c, err := SchedulerConsumer()
	c.Durable = "supervisor"
	c.Description = "The supervisor leader's consumer of task advisories."
	return c, err
}

// PartitionConsumer returns the schedulers' consumer of one partition of a
// stream (kind "submit" or "results"), from consumer_partition.json:
// pinned to one scheduler at a time (priority group "owner"), so that
// scheduler may cache the partition's jobs; another takes over after
// pinnedTTL without pulls. Its state is kept in memory: on disk, its state
// file writes after every delivery and ack were 15 % of the server's CPU
// under load (docs/performance.md, "Session 8"); a server that restarts
// forgets it, and the scheduler creates it again (the messages it had not
// acknowledged are still in the work-queue stream and are delivered anew).
func PartitionConsumer(kind string, p int, filter string, ackWait, pinnedTTL time.Duration) (jetstream.ConsumerConfig, error) {
	var c jetstream.ConsumerConfig
	if err := decode("consumer_partition.json", &c); err != nil {
		return c, err
	}
	c.Durable = fmt.Sprintf("scheduler-%s-%d", kind, p)
	c.Description = fmt.Sprintf("Partition %d of the schedulers' %s: one scheduler at a time owns it.", p, kind)
	c.FilterSubject = filter
	c.AckWait = ackWait
	c.PinnedTTL = pinnedTTL
	return c, nil
}

// PriorityGroupOwner is the priority group of the partition consumers.
const PriorityGroupOwner = "owner"

// SchedulerConsumer returns the consumer the schedulers share on a stream.
func SchedulerConsumer() (jetstream.ConsumerConfig, error) {
	var c jetstream.ConsumerConfig
	err := decode("consumer_scheduler.json", &c)
	return c, err
}

// Ensure creates every stream and bucket, or updates it to its definition.
// It is safe to call from every process at every start. Settings out of
// their bounds (Options.Validate) change nothing. It then checks
// the deployment record (CheckDeployment): a process whose task shards or
// partitions differ from the deployment's gets a *MismatchError and changes
// nothing.
func Ensure(ctx context.Context, js jetstream.JetStream, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	streams, err := StreamConfigs(opts)
	if err != nil {
		return err
	}
	// Before the deployment record: a refusal must leave the record as it
	// was, so that the old partition count can run until the queues drain.
	for _, c := range streams {
		if err := refuseStranding(ctx, js, c); err != nil {
			return err
		}
	}
	if err := CheckDeployment(ctx, js, opts.Deployment(), opts.withDefaults().Replicas); err != nil {
		return err
	}
	if err := migrateSubmit(ctx, js, streams); err != nil {
		return err
	}
	for _, c := range streams {
		if err := ensureStream(ctx, js, c); err != nil {
			return err
		}
	}
	kvs, err := buckets(opts)
	if err != nil {
		return err
	}
	for _, c := range kvs {
		// A process that does not own a TTL (a scheduler, for the leases
		// bucket) must not reset the owner's setting to the file's default:
		// it keeps the bucket's TTL, and applies the rest of the definition
		// (replicas, after `warden setup --replicas 3` on a deployment that
		// began with one, were never applied to these buckets before).
		leases := c.Bucket == protocol.BucketLeases || c.Bucket == protocol.BucketClusterLeases
		if (leases && opts.LeaseTTL == 0) || (c.Bucket == protocol.BucketPresence && opts.PresenceTTL == 0) {
			if st, err := js.Stream(ctx, "KV_"+c.Bucket); err == nil {
				c.TTL = st.CachedInfo().Config.MaxAge
			}
		}
		if err := ensureKV(ctx, js, c); err != nil {
			return err
		}
	}
	return nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, c jetstream.StreamConfig) error {
	h := streamHash(c)
	if upToDate(ctx, js, c.Name, h) {
		return nil
	}
	c.Metadata = withHash(c.Metadata, h)
	if err := createOrUpdateStream(ctx, js, c); err != nil {
		return setupError(c.Name, err)
	}
	return nil
}

// partitionsRE reads the partition count of a submit or results stream's
// subject transform (protocol.SubmitTransform, ResultTransform).
var partitionsRE = regexp.MustCompile(`\{\{partition\((\d+),`)

// refuseStranding refuses to lower a stream's partitions while messages
// wait on the partitions that would go: the new schedulers' consumers
// filter on partitions below the new count, so a submission or result
// stored under a higher one would never be read, an accepted job that
// never ends. Run with the old count until those queues drain, then
// change it.
func refuseStranding(ctx context.Context, js jetstream.JetStream, c jetstream.StreamConfig) error {
	if c.SubjectTransform == nil {
		return nil
	}
	st, err := js.Stream(ctx, c.Name)
	if err != nil {
		return nil // a new stream strands nothing
	}
	old := st.CachedInfo().Config.SubjectTransform
	if old == nil {
		return nil
	}
	oldN, okOld := partitionsOf(old.Destination)
	newN, okNew := partitionsOf(c.SubjectTransform.Destination)
	if !okOld || !okNew || newN >= oldN {
		return nil
	}
	prefix := strings.SplitN(c.SubjectTransform.Source, ".*", 2)[0] // warden.submit, warden.result
	var waiting uint64
	for p := newN; p < oldN; p++ {
		n, err := stored(ctx, st, fmt.Sprintf("%s.%d.>", prefix, p), nil)
		if err != nil {
			return setupError(c.Name, fmt.Errorf("count messages on partition %d: %w", p, err))
		}
		waiting += n
	}
	if waiting == 0 {
		return nil
	}
	return setupError(c.Name, fmt.Errorf("lowering partitions from %d to %d would strand %d messages waiting on partitions %d-%d, "+
		"which no scheduler would read again: run every scheduler and supervisor with partitions %d until %s holds none of them, then change it",
		oldN, newN, waiting, newN, oldN-1, oldN, c.Name))
}

// stored counts the messages st holds on subjects matching filter, but for
// those skip says to leave out (nil: none).
func stored(ctx context.Context, st jetstream.Stream, filter string, skip func(subject string) bool) (uint64, error) {
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, err
	}
	var n uint64
	for subject, c := range info.State.Subjects {
		if skip == nil || !skip(subject) {
			n += c
		}
	}
	return n, nil
}

func partitionsOf(dest string) (int, bool) {
	m := partitionsRE.FindStringSubmatch(dest)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}

func createOrUpdateStream(ctx context.Context, js jetstream.JetStream, c jetstream.StreamConfig) error {
	_, err := js.CreateStream(ctx, c)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("create stream %s: %w", c.Name, err)
	}
	if _, err := js.UpdateStream(ctx, c); err != nil {
		if isAPIError(err) {
			return &IncompatibleError{Name: c.Name, Err: err}
		}
		return fmt.Errorf("update stream %s: %w", c.Name, err)
	}
	return nil
}

func isAPIError(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr)
}
