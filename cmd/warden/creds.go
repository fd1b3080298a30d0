package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/streams"
)

func (a *app) credsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "creds",
		Short: "Create and rotate NATS identities: operator, accounts, one credential per role and per agent",
		Long: `warden creds makes the NATS operator/JWT configuration of a production
deployment (docs/security.md): an operator, the WARDEN account, the system
account, one credential per role (setup, scheduler, supervisor, publisher,
readonly, admin, api) and one per agent, each allowed only what its process
uses, plus server/server.conf and server/auth.conf for nats-server.
Keys stay in <dir>/keys: never mount that directory anywhere.`,
	}
	var dir string
	cmd.PersistentFlags().StringVar(&dir, "dir", ".warden/secrets", "the credentials directory")

	var c creds.Config
	var agents, routes, hosts string
	initCmd := &cobra.Command{
		Use: "init", Short: "Create (or complete) the directory: keys, server config, role and agent credentials", Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.Dir = dir
			c.Agents, c.Routes, c.Hosts = splitList(agents), splitList(routes), splitList(hosts)
			// Run again (to add an agent, to change the sync interval), the
			// directory keeps the TLS and routes it was made with unless
			// the flags say otherwise: server.conf is rewritten from them,
			// and a forgotten --tls turned TLS off.
			if m, err := creds.LoadManifest(dir); err == nil {
				if !cmd.Flags().Changed("tls") {
					c.TLS = m.TLS
				}
				if !cmd.Flags().Changed("routes") {
					c.Routes = m.Routes
				}
			}
			m, err := creds.Generate(c)
			if err != nil {
				return credsError(err)
			}
			if a.json {
				return writeJSON(a.stdout, credsInitResult{Dir: dir, Operator: m.Operator, Account: m.Account, TaskShards: m.TaskShards,
					TLS: m.TLS, Users: m.Users, ServerConfig: creds.ServerConfPath(dir), Reissued: nonNil(m.Reissued)})
			}
			fmt.Fprintf(a.stdout, "operator %s, account %s (task_shards %d, tls %v)\n", m.Operator, m.Account, m.TaskShards, m.TLS)
			for _, id := range m.Identities() {
				fmt.Fprintf(a.stdout, "  %-32s %s\n", id, m.Users[id])
			}
			fmt.Fprintf(a.stdout, "server config: %s\n", creds.ServerConfPath(dir))
			for _, id := range m.Reissued {
				fmt.Fprintf(a.stderr, "reissued %s: its key was revoked, so it has a new one; give its holder the new credential\n", id)
			}
			return nil
		},
	}
	f := initCmd.Flags()
	f.IntVar(&c.TaskShards, "task-shards", streams.DefaultTaskShards, "the deployment's task_shards, about one per 50 agents (agents' credentials name their shard)")
	f.StringVar(&agents, "agents", "", "comma-separated <pool>.<id>[@<cluster>] agents to mint credentials for")
	f.StringVar(&routes, "routes", "", "comma-separated route hosts of a cluster (nats-1:6222,...); not given: the directory's")
	f.BoolVar(&c.TLS, "tls", false, "TLS for clients and routes: make a CA and a server certificate; not given: the directory's")
	f.StringVar(&hosts, "hosts", "", "names in the server certificate (default localhost, 127.0.0.1 and the route hosts)")
	f.StringVar(&c.ServerDir, "server-dir", "", "where server/ is mounted when nats-server runs (default <dir>/server)")
	f.StringVar(&c.StoreDir, "store-dir", "/data", "nats-server's JetStream directory")
	f.StringVar(&c.Listen, "listen", "0.0.0.0:4222", "nats-server's client address")
	f.StringVar(&c.SyncInterval, "sync-interval", "", "how often nats-server flushes JetStream writes to disk: always (every write; "+
		"a power loss then loses nothing acknowledged), a duration, or default (2m); empty keeps the directory's setting")

	var pool, id, cluster string
	var rotate bool
	agentCmd := &cobra.Command{
		Use: "agent", Short: "Mint one agent's credential (only its own tasks, presence, results and inbox)", Args: exactArgs(0),
		RunE: func(*cobra.Command, []string) error {
			name := id
			if cluster != "" {
				name += "@" + cluster
			}
			path, err := creds.MintAgent(dir, pool, name, rotate)
			if err != nil {
				return credsError(err)
			}
			res := credsResult{Identity: creds.AgentIdentity(pool, id), Cluster: cluster, Path: path}
			if rotate {
				res.Revoked, res.Note = true, noteReload
			}
			return a.printCreds(res)
		},
	}
	agentCmd.Flags().StringVar(&pool, "pool", "default", "the agent's pool")
	agentCmd.Flags().StringVar(&id, "id", "", "the agent's id")
	agentCmd.Flags().BoolVar(&rotate, "rotate", false, "replace an existing credential and revoke the old one")
	agentCmd.Flags().StringVar(&cluster, "cluster", "", "the agent's cluster (docs/clusters.md): it may then lead that cluster")

	rotateCmd := &cobra.Command{
		Use: "rotate ROLE", Short: "Replace a role's credential and revoke the old one", Args: exactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			path, err := creds.Rotate(dir, args[0])
			if err != nil {
				return credsError(err)
			}
			return a.printCreds(credsResult{Identity: args[0], Path: path, Revoked: true,
				Note: "the old credential is revoked in server/auth.conf: reload the servers, then restart the processes using it"})
		},
	}
	revokeCmd := &cobra.Command{
		Use: "revoke IDENTITY", Short: "Revoke an identity's credential (e.g. agent.<pool>.<id>)", Args: exactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := creds.Revoke(dir, args[0]); err != nil {
				return credsError(err)
			}
			return a.printCreds(credsResult{Identity: args[0], Revoked: true, Note: "revoked in server/auth.conf: reload the servers (nats-server --signal reload)"})
		},
	}
	var shards int
	rolesCmd := &cobra.Command{
		Use: "roles", Short: "Print every role's permissions (what docs/security.md documents)", Args: exactArgs(0),
		RunE: func(*cobra.Command, []string) error {
			roles := creds.DocRoles(shards)
			if a.json {
				return writeJSON(a.stdout, roles)
			}
			_, err := a.stdout.Write([]byte(creds.Markdown(roles)))
			return err
		},
	}
	rolesCmd.Flags().IntVar(&shards, "task-shards", streams.DefaultTaskShards, "task shards")
	cmd.AddCommand(initCmd, agentCmd, rotateCmd, revokeCmd, rolesCmd)
	return cmd
}

func (a *app) setupCommand() *cobra.Command {
	var o streams.Options
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Create or update every stream and bucket (run with the setup credential before the other processes)",
		Long: `warden setup applies streams/*.json to the deployment. In production only
the setup identity may create, change or delete streams: run this first
(docker-compose runs it as the "setup" service). Schedulers and supervisors
check at start that the streams exist and match, and change nothing when
they do.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Refused before anything is written: a setting out of
			// bounds in the deployment record stops every scheduler.
			if err := o.Validate(); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			c, err := a.connect()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), max(a.timeout, 30*time.Second))
			defer cancel()
			since := time.Now()
			if err := streams.Ensure(ctx, c.JetStream(), o); err != nil {
				return natsconn.Explain(c.JetStream().Conn(), since, err)
			}
			if err := streams.EnsureWorkflow(ctx, c.JetStream(), o); err != nil {
				return natsconn.Explain(c.JetStream().Conn(), since, err)
			}
			if a.json {
				return writeJSON(a.stdout, setupResult{Status: "up_to_date", Replicas: o.Replicas, TaskShards: o.TaskShards, Partitions: o.Partitions})
			}
			fmt.Fprintln(a.stdout, "streams and buckets are up to date")
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Replicas, "replicas", 1, "replicas of every stream and bucket (1..5)")
	f.IntVar(&o.TaskShards, "task-shards", streams.DefaultTaskShards, "task streams (about one per 50 agents; 1..128)")
	f.IntVar(&o.Partitions, "partitions", streams.DefaultPartitions, "scheduler partitions (1..1024)")
	f.DurationVar(&o.PresenceTTL, "presence-ttl", 0, "presence bucket TTL (default streams/kv_presence.json)")
	f.DurationVar(&o.LeaseTTL, "lease-ttl", 0, "leases bucket TTL (default streams/kv_leases.json)")
	return cmd
}

// noteReload is what to do after a credential was revoked.
const noteReload = "the old credential is revoked in server/auth.conf: reload the servers (nats-server --signal reload)"

// credsInitResult is the --json form of creds init.
type credsInitResult struct {
	Dir          string            `json:"dir"`
	Operator     string            `json:"operator"`
	Account      string            `json:"account"`
	TaskShards   int               `json:"task_shards"`
	TLS          bool              `json:"tls"`
	Users        map[string]string `json:"users"` // identity → user public key
	ServerConfig string            `json:"server_config"`
	// Reissued: identities given a new key because theirs was revoked;
	// their holders need the new credential.
	Reissued []string `json:"reissued"`
}

// credsResult is the --json form of creds agent, rotate and revoke.
type credsResult struct {
	Identity string `json:"identity"`
	Cluster  string `json:"cluster,omitempty"`
	// Path is the credential written (none for revoke).
	Path string `json:"path,omitempty"`
	// Revoked: an old credential was revoked, so the servers need a reload.
	Revoked bool   `json:"revoked"`
	Note    string `json:"note,omitempty"`
}

// printCreds prints the credential's path on stdout and the note on
// stderr, or with --json both as one document on stdout.
func (a *app) printCreds(r credsResult) error {
	if a.json {
		return writeJSON(a.stdout, r)
	}
	if r.Path != "" {
		fmt.Fprintln(a.stdout, r.Path)
	}
	if r.Note != "" {
		fmt.Fprintln(a.stderr, r.Note)
	}
	return nil
}

// setupResult is the --json form of setup.
type setupResult struct {
	Status     string `json:"status"` // "up_to_date"
	Replicas   int    `json:"replicas"`
	TaskShards int    `json:"task_shards"`
	Partitions int    `json:"partitions"`
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// credsError classifies a failure of the offline creds commands: they
// touch no server, so nothing of theirs is "NATS unavailable" (exit 4). An
// identity the manifest does not list is not found (3); anything else is
// the command as called (2): a missing or bad argument, a directory that
// is not one `creds init` made.
func credsError(err error) error {
	if errors.Is(err, creds.ErrUnknownIdentity) {
		return &exitError{code: exitNotFound, err: err}
	}
	return &exitError{code: exitUsage, err: err}
}
