package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

func (a *app) clusterCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Define, inspect and operate agent clusters (docs/clusters.md)"}
	var file string
	create := &cobra.Command{
		Use: "create -f FILE", Short: "Define a cluster from YAML or JSON (an agent_cluster: block or the bare fields; - reads stdin)",
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.putCluster(cmd.Context(), file, true) },
	}
	create.Flags().StringVarP(&file, "file", "f", "", "definition file (- for stdin)")
	update := &cobra.Command{
		Use: "update -f FILE", Short: "Replace a cluster's definition (members follow within a heartbeat)",
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.putCluster(cmd.Context(), file, false) },
	}
	update.Flags().StringVarP(&file, "file", "f", "", "definition file (- for stdin)")
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List clusters: mode, status, healthy/desired members, leader, epoch",
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.withCluster(cmd.Context(), a.listClusters) },
	}
	show := &cobra.Command{
		Use: "show NAME", Short: "Show a cluster: definition, state, members (out-of-sync members marked)",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCluster(cmd.Context(), func(ctx context.Context, st *cluster.Store) error { return a.showCluster(ctx, st, args[0]) })
		},
	}
	del := &cobra.Command{
		Use: "delete NAME", Short: "Delete a cluster's definition and state (its agents keep running, in no cluster)",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCluster(cmd.Context(), func(ctx context.Context, st *cluster.Store) error {
				if err := st.Delete(ctx, args[0]); err != nil {
					return clusterErr(err)
				}
				if a.json {
					return writeJSON(a.stdout, map[string]string{"deleted": args[0]})
				}
				fmt.Fprintf(a.stdout, "cluster %s deleted\n", args[0])
				return nil
			})
		},
	}
	members := &cobra.Command{
		Use: "members NAME", Short: "List the agents that report as members: role, epoch, load, health, digest",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCluster(cmd.Context(), func(ctx context.Context, st *cluster.Store) error { return a.clusterMembers(ctx, st, args[0]) })
		},
	}
	var reason string
	rebalance := &cobra.Command{
		Use: "rebalance NAME", Short: "Readmit failed-over members and spread shards over every healthy member",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.clusterRequest(cmd.Context(), args[0], protocol.ClusterRequest{Op: protocol.RequestRebalance, Reason: reason})
		},
	}
	rebalance.Flags().StringVar(&reason, "reason", "", "why (recorded in the event)")
	var from, to string
	failover := &cobra.Command{
		Use:   "failover NAME",
		Short: "Fail over by hand: active_passive hands leadership to --to (default: the best standby); other modes take --from's work away until the next rebalance",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.clusterRequest(cmd.Context(), args[0], protocol.ClusterRequest{Op: protocol.RequestFailover, From: from, To: to, Reason: reason})
		},
	}
	failover.Flags().StringVar(&from, "from", "", "member (<pool>.<agent>) to fail over from (default: the leader)")
	failover.Flags().StringVar(&to, "to", "", "active_passive: member (<pool>.<agent>) to hand leadership to")
	failover.Flags().StringVar(&reason, "reason", "", "why (recorded in the event)")
	cmd.AddCommand(create, ls, show, update, del, members, rebalance, failover)
	return cmd
}

// withCluster opens the cluster store and runs f within --timeout.
func (a *app) withCluster(ctx context.Context, f func(context.Context, *cluster.Store) error) error {
	return a.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		st, err := openCluster(ctx, c.JetStream())
		if err != nil {
			return err
		}
		return f(ctx, st)
	})
}

// openCluster opens the cluster store; a failure is exit 4.
func openCluster(ctx context.Context, js jetstream.JetStream) (*cluster.Store, error) {
	st, err := cluster.Open(ctx, js)
	if err != nil {
		return nil, &exitError{code: exitUnavailable, err: err}
	}
	return st, nil
}

func clusterErr(err error) error {
	switch {
	case errors.Is(err, cluster.ErrNotFound):
		return &exitError{code: exitNotFound, err: err}
	case errors.Is(err, cluster.ErrExists), errors.Is(err, cluster.ErrChanged):
		return &exitError{code: exitUsage, err: err}
	}
	return err
}

func (a *app) readDefinition(file string) (protocol.ClusterDefinition, error) {
	if file == "" {
		return protocol.ClusterDefinition{}, usageError("-f FILE is required")
	}
	var b []byte
	var err error
	if file == "-" {
		b, err = io.ReadAll(a.stdin)
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return protocol.ClusterDefinition{}, usageError("%v", err)
	}
	d, err := cluster.Parse(b)
	if err != nil {
		return d, usageError("%v", err)
	}
	return d, nil
}

func (a *app) putCluster(ctx context.Context, file string, create bool) error {
	d, err := a.readDefinition(file)
	if err != nil {
		return err
	}
	return a.withCluster(ctx, func(ctx context.Context, st *cluster.Store) error {
		verb := "created"
		if create {
			d, err = st.Create(ctx, d)
		} else {
			d, err = st.Update(ctx, d)
			verb = "updated"
		}
		if err != nil {
			return clusterErr(err)
		}
		if a.json {
			return writeJSON(a.stdout, d)
		}
		fmt.Fprintf(a.stdout, "cluster %s %s (%s, %d targets, members min %d desired %d max %s)\n", d.Name, verb, d.Mode,
			len(d.TargetGroup.Targets), d.Membership.Minimum, d.Membership.Desired, maxText(d.Membership.Maximum))
		return nil
	})
}

func maxText(n int) string {
	if n == 0 {
		return "unlimited"
	}
	return strconv.Itoa(n)
}

func (a *app) listClusters(ctx context.Context, st *cluster.Store) error {
	defs, err := st.List(ctx)
	if err != nil {
		return err
	}
	type row struct {
		protocol.ClusterDefinition
		State *protocol.ClusterState `json:"state,omitempty"`
	}
	rows := []row{}
	for _, d := range defs {
		r := row{ClusterDefinition: d}
		if s, _, err := st.State(ctx, d.Name); err == nil {
			r.State = &s
		}
		rows = append(rows, r)
	}
	if a.json {
		return writeJSON(a.stdout, rows)
	}
	t := newTable(a.stdout, "NAME", "MODE", "STATUS", "HEALTHY", "LEADER", "EPOCH", "TARGETS")
	for _, r := range rows {
		status, healthy, leader, epoch := "no state yet", fmt.Sprintf("-/%d", r.Membership.Desired), "-", "-"
		if s := r.State; s != nil {
			status, healthy, leader, epoch = s.Status, fmt.Sprintf("%d/%d (min %d)", s.Healthy, s.Desired, s.Minimum), s.Leader, strconv.FormatUint(s.Epoch, 10)
		}
		t.row(r.Name, r.Mode, status, healthy, leader, epoch, strconv.Itoa(len(r.TargetGroup.Targets)))
	}
	return t.flush()
}

// clusterView is what show prints: the definition, the leader's state and
// the members' live reports.
type clusterView struct {
	Definition protocol.ClusterDefinition     `json:"definition"`
	State      *protocol.ClusterState         `json:"state,omitempty"`
	Reports    []protocol.ClusterMemberReport `json:"reports"`
	OutOfSync  []string                       `json:"out_of_sync"`
}

func (a *app) loadClusterView(ctx context.Context, st *cluster.Store, name string) (clusterView, error) {
	d, _, err := st.Get(ctx, name)
	if err != nil {
		return clusterView{}, clusterErr(err)
	}
	v := clusterView{Definition: d, OutOfSync: []string{}}
	if s, _, err := st.State(ctx, name); err == nil {
		v.State = &s
	}
	v.Reports, err = st.Reports(ctx, name)
	if err != nil {
		return v, err
	}
	if v.Reports == nil {
		v.Reports = []protocol.ClusterMemberReport{} // [] in --json, as every other list
	}
	if v.State != nil {
		for _, r := range v.Reports {
			if r.Digest != v.State.SyncDigest {
				v.OutOfSync = append(v.OutOfSync, r.Key())
			}
		}
	}
	return v, nil
}

func (a *app) showCluster(ctx context.Context, st *cluster.Store, name string) error {
	v, err := a.loadClusterView(ctx, st, name)
	if err != nil {
		return err
	}
	if a.json {
		return writeJSON(a.stdout, v)
	}
	d := v.Definition
	w := a.stdout
	fmt.Fprintf(w, "Cluster:      %s\n", d.Name)
	if d.Description != "" {
		fmt.Fprintf(w, "Description:  %s\n", d.Description)
	}
	fmt.Fprintf(w, "Mode:         %s\n", d.Mode)
	fmt.Fprintf(w, "Target group: %s (%d targets)\n", d.TargetGroup.Name, len(d.TargetGroup.Targets))
	fmt.Fprintf(w, "Membership:   min %d, desired %d, max %s; failure threshold %s\n", d.Membership.Minimum, d.Membership.Desired,
		maxText(d.Membership.Maximum), d.Membership.FailureThreshold)
	fmt.Fprintf(w, "Failover:     %s; task transfer timeout %s; max transfer retries %d\n", d.Failover.SelectionStrategy,
		d.Failover.TaskTransferTimeout, d.Failover.MaxTransferRetries)
	fmt.Fprintf(w, "Election:     lease %s; state sync every %s", d.Election.LeaseDuration, d.StateSync.Interval)
	if d.Mode == protocol.ModeSharded {
		fmt.Fprintf(w, "; rebalance %s", d.Sharding.Rebalance)
	}
	fmt.Fprintln(w)
	s := v.State
	if s == nil {
		fmt.Fprintln(w, "State:        none yet (no member has led this cluster)")
	} else {
		fmt.Fprintf(w, "Status:       %s, %d/%d healthy (min %d)\n", s.Status, s.Healthy, s.Desired, s.Minimum)
		fmt.Fprintf(w, "Leader:       %s (epoch %d, lease epoch %d, updated %s)\n", s.Leader, s.Epoch, s.LeaseEpoch, timestamp(s.UpdatedAt))
		fmt.Fprintf(w, "Sync digest:  %s\n", s.SyncDigest)
		if len(s.Excluded) > 0 {
			fmt.Fprintf(w, "Excluded:     %s (until rebalance)\n", strings.Join(s.Excluded, ", "))
		}
	}
	fmt.Fprintln(w)
	return a.printMembers(v)
}

func (a *app) printMembers(v clusterView) error {
	now := time.Now()
	reports := map[string]protocol.ClusterMemberReport{}
	for _, r := range v.Reports {
		reports[r.Key()] = r
	}
	outOfSync := map[string]bool{}
	for _, k := range v.OutOfSync {
		outOfSync[k] = true
	}
	t := newTable(a.stdout, "MEMBER", "ROLE", "HEALTHY", "TARGETS", "LOAD", "HEARTBEAT", "DIGEST", "SYNC", "NOTE")
	seen := map[string]bool{}
	if v.State != nil {
		for _, m := range v.State.Members {
			seen[m.Key] = true
			r, ok := reports[m.Key]
			hb, digest, load := "gone", m.Digest, fmt.Sprintf("%.2f", m.Load)
			if ok {
				hb, digest = until(r.HeartbeatAt, now), r.Digest
				load = fmt.Sprintf("%d/%d", r.InFlight, r.MaxConcurrent)
			}
			t.row(m.Key, m.Role, yesNo(m.Healthy), targetsText(m.Targets), load, hb, short(digest), syncText(ok && m.Role != protocol.RoleOffline, outOfSync[m.Key]), m.Reason)
		}
	}
	for _, r := range v.Reports {
		if !seen[r.Key()] {
			t.row(r.Key(), "(not in state yet)", "-", "-", fmt.Sprintf("%d/%d", r.InFlight, r.MaxConcurrent), until(r.HeartbeatAt, now),
				short(r.Digest), syncText(true, outOfSync[r.Key()]), "")
		}
	}
	return t.flush()
}

func (a *app) clusterMembers(ctx context.Context, st *cluster.Store, name string) error {
	v, err := a.loadClusterView(ctx, st, name)
	if err != nil {
		return err
	}
	if a.json {
		return writeJSON(a.stdout, v.Reports)
	}
	return a.printMembers(v)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func syncText(reporting, outOfSync bool) string {
	switch {
	case !reporting:
		return "-"
	case outOfSync:
		return "OUT OF SYNC"
	}
	return "in sync"
}

func short(d string) string {
	if len(d) > 12 {
		return d[:12]
	}
	if d == "" {
		return "-"
	}
	return d
}

func targetsText(ts []string) string {
	switch {
	case len(ts) == 0:
		return "-"
	case len(ts) <= 4:
		return strings.Join(ts, ",")
	}
	return fmt.Sprintf("%s,... (%d)", strings.Join(ts[:3], ","), len(ts))
}

// clusterRequest asks the cluster's leader for an operation, waits until
// it is handled and reports what the leader did: a request it refused (a
// failover to a member that cannot take over) is an error, exit 2.
func (a *app) clusterRequest(ctx context.Context, name string, r protocol.ClusterRequest) error {
	return a.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		st, err := openCluster(ctx, c.JetStream())
		if err != nil {
			return err
		}
		id, err := st.Request(ctx, name, r)
		if err != nil {
			return clusterErr(err)
		}
		// Waited on for less than the request lives: a request that lapsed
		// (RequestTTL) is gone as a handled one is, without being handled.
		hctx, hcancel := context.WithTimeout(ctx, cluster.RequestTTL-time.Minute)
		err = st.WaitHandled(hctx, name, id)
		hcancel()
		if err != nil {
			// Withdrawn: left in place, the leader elected later would
			// carry out what this command reported as not done. The
			// withdrawal and the leader's claim are compare-and-sets on
			// the request: one of them wins.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			switch werr := st.WithdrawRequest(wctx, name, id); {
			case werr == nil:
				return &exitError{code: exitUnavailable, err: fmt.Errorf("%w; the request is withdrawn: no leader will carry it out", err)}
			case errors.Is(werr, cluster.ErrClaimed):
				return &exitError{code: exitUnavailable, err: fmt.Errorf("%w; %v and carries it out: see `warden failovers ls --cluster %s`", err, werr, name)}
			case errors.Is(werr, cluster.ErrNotFound):
				// Handled just now: its outcome is read below.
			default:
				return &exitError{code: exitUnavailable, err: fmt.Errorf("%w; the request could not be withdrawn (%v): it lapses within %s unless a leader takes it", err, werr, cluster.RequestTTL)}
			}
		}
		ev, recorded, err := requestOutcome(ctx, c.JetStream(), id)
		if err != nil {
			return &exitError{code: exitUnavailable, err: fmt.Errorf("%s of cluster %s handled by its leader (request %s), but its outcome could not be read: %w", r.Op, name, id, err)}
		}
		by := ev.Data["handled_by"]
		if why := ev.Data["refused"]; why != "" {
			return ops.Errorf(ops.CodeRejected, "%s of cluster %s refused by its leader %s: %s (request %s)", r.Op, name, by, why, id)
		}
		if a.json {
			out := map[string]string{"request": id, "op": r.Op, "cluster": name, "status": "handled"}
			if by != "" {
				out["handled_by"] = by
			}
			return writeJSON(a.stdout, out)
		}
		by = strings.TrimSpace("its leader " + by)
		fmt.Fprintf(a.stdout, "%s of cluster %s handled by %s (request %s); see `warden failovers ls --cluster %s` and `warden cluster show %s`\n",
			r.Op, name, by, id, name, name)
		if !recorded {
			fmt.Fprintf(a.stderr, "warning: the leader recorded no %s event for request %s: check `warden cluster show %s`\n",
				protocol.EventClusterRequest, id, name)
		}
		return nil
	})
}

// requestOutcome reads the event the leader publishes about a request it
// handled, before it deletes the request (internal/cluster, Member.step):
// Data["refused"] says why it did not carry it out. recorded is false when
// there is none (the leader's publish failed).
func requestOutcome(ctx context.Context, js jetstream.JetStream, id string) (ev protocol.Event, recorded bool, err error) {
	s, err := js.Stream(ctx, protocol.StreamEvents)
	if err != nil {
		return ev, false, err
	}
	m, err := s.GetLastMsgForSubject(ctx, protocol.EventSubject(protocol.EventClusterRequest, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ev, false, nil
	}
	if err != nil {
		return ev, false, err
	}
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		return ev, false, fmt.Errorf("decode %s event: %w", protocol.EventClusterRequest, err)
	}
	return ev, true, nil
}
