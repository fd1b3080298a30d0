package streams

import (
	"errors"
	"fmt"
)

// Bounds of the deployment settings (Options.Validate).
const (
	// MaxReplicas is the most replicas a stream may have (JetStream's own
	// limit).
	MaxReplicas = 5
	// MaxTaskShards is the most task streams: about 6,400 agents at one
	// shard per 50. Every role credential lists each shard's subjects, and
	// at this count the largest (the supervisor's) is just within the
	// generated server.conf's max_control_line (internal/creds tests it).
	MaxTaskShards = 128
	// MaxPartitions is the most scheduler partitions.
	MaxPartitions = 1024
)

// ErrInvalidOptions is wrapped by every error Options.Validate returns.
var ErrInvalidOptions = errors.New("invalid deployment settings")

// Validate reports the first setting out of its bounds, named as in the
// YAML files and flags: replicas 1..MaxReplicas, task_shards
// 1..MaxTaskShards, partitions 1..MaxPartitions, and TTLs that are not
// negative. A zero setting is the default, and so valid. Every process
// that applies the streams checks the same bounds (Ensure calls it), so a
// setting no scheduler could run with never reaches the deployment record.
func (o Options) Validate() error {
	switch {
	case o.Replicas < 0 || o.Replicas > MaxReplicas:
		return fmt.Errorf("%w: replicas must be between 1 and %d, got %d", ErrInvalidOptions, MaxReplicas, o.Replicas)
	case o.TaskShards < 0 || o.TaskShards > MaxTaskShards:
		return fmt.Errorf("%w: task_shards must be between 1 and %d, got %d", ErrInvalidOptions, MaxTaskShards, o.TaskShards)
	case o.Partitions < 0 || o.Partitions > MaxPartitions:
		return fmt.Errorf("%w: partitions must be between 1 and %d, got %d", ErrInvalidOptions, MaxPartitions, o.Partitions)
	case o.PresenceTTL < 0:
		return fmt.Errorf("%w: presence_ttl must not be negative, got %s", ErrInvalidOptions, o.PresenceTTL)
	case o.LeaseTTL < 0:
		return fmt.Errorf("%w: lease_ttl must not be negative, got %s", ErrInvalidOptions, o.LeaseTTL)
	}
	return nil
}
