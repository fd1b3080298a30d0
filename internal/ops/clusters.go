package ops

import (
	"context"
	"errors"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Cluster is a cluster's definition with its leader's last state (members,
// roles, health); State is nil until a leader wrote one.
type Cluster struct {
	Definition protocol.ClusterDefinition `json:"definition"`
	State      *protocol.ClusterState     `json:"state,omitempty"`
}

func (o *Ops) clusters(ctx context.Context) (*cluster.Store, error) {
	cs, err := cluster.Open(ctx, o.js)
	if err != nil {
		return nil, &Error{Code: CodeUnavailable, Err: err}
	}
	return cs, nil
}

// Clusters lists every cluster with its state.
func (o *Ops) Clusters(ctx context.Context) ([]Cluster, error) {
	cs, err := o.clusters(ctx)
	if err != nil {
		return nil, err
	}
	defs, err := cs.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Cluster, 0, len(defs))
	for _, d := range defs {
		c := Cluster{Definition: d}
		if st, _, err := cs.State(ctx, d.Name); err == nil {
			c.State = &st
		}
		out = append(out, c)
	}
	return out, nil
}

// Cluster returns one cluster with its state.
func (o *Ops) Cluster(ctx context.Context, name string) (Cluster, error) {
	if !protocol.ValidToken(name) {
		return Cluster{}, Errorf(CodeNotFound, "cluster %q: not found", name)
	}
	cs, err := o.clusters(ctx)
	if err != nil {
		return Cluster{}, err
	}
	d, _, err := cs.Get(ctx, name)
	if err != nil {
		return Cluster{}, err
	}
	c := Cluster{Definition: d}
	if st, _, err := cs.State(ctx, name); err == nil {
		c.State = &st
	}
	return c, nil
}

// PutCluster creates (create true) or replaces a cluster definition.
func (o *Ops) PutCluster(ctx context.Context, d protocol.ClusterDefinition, create bool) (protocol.ClusterDefinition, error) {
	if err := cluster.Validate(cluster.WithDefaults(d)); err != nil {
		return d, &Error{Code: CodeInvalid, Err: err}
	}
	cs, err := o.clusters(ctx)
	if err != nil {
		return d, err
	}
	if create {
		d, err = cs.Create(ctx, d)
	} else {
		d, err = cs.Update(ctx, d)
	}
	if errors.Is(err, cluster.ErrExists) {
		return d, &Error{Code: CodeConflict, Err: err}
	}
	return d, err
}

// DeleteCluster removes a cluster definition.
func (o *Ops) DeleteCluster(ctx context.Context, name string) error {
	if _, err := o.Cluster(ctx, name); err != nil {
		return err
	}
	cs, err := o.clusters(ctx)
	if err != nil {
		return err
	}
	return cs.Delete(ctx, name)
}

// ClusterRequest asks a cluster's leader to rebalance or fail over and
// returns the request's id; the leader handles it on its next round.
func (o *Ops) ClusterRequest(ctx context.Context, name string, r protocol.ClusterRequest) (string, error) {
	if _, err := o.Cluster(ctx, name); err != nil {
		return "", err
	}
	cs, err := o.clusters(ctx)
	if err != nil {
		return "", err
	}
	return cs.Request(ctx, name, r)
}
