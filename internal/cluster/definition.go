package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Defaults of a definition.
const (
	DefaultMinimum             = 1
	DefaultFailureThreshold    = 3 * time.Second
	DefaultStrategy            = protocol.StrategyStandby
	DefaultTaskTransferTimeout = 5 * time.Minute
	DefaultMaxTransferRetries  = 3
	DefaultLeaseDuration       = 3 * time.Second
	DefaultSyncInterval        = 2 * time.Second
	DefaultRebalance           = protocol.RebalanceAuto

	// minLease is the smallest per-key TTL the server accepts; it counts
	// a key's TTL in whole seconds (a lease_duration must be whole
	// seconds).
	minLease = time.Second
)

// Parse reads a definition from YAML or JSON, either bare or under an
// agent_cluster: key (seed 000's shape). Unknown fields are errors. The
// result has its defaults filled and is validated.
func Parse(b []byte) (protocol.ClusterDefinition, error) {
	var d protocol.ClusterDefinition
	var wrapped struct {
		AgentCluster *protocol.ClusterDefinition `yaml:"agent_cluster"`
	}
	// YAML is a superset of JSON: one decoder reads both.
	if err := strictYAML(b, &wrapped); err == nil && wrapped.AgentCluster != nil {
		d = *wrapped.AgentCluster
	} else if err := strictYAML(b, &d); err != nil {
		return d, fmt.Errorf("cluster definition: %w", err)
	}
	d = WithDefaults(d)
	return d, Validate(d)
}

func strictYAML(b []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// Decode reads a definition as stored in the bucket (JSON).
func Decode(b []byte) (protocol.ClusterDefinition, error) {
	var d protocol.ClusterDefinition
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("decode cluster definition: %w", err)
	}
	return WithDefaults(d), nil
}

// WithDefaults fills every zero field with its default.
func WithDefaults(d protocol.ClusterDefinition) protocol.ClusterDefinition {
	d.Mode = strings.ToLower(strings.TrimSpace(d.Mode))
	m := &d.Membership
	if m.Minimum == 0 {
		m.Minimum = DefaultMinimum
	}
	if m.Desired == 0 {
		m.Desired = m.Minimum
	}
	if m.FailureThreshold == 0 {
		m.FailureThreshold = protocol.Duration(DefaultFailureThreshold)
	}
	f := &d.Failover
	if f.SelectionStrategy == "" {
		f.SelectionStrategy = DefaultStrategy
	}
	if f.TaskTransferTimeout == 0 {
		f.TaskTransferTimeout = protocol.Duration(DefaultTaskTransferTimeout)
	}
	if f.MaxTransferRetries == 0 {
		f.MaxTransferRetries = DefaultMaxTransferRetries
	}
	if d.Election.LeaseDuration == 0 {
		d.Election.LeaseDuration = protocol.Duration(DefaultLeaseDuration)
	}
	if d.StateSync.Interval == 0 {
		d.StateSync.Interval = protocol.Duration(DefaultSyncInterval)
	}
	if d.Sharding.Rebalance == "" {
		d.Sharding.Rebalance = DefaultRebalance
	}
	return d
}

// Validate reports every invalid field, naming the field and the rule.
func Validate(d protocol.ClusterDefinition) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !protocol.ValidToken(d.Name) {
		bad("name %q must be 1-128 characters of letters, digits, '-' or '_'", d.Name)
	}
	switch d.Mode {
	case protocol.ModeActivePassive, protocol.ModeActiveActive, protocol.ModeSharded:
	default:
		bad("replication_mode must be %s, %s or %s, got %q",
			protocol.ModeActivePassive, protocol.ModeActiveActive, protocol.ModeSharded, d.Mode)
	}
	seen := map[string]bool{}
	for i, t := range d.TargetGroup.Targets {
		switch {
		case t == "" || strings.ContainsAny(t, " \t\r\n"):
			bad("target_group.targets[%d] %q must be non-empty without white space", i, t)
		case seen[t]:
			bad("target_group.targets[%d] %q is listed twice", i, t)
		}
		seen[t] = true
	}
	m := d.Membership
	if m.Minimum < 1 {
		bad("membership.minimum_agents must be at least 1, got %d", m.Minimum)
	}
	if m.Desired < m.Minimum {
		bad("membership.desired_agents (%d) must be at least minimum_agents (%d)", m.Desired, m.Minimum)
	}
	if m.Maximum != 0 && m.Maximum < m.Desired {
		bad("membership.max_agents (%d) must be 0 (no limit) or at least desired_agents (%d)", m.Maximum, m.Desired)
	}
	if m.FailureThreshold.Std() < time.Second {
		bad("membership.failure_threshold must be at least 1s, got %s", m.FailureThreshold)
	}
	switch d.Failover.SelectionStrategy {
	case protocol.StrategyStandby, protocol.StrategyLeastLoaded, protocol.StrategyRoundRobin:
	default:
		bad("failover.selection_strategy must be %s, %s or %s, got %q",
			protocol.StrategyStandby, protocol.StrategyLeastLoaded, protocol.StrategyRoundRobin, d.Failover.SelectionStrategy)
	}
	if d.Failover.TaskTransferTimeout < 0 {
		bad("failover.task_transfer_timeout must not be negative")
	}
	if d.Failover.MaxTransferRetries < 0 {
		bad("failover.max_transfer_retries must not be negative, got %d", d.Failover.MaxTransferRetries)
	}
	switch ld := d.Election.LeaseDuration.Std(); {
	case ld < minLease:
		bad("leader_election.lease_duration must be at least %s, got %s", minLease, d.Election.LeaseDuration)
	case ld%time.Second != 0:
		bad("leader_election.lease_duration must be a whole number of seconds (the server keeps a key's TTL in whole seconds: %s would last %s), got %s",
			ld, ld.Truncate(time.Second), d.Election.LeaseDuration)
	}
	if d.StateSync.Interval.Std() < 100*time.Millisecond {
		bad("state_sync.interval must be at least 100ms, got %s", d.StateSync.Interval)
	}
	switch d.Sharding.Rebalance {
	case protocol.RebalanceAuto, protocol.RebalanceManual:
	default:
		bad("sharding.rebalance must be %s or %s, got %q", protocol.RebalanceAuto, protocol.RebalanceManual, d.Sharding.Rebalance)
	}
	return errors.Join(errs...)
}
