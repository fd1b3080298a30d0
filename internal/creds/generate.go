package creds

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Names of the operator and accounts in the JWTs.
const (
	OperatorName = "warden"
	AccountName  = "WARDEN"
	SystemName   = "SYS"
)

// Config says what `warden creds` generates.
type Config struct {
	// Dir receives everything (see the package doc for the layout).
	Dir string
	// TaskShards the agents' permissions are computed for: it must match
	// the deployment's task_shards. Defaults to 4.
	TaskShards int
	// Agents to mint credentials for now, as "<pool>.<id>", or
	// "<pool>.<id>@<cluster>" for a member of a cluster (it may lead it).
	Agents []string
	// Routes are the cluster's route hosts ("nats-1:6222"); none for a
	// single server.
	Routes []string
	// TLS turns on TLS for clients and routes (certificates in
	// server/tls and creds/ca.pem, made either way). Without it routes
	// authenticate with a generated password.
	TLS bool
	// Hosts are the server certificate's names. Defaults to localhost,
	// 127.0.0.1 and the route hosts.
	Hosts []string
	// ServerDir is where the server directory is mounted when the server
	// runs (certificate paths in server.conf). Defaults to Dir/server.
	ServerDir string
	// StoreDir is the server's JetStream directory. Defaults to /data.
	StoreDir string
	// Listen is the client address. Defaults to 0.0.0.0:4222.
	Listen string
	// SyncInterval is how often the servers flush JetStream writes to
	// disk (server.conf's jetstream sync_interval): "always" (every
	// write, at a throughput cost: a power loss then loses nothing
	// acknowledged), a Go duration ("10s"), or "default" (nats-server's
	// own, two minutes). Empty keeps what the directory was made with
	// (the manifest), so a later run that only adds agents keeps it.
	SyncInterval string
}

// SyncAlways and SyncDefault are the words Config.SyncInterval takes
// besides a duration.
const (
	SyncAlways  = "always"
	SyncDefault = "default"
)

// syncInterval returns the sync interval to write, given the manifest's:
// "" for nats-server's default.
func (c Config) syncInterval(kept string) (string, error) {
	switch c.SyncInterval {
	case "":
		return kept, nil
	case SyncDefault:
		return "", nil
	case SyncAlways:
		return SyncAlways, nil
	}
	d, err := time.ParseDuration(c.SyncInterval)
	if err != nil || d <= 0 {
		return "", fmt.Errorf("sync interval %q: want %q, %q or a positive duration such as 10s", c.SyncInterval, SyncAlways, SyncDefault)
	}
	return d.String(), nil
}

func (c Config) withDefaults() Config {
	if c.TaskShards <= 0 {
		c.TaskShards = 4
	}
	if c.ServerDir == "" {
		c.ServerDir, _ = filepath.Abs(filepath.Join(c.Dir, "server"))
	}
	if c.StoreDir == "" {
		c.StoreDir = "/data"
	}
	if c.Listen == "" {
		c.Listen = "0.0.0.0:4222"
	}
	if len(c.Hosts) == 0 {
		c.Hosts = []string{"localhost", "127.0.0.1"}
		for _, r := range c.Routes {
			h := r
			if i := strings.LastIndex(r, ":"); i > 0 {
				h = r[:i]
			}
			c.Hosts = append(c.Hosts, h)
		}
	}
	return c
}

// Manifest is dir/manifest.json: public keys, settings and every user
// issued, so that later runs mint, rotate and revoke consistently.
type Manifest struct {
	Operator      string            `json:"operator"`
	Account       string            `json:"account"`
	SigningKey    string            `json:"signing_key"`
	SystemAccount string            `json:"system_account"`
	TaskShards    int               `json:"task_shards"`
	TLS           bool              `json:"tls"`
	SyncInterval  string            `json:"sync_interval,omitempty"` // server.conf's jetstream sync_interval; empty: nats-server's default
	Routes        []string          `json:"routes,omitempty"`
	Users         map[string]string `json:"users"`   // identity → user public key
	Revoked       map[string]int64  `json:"revoked"` // user public key → unix time

	// Reissued lists the identities this run gave a new key because the
	// key in their .creds file was revoked (Revoke keeps the file): their
	// holders need the new file. Not stored.
	Reissued []string `json:"-"`
}

// Paths in the generated directory.
func ManifestPath(dir string) string        { return filepath.Join(dir, "manifest.json") }
func keyPath(dir, name string) string       { return filepath.Join(dir, "keys", name+".nk") }
func ServerConfPath(dir string) string      { return filepath.Join(dir, "server", "server.conf") }
func AuthConfPath(dir string) string        { return filepath.Join(dir, "server", "auth.conf") }
func CredsPath(dir, identity string) string { return filepath.Join(dir, "creds", identity+".creds") }
func CAPath(dir string) string              { return filepath.Join(dir, "creds", "ca.pem") }

// AgentCredsPath is where agent <pool>.<id>'s credential is written.
func AgentCredsPath(dir, pool, id string) string {
	return filepath.Join(dir, "creds", "agents", pool+"."+id+".creds")
}

// Generate creates (or completes) a credentials directory: operator,
// account and system account keys and JWTs, the server's auth.conf and
// server.conf, one credential per fixed role and per agent in c.Agents,
// and with TLS a CA and a server certificate. Keys already in the
// directory are kept, so running it again only adds what is missing and
// rewrites the configuration; use Rotate to replace a credential.
func Generate(c Config) (*Manifest, error) {
	// The bound every process checks (streams.Options): past it, the
	// role credentials no longer fit in the server's max_control_line.
	if err := (streams.Options{TaskShards: c.TaskShards}).Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	for _, sub := range []string{"keys", "server", "creds", "creds/agents"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, sub), 0o700); err != nil {
			return nil, err
		}
	}
	m, err := loadManifest(c.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if m == nil {
		m = &Manifest{Users: map[string]string{}, Revoked: map[string]int64{}}
	}
	if m.TaskShards != 0 && m.TaskShards != c.TaskShards && len(m.Users) > 0 {
		return nil, fmt.Errorf("%s was made for task_shards %d, not %d: agents' credentials name their shard; "+
			"generate a new directory for a new shard count", c.Dir, m.TaskShards, c.TaskShards)
	}
	// Agent ids must be unique across the deployment (see checkAgentID):
	// refuse a clash before anything is written.
	taken := maps.Clone(m.Users)
	for _, a := range c.Agents {
		pool, id, ok := strings.Cut(a, ".")
		if !ok {
			return nil, fmt.Errorf("agent %q: want <pool>.<id>", a)
		}
		id, _, _ = strings.Cut(id, "@")
		if err := checkAgentID(taken, pool, id); err != nil {
			return nil, err
		}
		taken[AgentIdentity(pool, id)] = ""
	}

	if c.SyncInterval, err = c.syncInterval(m.SyncInterval); err != nil {
		return nil, err
	}
	m.TaskShards, m.TLS, m.Routes, m.SyncInterval = c.TaskShards, c.TLS, c.Routes, c.SyncInterval

	op, err := loadOrCreateKey(c.Dir, "operator", nkeys.CreateOperator)
	if err != nil {
		return nil, err
	}
	acc, err := loadOrCreateKey(c.Dir, "account", nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	sk, err := loadOrCreateKey(c.Dir, "signing", nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	sys, err := loadOrCreateKey(c.Dir, "system", nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	m.Operator, _ = op.PublicKey()
	m.Account, _ = acc.PublicKey()
	m.SigningKey, _ = sk.PublicKey()
	m.SystemAccount, _ = sys.PublicKey()

	for _, r := range Roles(c.TaskShards) {
		if err := ensureUser(c.Dir, m, sk, r, CredsPath(c.Dir, r.Name), false); err != nil {
			return nil, err
		}
	}
	if err := ensureSysUser(c.Dir, m, sys); err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, a := range c.Agents {
		pool, id, ok := strings.Cut(a, ".")
		if !ok {
			return nil, fmt.Errorf("agent %q: want <pool>.<id>", a)
		}
		if _, err := mintAgent(c.Dir, m, sk, pool, id, false); err != nil {
			return nil, err
		}
		bare, _, _ := strings.Cut(id, "@")
		named[AgentIdentity(pool, bare)] = true
	}
	if err := resignAgents(c.Dir, m, sk, named); err != nil {
		return nil, err
	}
	// The CA and server certificate are always made (cheap, and the
	// compose file can mount them either way); server.conf uses them only
	// with TLS.
	if err := ensureTLS(c); err != nil {
		return nil, err
	}
	if err := writeServerFiles(c, m, op, acc, sys); err != nil {
		return nil, err
	}
	return m, saveManifest(c.Dir, m)
}

// MintAgent issues (or re-issues, when rotate) agent <pool>.<id>'s
// credential in an existing directory and returns its path. An id of the
// form "<id>@<cluster>" grants what a member of that cluster needs. Minting needs
// only the account signing key; the server configuration does not change.
func MintAgent(dir, pool, id string, rotate bool) (string, error) {
	m, err := loadManifest(dir)
	if err != nil {
		return "", fmt.Errorf("read %s (run `warden creds init` first): %w", ManifestPath(dir), err)
	}
	sk, err := loadKey(dir, "signing")
	if err != nil {
		return "", err
	}
	path, err := mintAgent(dir, m, sk, pool, id, rotate)
	if err != nil {
		return "", err
	}
	if rotate {
		if err := rewriteAuth(dir, m); err != nil {
			return "", err
		}
	}
	return path, saveManifest(dir, m)
}

// ErrUnknownIdentity: the manifest lists no credential of that name.
var ErrUnknownIdentity = errors.New("unknown identity")

// Rotate replaces a fixed role's credential with a new key and revokes the
// old one (auth.conf is rewritten: reload the servers, then restart the
// processes that use the role).
func Rotate(dir, role string) (string, error) {
	m, err := loadManifest(dir)
	if err != nil {
		return "", err
	}
	r, err := RoleByName(role, m.TaskShards)
	if err != nil {
		return "", err
	}
	sk, err := loadKey(dir, "signing")
	if err != nil {
		return "", err
	}
	path := CredsPath(dir, r.Name)
	if err := ensureUser(dir, m, sk, r, path, true); err != nil {
		return "", err
	}
	if err := rewriteAuth(dir, m); err != nil {
		return "", err
	}
	return path, saveManifest(dir, m)
}

// Revoke revokes an identity's current credential (a lost agent, say)
// without issuing a new one. Reload the servers afterwards.
func Revoke(dir, identity string) error {
	m, err := loadManifest(dir)
	if err != nil {
		return err
	}
	pub, ok := m.Users[identity]
	if !ok {
		return fmt.Errorf("%w: no credential issued to %q", ErrUnknownIdentity, identity)
	}
	m.Revoked[pub] = time.Now().Unix()
	delete(m.Users, identity)
	if err := rewriteAuth(dir, m); err != nil {
		return err
	}
	return saveManifest(dir, m)
}

func mintAgent(dir string, m *Manifest, sk nkeys.KeyPair, pool, id string, rotate bool) (string, error) {
	id, cluster, _ := strings.Cut(id, "@")
	r, err := AgentInCluster(pool, id, m.TaskShards, cluster)
	if err != nil {
		return "", err
	}
	if err := checkAgentID(m.Users, pool, id); err != nil {
		return "", err
	}
	path := AgentCredsPath(dir, pool, id)
	return path, ensureUser(dir, m, sk, r, path, rotate)
}

// resignAgents signs again, with the code's current permissions, every
// agent minted earlier (`warden creds agent`, an earlier init's --agents)
// and not named in this run: init re-signed only the fixed roles and the
// agents it was given, so a tightened permission never reached the rest,
// whose JWTs do not expire. Each keeps its key and its cluster (read from
// its current JWT); one whose .creds file is not in dir, or whose file's
// key was revoked (Revoke drops the identity itself from m.Users), is left
// alone (re-signing it would need a new key, and so a new
// file for its holder).
func resignAgents(dir string, m *Manifest, sk nkeys.KeyPair, named map[string]bool) error {
	for _, identity := range slices.Sorted(maps.Keys(m.Users)) {
		rest, ok := strings.CutPrefix(identity, "agent.")
		if !ok || named[identity] {
			continue
		}
		pool, id, ok := strings.Cut(rest, ".")
		if !ok {
			continue
		}
		file, err := os.ReadFile(AgentCredsPath(dir, pool, id))
		if err != nil {
			continue
		}
		if kp, revoked := usableKey(m, file); revoked || kp == nil {
			continue
		}
		if c := clusterOf(file); c != "" {
			id += "@" + c
		}
		if _, err := mintAgent(dir, m, sk, pool, id, false); err != nil {
			return fmt.Errorf("re-sign %s: %w", identity, err)
		}
	}
	return nil
}

// clusterOf is the cluster an agent credential was minted for ("" for
// none): the cluster lease key its JWT may write (AgentInCluster).
func clusterOf(creds []byte) string {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return ""
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return ""
	}
	prefix := clusterLeaseSubject("")
	for _, s := range uc.Permissions.Pub.Allow {
		if c, ok := strings.CutPrefix(s, prefix); ok && protocol.ValidToken(c) {
			return c
		}
	}
	return ""
}

// checkAgentID refuses agent <pool>.<id> when users (identity → key)
// holds a credential for the same id in another pool. An agent's durable
// task consumer is named by its id alone (streams.TaskConsumer) and its
// credential grants the consumer API on <stream>.<id>, so two pools' agents
// of one id landing on the same shard could pull, ack and delete each
// other's tasks. Ids must therefore be unique across the deployment. A
// revoked identity no longer counts: its credential is dead.
func checkAgentID(users map[string]string, pool, id string) error {
	for identity := range users {
		rest, ok := strings.CutPrefix(identity, "agent.")
		if !ok {
			continue
		}
		if p, i, _ := strings.Cut(rest, "."); i == id && p != pool {
			return fmt.Errorf("agent %s.%s: id %q is already minted in pool %q (%s); agent ids must be unique across "+
				"the deployment (an agent's task consumer is named by its id alone): choose another id, or revoke %s first",
				pool, id, id, p, identity, identity)
		}
	}
	return nil
}

// usableKey parses the user key of a .creds file, unless the account
// revoked it. Revoke leaves the file in place, and a JWT re-signed now
// would be issued after the revocation time and so pass it: a revoked key
// must never be signed again.
func usableKey(m *Manifest, file []byte) (nkeys.KeyPair, bool) {
	kp, err := jwt.ParseDecoratedNKey(file)
	if err != nil {
		return nil, false
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, false
	}
	if _, revoked := m.Revoked[pub]; revoked {
		return nil, true
	}
	return kp, false
}

// ensureUser writes a user credential for r signed by the account's
// signing key, unless one exists and rotate is false. The JWT is always
// re-signed with r's current permissions so that a regenerated directory
// carries the code's permissions; rotate also replaces the user key and
// revokes the old one. A key the account revoked is never reused: the
// identity gets a new one (listed in m.Reissued).
func ensureUser(dir string, m *Manifest, sk nkeys.KeyPair, r Role, path string, rotate bool) error {
	var user nkeys.KeyPair
	if old, err := os.ReadFile(path); err == nil && !rotate {
		kp, revoked := usableKey(m, old)
		user = kp
		if revoked {
			m.Reissued = append(m.Reissued, r.Name)
		}
	}
	if user == nil {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return err
		}
		user = kp
	}
	pub, _ := user.PublicKey()
	if prev, ok := m.Users[r.Name]; ok && prev != pub {
		m.Revoked[prev] = time.Now().Unix()
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = r.Name
	uc.IssuerAccount = m.Account
	uc.Permissions.Pub.Allow.Add(r.Pub...)
	uc.Permissions.Sub.Allow.Add(r.Sub...)
	if r.Responses {
		uc.Permissions.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	}
	token, err := uc.Encode(sk)
	if err != nil {
		return fmt.Errorf("sign %s: %w", r.Name, err)
	}
	seed, _ := user.Seed()
	b, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return err
	}
	m.Users[r.Name] = pub
	return writeSecret(path, b)
}

func ensureSysUser(dir string, m *Manifest, sys nkeys.KeyPair) error {
	path := CredsPath(dir, "sys")
	var user nkeys.KeyPair
	if old, err := os.ReadFile(path); err == nil {
		kp, revoked := usableKey(m, old)
		user = kp
		if revoked {
			m.Reissued = append(m.Reissued, "sys")
		}
	}
	if user == nil {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return err
		}
		user = kp
	}
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = "sys"
	token, err := uc.Encode(sys)
	if err != nil {
		return err
	}
	seed, _ := user.Seed()
	b, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return err
	}
	m.Users["sys"] = pub
	return writeSecret(path, b)
}

// accountJWTs returns the signed account and system account JWTs.
func accountJWTs(dir string, m *Manifest) (string, string, error) {
	op, err := loadKey(dir, "operator")
	if err != nil {
		return "", "", err
	}
	ac := jwt.NewAccountClaims(m.Account)
	ac.Name = AccountName
	ac.SigningKeys.Add(m.SigningKey)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	sc := jwt.NewAccountClaims(m.SystemAccount)
	sc.Name = SystemName
	// A revocation only counts in the account that issued the user, and the
	// manifest does not say which one did (the sys user is the system
	// account's): both accounts list every revoked key. A key of the other
	// account's list matches none of an account's users.
	revoked := make([]string, 0, len(m.Revoked))
	for k := range m.Revoked {
		revoked = append(revoked, k)
	}
	sort.Strings(revoked)
	for _, k := range revoked {
		ac.RevokeAt(k, time.Unix(m.Revoked[k], 0))
		sc.RevokeAt(k, time.Unix(m.Revoked[k], 0))
	}
	accJWT, err := ac.Encode(op)
	if err != nil {
		return "", "", err
	}
	sysJWT, err := sc.Encode(op)
	if err != nil {
		return "", "", err
	}
	return accJWT, sysJWT, nil
}

func rewriteAuth(dir string, m *Manifest) error {
	op, err := loadKey(dir, "operator")
	if err != nil {
		return err
	}
	return writeAuth(dir, m, op)
}

func writeAuth(dir string, m *Manifest, op nkeys.KeyPair) error {
	oc := jwt.NewOperatorClaims(m.Operator)
	oc.Name = OperatorName
	oc.SystemAccount = m.SystemAccount
	opJWT, err := oc.Encode(op)
	if err != nil {
		return err
	}
	accJWT, sysJWT, err := accountJWTs(dir, m)
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# Generated by `warden creds`: the operator, the WARDEN account (JetStream)\n")
	b.WriteString("# and the system account. Users are not listed: any user JWT signed by the\n")
	b.WriteString("# account's signing key is accepted with the permissions it carries, unless\n")
	b.WriteString("# the account revokes it. Do not edit; regenerate.\n")
	fmt.Fprintf(&b, "operator: %q\n", opJWT)
	fmt.Fprintf(&b, "system_account: %s\n", m.SystemAccount)
	b.WriteString("resolver: MEMORY\n")
	b.WriteString("resolver_preload: {\n")
	fmt.Fprintf(&b, "  %s: %q\n", m.Account, accJWT)
	fmt.Fprintf(&b, "  %s: %q\n", m.SystemAccount, sysJWT)
	b.WriteString("}\n")
	return writeSecret(AuthConfPath(dir), []byte(b.String()))
}

func loadManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(ManifestPath(dir))
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", ManifestPath(dir), err)
	}
	if m.Users == nil {
		m.Users = map[string]string{}
	}
	if m.Revoked == nil {
		m.Revoked = map[string]int64{}
	}
	return &m, nil
}

// LoadManifest reads dir/manifest.json.
func LoadManifest(dir string) (*Manifest, error) { return loadManifest(dir) }

func saveManifest(dir string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeSecret(ManifestPath(dir), append(b, '\n'))
}

func loadKey(dir, name string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(keyPath(dir, name))
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", name, err)
	}
	return nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
}

func loadOrCreateKey(dir, name string, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, error) {
	kp, err := loadKey(dir, name)
	if err == nil {
		return kp, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	kp, err = create()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	return kp, writeSecret(keyPath(dir, name), append(seed, '\n'))
}

// writeSecret writes a file only its owner can read, atomically.
func writeSecret(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// randomSecret returns n random bytes, hex encoded.
func randomSecret(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// Identities lists every identity with a current credential, sorted.
func (m *Manifest) Identities() []string {
	out := make([]string, 0, len(m.Users))
	for k := range m.Users {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
