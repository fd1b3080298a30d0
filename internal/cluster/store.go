package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/watch"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Errors of the Store. ErrNotFound wraps jetstream.ErrKeyNotFound and
// ErrExists jetstream.ErrKeyExists, so callers may test either.
var (
	ErrNotFound = fmt.Errorf("cluster not found: %w", jetstream.ErrKeyNotFound)
	ErrExists   = fmt.Errorf("cluster already exists: %w", jetstream.ErrKeyExists)
	ErrChanged  = errors.New("cluster changed meanwhile: read it again")
)

// Store reads and writes cluster definitions and reads what members and
// leaders wrote. Every change to a definition is an event.
type Store struct {
	js     jetstream.JetStream
	defs   jetstream.KeyValue // warden_clusters: definitions
	rt     jetstream.KeyValue // warden_cluster_runtime: what members write
	events *events.Publisher
	now    func() time.Time
	// requestTTL is RequestTTL (shorter in tests).
	requestTTL time.Duration
}

// RequestTTL is how long a request waits for a leader. The server removes
// one no leader handled by then: a failover asked while the cluster had no
// leader (the CLI gave up and said so) must not be carried out by the
// leader elected hours later.
const RequestTTL = 10 * time.Minute

// requestMarkerTTL is how long the marker of a removed request stays: it
// tells WaitHandled the request is gone, then the server removes it, so
// handled requests leave nothing behind (a delete marker stayed for good).
const requestMarkerTTL = time.Hour

// Open binds a store to the cluster buckets (pkg/protocol: definitions
// apart from what members write).
func Open(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	defs, err := js.KeyValue(ctx, protocol.BucketClusters)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketClusters, err)
	}
	rt, err := js.KeyValue(ctx, protocol.BucketClusterRuntime)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketClusterRuntime, err)
	}
	return &Store{js: js, defs: defs, rt: rt, events: events.NewPublisher(js), now: time.Now, requestTTL: RequestTTL}, nil
}

// Definitions is the definitions bucket.
func (s *Store) Definitions() jetstream.KeyValue { return s.defs }

// Runtime is the bucket of states, sync states, member reports and
// requests.
func (s *Store) Runtime() jetstream.KeyValue { return s.rt }

func (s *Store) publish(ctx context.Context, kind protocol.EventKind, d protocol.ClusterDefinition, rev uint64) {
	_ = s.events.Publish(ctx, protocol.Event{Kind: kind, ID: fmt.Sprintf("%s-%d", d.Name, rev),
		Data: map[string]string{"cluster": d.Name, "mode": d.Mode, "revision": fmt.Sprint(rev)}})
}

// Create stores a new definition (defaults filled, validated).
func (s *Store) Create(ctx context.Context, d protocol.ClusterDefinition) (protocol.ClusterDefinition, error) {
	d = WithDefaults(d)
	if err := Validate(d); err != nil {
		return d, err
	}
	d.CreatedAt = s.now().UTC()
	d.UpdatedAt = d.CreatedAt
	b, _ := json.Marshal(d)
	rev, err := s.defs.Create(ctx, d.Name, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return d, fmt.Errorf("%s: %w", d.Name, ErrExists)
	}
	if err != nil {
		return d, fmt.Errorf("create cluster %s: %w", d.Name, err)
	}
	s.publish(ctx, protocol.EventClusterCreated, d, rev)
	return d, nil
}

// Update replaces a definition, keeping its creation time.
func (s *Store) Update(ctx context.Context, d protocol.ClusterDefinition) (protocol.ClusterDefinition, error) {
	d = WithDefaults(d)
	if err := Validate(d); err != nil {
		return d, err
	}
	old, rev, err := s.Get(ctx, d.Name)
	if err != nil {
		return d, err
	}
	d.CreatedAt, d.UpdatedAt = old.CreatedAt, s.now().UTC()
	b, _ := json.Marshal(d)
	nrev, err := s.defs.Update(ctx, d.Name, b, rev)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return d, fmt.Errorf("%s: %w", d.Name, ErrChanged)
	}
	if err != nil {
		return d, fmt.Errorf("update cluster %s: %w", d.Name, err)
	}
	s.publish(ctx, protocol.EventClusterUpdated, d, nrev)
	return d, nil
}

// Delete removes a definition and the state its leader wrote. Members keep
// running and wait for a definition of that name again.
func (s *Store) Delete(ctx context.Context, name string) error {
	d, rev, err := s.Get(ctx, name)
	if err != nil {
		return err
	}
	if err := s.defs.Delete(ctx, name, jetstream.LastRevision(rev)); errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("%s: %w", name, ErrChanged)
	} else if err != nil {
		return fmt.Errorf("delete cluster %s: %w", name, err)
	}
	_ = s.rt.Delete(ctx, protocol.ClusterStateKey(name))
	_ = s.rt.Delete(ctx, protocol.ClusterSyncKey(name))
	s.publish(ctx, protocol.EventClusterDeleted, d, rev)
	return nil
}

// Get reads a definition and its revision.
func (s *Store) Get(ctx context.Context, name string) (protocol.ClusterDefinition, uint64, error) {
	if !protocol.ValidToken(name) {
		return protocol.ClusterDefinition{}, 0, fmt.Errorf("%q: %w", name, ErrNotFound)
	}
	e, err := s.defs.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return protocol.ClusterDefinition{}, 0, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if err != nil {
		return protocol.ClusterDefinition{}, 0, fmt.Errorf("read cluster %s: %w", name, err)
	}
	d, err := Decode(e.Value())
	return d, e.Revision(), err
}

// List reads every definition, sorted by name.
func (s *Store) List(ctx context.Context) ([]protocol.ClusterDefinition, error) {
	lister, err := s.defs.ListKeysFiltered(ctx, "*")
	if err != nil {
		return nil, fmt.Errorf("list clusters: %w", err)
	}
	var out []protocol.ClusterDefinition
	for k := range lister.Keys() {
		if d, _, err := s.Get(ctx, k); err == nil {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// State reads the leader's last state (zero and ErrNotFound if none).
func (s *Store) State(ctx context.Context, name string) (protocol.ClusterState, uint64, error) {
	var st protocol.ClusterState
	rev, err := s.getJSON(ctx, protocol.ClusterStateKey(name), &st)
	return st, rev, err
}

// Sync reads the leader's sync state.
func (s *Store) Sync(ctx context.Context, name string) (protocol.ClusterSync, error) {
	var st protocol.ClusterSync
	_, err := s.getJSON(ctx, protocol.ClusterSyncKey(name), &st)
	return st, err
}

func (s *Store) getJSON(ctx context.Context, key string, v any) (uint64, error) {
	e, err := s.rt.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return e.Revision(), nil
}

// Reports reads every member report of a cluster still in the bucket,
// sorted by key.
func (s *Store) Reports(ctx context.Context, name string) ([]protocol.ClusterMemberReport, error) {
	lister, err := s.rt.ListKeysFiltered(ctx, protocol.ClusterMembersFilter(name))
	if err != nil {
		return nil, fmt.Errorf("list members of %s: %w", name, err)
	}
	var out []protocol.ClusterMemberReport
	for k := range lister.Keys() {
		var r protocol.ClusterMemberReport
		if _, err := s.getJSON(ctx, k, &r); err == nil {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, nil
}

// Request asks the cluster's leader for an operation and returns its id.
// The leader removes the request once handled (RemoveRequest, see
// WaitHandled); one no leader handles within RequestTTL lapses.
func (s *Store) Request(ctx context.Context, name string, r protocol.ClusterRequest) (string, error) {
	if _, _, err := s.Get(ctx, name); err != nil {
		return "", err
	}
	if r.ID == "" {
		r.ID = strings.ToLower(nuid.Next())
	}
	r.RequestedAt = s.now().UTC()
	b, _ := json.Marshal(r)
	if _, err := s.rt.Create(ctx, protocol.ClusterRequestKey(name, r.ID), b, jetstream.KeyTTL(s.requestTTL)); err != nil {
		return "", fmt.Errorf("request %s on %s: %w", r.Op, name, err)
	}
	return r.ID, nil
}

// ErrClaimed: the leader took the request (ClusterRequest.ClaimedBy) and
// carries it out; it can no longer be withdrawn.
var ErrClaimed = errors.New("the cluster's leader has taken the request")

// RemoveRequest removes a request the leader handled.
func (s *Store) RemoveRequest(ctx context.Context, name, id string) error {
	return s.rt.Purge(ctx, protocol.ClusterRequestKey(name, id), jetstream.PurgeTTL(requestMarkerTTL))
}

// claimRequest marks request r, seen at revision rev, as taken by leader
// by: a compare-and-set, lost to a withdrawal or to another claim. The
// claim keeps the request's TTL, so one whose leader died before acting
// lapses as an unclaimed one does unless a later leader takes it.
func (s *Store) claimRequest(ctx context.Context, name string, r protocol.ClusterRequest, rev uint64, by string) error {
	r.ClaimedBy = by
	b, _ := json.Marshal(r)
	m := nats.NewMsg("$KV." + protocol.BucketClusterRuntime + "." + protocol.ClusterRequestKey(name, r.ID))
	m.Data = b
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	m.Header.Set(jetstream.MsgTTLHeader, s.requestTTL.String())
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("claim request %s: %w", r.ID, err)
	}
	return nil
}

// WithdrawRequest removes a request no leader has taken yet, by a
// compare-and-set against the leader's claim: nil means no leader will
// carry it out. ErrClaimed (naming the leader) if one has taken it,
// ErrNotFound if it is gone (handled, or lapsed).
func (s *Store) WithdrawRequest(ctx context.Context, name, id string) error {
	key := protocol.ClusterRequestKey(name, id)
	for range 2 {
		e, err := s.rt.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("request %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("read request %s: %w", id, err)
		}
		var r protocol.ClusterRequest
		if json.Unmarshal(e.Value(), &r) == nil && r.ClaimedBy != "" {
			return fmt.Errorf("%w (%s)", ErrClaimed, r.ClaimedBy)
		}
		err = s.rt.Purge(ctx, key, jetstream.PurgeTTL(requestMarkerTTL), jetstream.LastRevision(e.Revision()))
		if err == nil {
			return nil
		}
		if !streams.LostCAS(err) && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("withdraw request %s: %w", id, err)
		}
		// Claimed (or handled) meanwhile: read it again.
	}
	return fmt.Errorf("withdraw request %s: %w", id, ErrChanged)
}

// WaitHandled waits until the leader has handled (removed) a request. A
// request already gone when the watch first reads the bucket was handled
// before it looked.
func (s *Store) WaitHandled(ctx context.Context, name, id string) error {
	key := protocol.ClusterRequestKey(name, id)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	present := false
	handled := false
	w := watch.ForKV(s.js, s.rt, watch.Config{Keys: []string{key}, Synced: func(bool) {
		if !present {
			handled = true
			cancel()
		}
	}})
	err := w.Run(ctx, func(e watch.Event) {
		present = !e.Gone()
		if !present {
			handled = true
			cancel()
		}
	})
	// Run calls back on this goroutine: handled needs no lock.
	if handled {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("request %s not handled yet (is a member of %s running?): %w", id, name, ctx.Err())
}
