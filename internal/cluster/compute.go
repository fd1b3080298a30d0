package cluster

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Observed is a member report and whether the leader counts it alive (it
// reported within membership.failure_threshold).
type Observed struct {
	Report protocol.ClusterMemberReport
	Alive  bool
	// Unseen is true for a member counted alive only because the leader
	// cannot trust its view of the reports yet (after a gap, see sight):
	// its report is stale or missing, and the previous state had it
	// taking part. It keeps its place; nothing is handed to it.
	Unseen bool
}

// Input is everything the leader decides the next state from.
type Input struct {
	Def protocol.ClusterDefinition
	// Prev is the last stored state (zero if none).
	Prev protocol.ClusterState
	// Members by presence key: every report still in the bucket.
	Members map[string]Observed
	// Leader is the lease holder computing this state, and LeaseEpoch the
	// revision of its lease.
	Leader     string
	LeaseEpoch uint64
	// Rebalance is true while a rebalance request is applied: exclusions
	// end and, when sharded, every healthy member owns shards again.
	Rebalance bool
	// Exclude lists members a manual failover takes out until the next
	// rebalance.
	Exclude []string
	// SyncDigest is the digest of the leader's current sync state.
	SyncDigest string
	// EpochFloor, when Prev is zero, is the highest epoch the leader has
	// seen: the state vanished (deleted by hand, a roll-up of the runtime
	// bucket), and the next one is above every epoch used before with
	// other owners, never back at the lease's revision.
	EpochFloor uint64
	Now        time.Time
}

// Compute returns the next state and the events that describe how it
// differs from the previous one. It is pure: same input, same output.
func Compute(in Input) (protocol.ClusterState, []protocol.Event) {
	def, prev := in.Def, in.Prev
	next := protocol.ClusterState{
		Cluster: def.Name, Mode: def.Mode, Leader: in.Leader, LeaseEpoch: in.LeaseEpoch,
		Minimum: def.Membership.Minimum, Desired: def.Membership.Desired, Maximum: def.Membership.Maximum,
		SyncDigest: in.SyncDigest, UpdatedAt: in.Now.UTC(),
	}
	reason := map[string]string{}
	healthy := func(k string) bool {
		o, ok := in.Members[k]
		switch {
		case !ok || !o.Alive:
			reason[k] = "not reporting"
		case o.Report.Draining:
			reason[k] = "draining"
		case o.Report.Health == "failed":
			reason[k] = "health failed"
		default:
			return true
		}
		return false
	}

	// Admission: the leader, then members admitted before, then the
	// earliest started, up to max_agents alive members.
	keys := make([]string, 0, len(in.Members))
	for k := range in.Members {
		keys = append(keys, k)
	}
	wasAdmitted := func(k string) bool {
		m, ok := prev.Member(k)
		return ok && m.Role != protocol.RoleRefused && m.Role != protocol.RoleOffline
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if (a == in.Leader) != (b == in.Leader) {
			return a == in.Leader
		}
		if wasAdmitted(a) != wasAdmitted(b) {
			return wasAdmitted(a)
		}
		sa, sb := in.Members[a].Report.StartedAt, in.Members[b].Report.StartedAt
		if !sa.Equal(sb) {
			return sa.Before(sb)
		}
		return a < b
	})
	refused := map[string]bool{}
	admitted := 0
	for _, k := range keys {
		if !in.Members[k].Alive {
			continue
		}
		if def.Membership.Maximum > 0 && admitted >= def.Membership.Maximum {
			refused[k] = true
			continue
		}
		admitted++
	}

	// Exclusions last until a rebalance, and only while the member exists.
	excluded := map[string]bool{}
	if !in.Rebalance {
		for _, k := range append(slices.Clone(prev.Excluded), in.Exclude...) {
			if _, ok := in.Members[k]; ok {
				excluded[k] = true
			}
		}
	}

	var eligible []string // healthy, admitted, not excluded
	for _, k := range keys {
		if !refused[k] && !excluded[k] && healthy(k) {
			eligible = append(eligible, k)
		}
	}
	sort.Strings(eligible)
	next.Healthy = len(eligible)

	var events []protocol.Event
	ev := func(kind protocol.EventKind, id, agent, why string, data map[string]string) {
		events = append(events, protocol.Event{Kind: kind, ID: eventID(def.Name, id), Agent: agent, Reason: why, Data: data})
	}

	// Healing: an under-replicated cluster takes back the members an
	// operator failed over.
	if next.Healthy < def.Membership.Minimum && len(excluded) > 0 {
		var back []string
		for k := range excluded {
			if !refused[k] && healthy(k) {
				back = append(back, k)
			}
		}
		sort.Strings(back)
		if len(back) > 0 {
			for _, k := range back {
				delete(excluded, k)
			}
			eligible = append(eligible, back...)
			sort.Strings(eligible)
			next.Healthy = len(eligible)
			ev(protocol.EventHealing, "heal-"+strconv.FormatUint(in.LeaseEpoch, 10)+"-"+strconv.Itoa(len(back)), "",
				"cluster "+def.Name+" under-replicated: readmitting members failed over by hand",
				map[string]string{"cluster": def.Name, "action": "readmit_excluded", "members": strings.Join(back, ",")})
		}
	}
	for k := range excluded {
		next.Excluded = append(next.Excluded, k)
	}
	sort.Strings(next.Excluded)

	// Who takes work.
	takers := eligible
	var assignment map[string]string
	switch def.Mode {
	case protocol.ModeSharded:
		isEligible := setOf(eligible)
		var owners []string
		for _, k := range prev.Owners {
			if isEligible[k] {
				owners = append(owners, k)
			}
		}
		if def.Sharding.Rebalance == protocol.RebalanceAuto || in.Rebalance || len(owners) == 0 || prev.Mode != def.Mode {
			owners = eligible
		}
		takers = slices.Clone(owners)
		sort.Strings(takers)
		next.Owners = takers
		assignment = Assign(def.TargetGroup.Targets, takers)
	case protocol.ModeActivePassive:
		takers = []string{in.Leader}
	}
	isTaker := setOf(takers)

	for _, k := range keys {
		o := in.Members[k]
		m := protocol.ClusterMember{Key: k, Load: load(o.Report), Digest: o.Report.Digest, StartedAt: o.Report.StartedAt}
		switch {
		case refused[k]:
			m.Role, m.Reason = protocol.RoleRefused, fmt.Sprintf("cluster already has max_agents=%d members", def.Membership.Maximum)
		case excluded[k]:
			m.Role, m.Reason = protocol.RoleExcluded, "failed over by an operator until the next rebalance"
		case !healthy(k):
			m.Role, m.Reason = protocol.RoleOffline, reason[k]
		case def.Mode == protocol.ModeActivePassive && k == in.Leader:
			m.Role, m.Healthy = protocol.RoleLeader, true
		case isTaker[k]:
			m.Role, m.Healthy = protocol.RoleMember, true
		default:
			m.Role, m.Healthy = protocol.RoleStandby, true
			if def.Mode == protocol.ModeSharded {
				m.Reason = "awaiting rebalance"
			}
		}
		switch {
		case assignment != nil && isTaker[k]:
			m.Targets = TargetsOf(assignment, k)
		case m.Role == protocol.RoleLeader:
			m.Targets = slices.Clone(def.TargetGroup.Targets)
		}
		next.Members = append(next.Members, m)
	}
	sort.Slice(next.Members, func(i, j int) bool { return next.Members[i].Key < next.Members[j].Key })

	// The epoch: the leader's lease term (active_passive), or a counter
	// that grows whenever the set of members taking work changes. It never
	// decreases: the counter can run past the lease's revision, so a term
	// that starts below the previous epoch (after a mode change) takes the
	// next one instead, and keeps it for the rest of the term.
	switch {
	case def.Mode == protocol.ModeActivePassive:
		next.Epoch = in.LeaseEpoch
		sameTerm := prev.Mode == def.Mode && prev.Leader == in.Leader && prev.LeaseEpoch == in.LeaseEpoch
		switch {
		case sameTerm:
			next.Epoch = max(next.Epoch, prev.Epoch)
		case prev.Epoch >= next.Epoch:
			next.Epoch = prev.Epoch + 1
		}
	case prev.Epoch == 0 || prev.Mode != def.Mode || !slices.Equal(prevTakers(prev), takers):
		next.Epoch = max(prev.Epoch+1, in.LeaseEpoch)
	default:
		next.Epoch = prev.Epoch
	}
	if prev.Epoch == 0 && next.Epoch <= in.EpochFloor {
		next.Epoch = in.EpochFloor + 1
	}

	switch {
	case next.Healthy < def.Membership.Minimum:
		next.Status = protocol.ClusterUnderReplicated
	case next.Healthy < def.Membership.Desired:
		next.Status = protocol.ClusterDegraded
	default:
		next.Status = protocol.ClusterHealthy
	}

	events = append(events, transitions(def, prev, next, in, reason)...)
	return next, events
}

// prevTakers is the set of members that took work in a state, sorted.
func prevTakers(s protocol.ClusterState) []string {
	if s.Mode == protocol.ModeSharded {
		return s.Owners
	}
	var out []string
	for _, m := range s.Members {
		if m.Role == protocol.RoleMember || m.Role == protocol.RoleLeader {
			out = append(out, m.Key)
		}
	}
	sort.Strings(out)
	return out
}

// transitions describes the change from prev to next as events. Event ids
// derive from the cluster, the epoch and the subject, so a state written
// twice raises each event once.
func transitions(def protocol.ClusterDefinition, prev, next protocol.ClusterState, in Input, reason map[string]string) []protocol.Event {
	var out []protocol.Event
	epoch := strconv.FormatUint(next.Epoch, 10)
	ev := func(kind protocol.EventKind, id, agent, why string, data map[string]string) {
		if data == nil {
			data = map[string]string{}
		}
		data["cluster"], data["epoch"] = def.Name, epoch
		out = append(out, protocol.Event{Kind: kind, ID: eventID(def.Name, id), Agent: agent, Reason: why, Data: data})
	}
	active := func(m protocol.ClusterMember) bool {
		return m.Role != protocol.RoleOffline && m.Role != protocol.RoleRefused
	}
	for _, m := range next.Members {
		p, known := prev.Member(m.Key)
		switch {
		case m.Role == protocol.RoleRefused && (!known || p.Role != protocol.RoleRefused):
			ev(protocol.EventClusterMemberRefused, epoch+"-"+m.Key, m.Key, m.Reason, nil)
		case active(m) && (!known || !active(p)):
			ev(protocol.EventClusterMemberJoined, epoch+"-"+m.Key, m.Key, "", map[string]string{"role": m.Role})
		case !active(m) && known && active(p):
			ev(protocol.EventClusterMemberLeft, epoch+"-"+m.Key, m.Key, m.Reason, nil)
		}
	}
	for _, p := range prev.Members {
		if _, ok := next.Member(p.Key); !ok && active(p) {
			ev(protocol.EventClusterMemberLeft, epoch+"-"+p.Key, p.Key, "no longer reporting", nil)
		}
	}

	if next.Leader != prev.Leader {
		ev(protocol.EventClusterLeader, epoch, next.Leader, "", map[string]string{"previous": prev.Leader, "lease_epoch": strconv.FormatUint(next.LeaseEpoch, 10)})
		if def.Mode == protocol.ModeActivePassive && prev.Leader != "" {
			why := reason[prev.Leader]
			switch {
			case prev.Handoff == next.Leader && prev.Handoff != "":
				why = "manual failover"
			case why == "" && in.Members[prev.Leader].Alive && !in.Members[prev.Leader].Unseen:
				why = "stepped down"
			case why == "":
				why = "lease lost"
			}
			ev(protocol.EventClusterFailover, epoch, prev.Leader, why, map[string]string{
				"from": prev.Leader, "to": next.Leader, "mode": def.Mode,
				"previous_epoch": strconv.FormatUint(prev.Epoch, 10),
			})
		}
	}
	if def.Mode == protocol.ModeSharded && prev.Mode == def.Mode && !slices.Equal(prev.Owners, next.Owners) {
		before := Assign(def.TargetGroup.Targets, prev.Owners)
		after := Assign(def.TargetGroup.Targets, next.Owners)
		moved := Moved(before, after)
		gone := without(prev.Owners, next.Owners)
		data := map[string]string{"mode": def.Mode, "owners": strings.Join(next.Owners, ","),
			"moved": strings.Join(moved, ","), "previous_epoch": strconv.FormatUint(prev.Epoch, 10)}
		if len(gone) > 0 {
			data["from"] = strings.Join(gone, ",")
			ev(protocol.EventClusterFailover, epoch, strings.Join(gone, ","), "shards moved to survivors", data)
		} else {
			ev(protocol.EventClusterRebalanced, epoch, "", "shards rebalanced", data)
		}
	} else if def.Mode == protocol.ModeActiveActive && prev.Mode == def.Mode {
		if gone := without(prevTakers(prev), prevTakers(next)); len(gone) > 0 {
			ev(protocol.EventClusterFailover, epoch, strings.Join(gone, ","), "member lost: its work goes to the others",
				map[string]string{"from": strings.Join(gone, ","), "mode": def.Mode, "members": strings.Join(prevTakers(next), ",")})
		}
	}
	if in.Rebalance && def.Mode != protocol.ModeSharded {
		ev(protocol.EventClusterRebalanced, epoch+"-r", "", "rebalance requested", nil)
	}

	if next.Status != prev.Status {
		switch {
		case next.Status == protocol.ClusterUnderReplicated:
			why := fmt.Sprintf("%d healthy members, minimum %d", next.Healthy, next.Minimum)
			ev(protocol.EventClusterUnderReplicated, epoch, "", why, map[string]string{"healthy": strconv.Itoa(next.Healthy)})
			ev(protocol.EventHealing, epoch+"-under", "", "cluster "+def.Name+" under-replicated: "+why, map[string]string{
				"action": "request_agents", "needed": strconv.Itoa(next.Minimum - next.Healthy)})
		case prev.Status == protocol.ClusterUnderReplicated:
			ev(protocol.EventClusterRecovered, epoch, "", fmt.Sprintf("%d healthy members", next.Healthy), map[string]string{"status": next.Status})
		}
	}
	return out
}

// without returns the keys of a that are not in b.
func without(a, b []string) []string {
	in := setOf(b)
	var out []string
	for _, k := range a {
		if !in[k] {
			out = append(out, k)
		}
	}
	return out
}

// eventID makes an event id a valid token: presence keys carry a dot.
func eventID(cluster, rest string) string {
	id := cluster + "-" + rest
	return strings.NewReplacer(".", "_", ",", "_").Replace(id)
}

// Same reports whether two states decide the same thing (ignoring when
// they were written), so the leader writes only real changes.
func Same(a, b protocol.ClusterState) bool {
	a.UpdatedAt, b.UpdatedAt = time.Time{}, time.Time{}
	// Reported loads change every heartbeat; they are shown, not decided
	// on, so a change in them alone is not worth a write. A changed digest
	// is (out-of-sync members must become visible).
	a.Members, b.Members = slices.Clone(a.Members), slices.Clone(b.Members)
	for i := range a.Members {
		a.Members[i].Load = 0
	}
	for i := range b.Members {
		b.Members[i].Load = 0
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
