package creds_test

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/wardenhq/warden/internal/creds"
)

// accountClaims decodes the account JWT auth.conf preloads for account pub.
func accountClaims(t *testing.T, dir, pub string) *jwt.AccountClaims {
	t.Helper()
	b, err := os.ReadFile(creds.AuthConfPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok || k != pub {
			continue
		}
		token, err := strconv.Unquote(v)
		if err != nil {
			t.Fatalf("auth.conf line %q: %v", line, err)
		}
		ac, err := jwt.DecodeAccountClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		return ac
	}
	t.Fatalf("auth.conf preloads no JWT for account %s", pub)
	return nil
}

// userClaims decodes the JWT of a .creds file.
func userClaims(t *testing.T, path string) *jwt.UserClaims {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// TestRegenerateKeepsRevocations: `warden creds init` is documented as safe
// to run again, and Revoke leaves the identity's .creds file in place.
// Generate used to reload that file's (revoked) key and sign a new JWT for
// it, issued after the revocation time, so RevokeAt no longer applied and
// the revoked credential worked again. The identity must get a new key
// instead, and the old one must stay revoked.
func TestRegenerateKeepsRevocations(t *testing.T) {
	dir := t.TempDir()
	cfg := creds.Config{Dir: dir, Agents: []string{"default.a1"}}
	m1, err := creds.Generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		identity, path string
		sys            bool // issued by the system account
	}{
		{creds.AgentIdentity("default", "a1"), creds.AgentCredsPath(dir, "default", "a1"), false},
		{creds.RolePublisher, creds.CredsPath(dir, creds.RolePublisher), false},
		{"sys", creds.CredsPath(dir, "sys"), true},
	} {
		t.Run(tc.identity, func(t *testing.T) {
			old := m1.Users[tc.identity]
			if old == "" {
				t.Fatalf("no key issued to %s: %v", tc.identity, m1.Users)
			}
			revoked := userClaims(t, tc.path)
			if err := creds.Revoke(dir, tc.identity); err != nil {
				t.Fatal(err)
			}
			m2, err := creds.Generate(cfg)
			if err != nil {
				t.Fatal(err)
			}
			account := m2.Account
			if tc.sys {
				account = m2.SystemAccount
			}
			ac := accountClaims(t, dir, account)
			uc := userClaims(t, tc.path)
			if uc.Subject == old || m2.Users[tc.identity] == old {
				t.Errorf("regenerating re-signed the revoked key %s for %s (manifest %s, file %s)",
					old, tc.identity, m2.Users[tc.identity], uc.Subject)
			}
			if uc.Subject != m2.Users[tc.identity] {
				t.Errorf("%s: file holds %s, manifest says %s", tc.identity, uc.Subject, m2.Users[tc.identity])
			}
			if m2.Revoked[old] == 0 || !ac.IsClaimRevoked(revoked) {
				t.Errorf("old key %s of %s no longer revoked: manifest %v, account %v", old, tc.identity, m2.Revoked, ac.Revocations)
			}
			if ac.IsClaimRevoked(uc) {
				t.Errorf("the reissued credential of %s is revoked", tc.identity)
			}
			if !slices.Contains(m2.Reissued, tc.identity) {
				t.Errorf("Reissued %v lacks %s", m2.Reissued, tc.identity)
			}
		})
	}
}

// TestAgentIDUniqueAcrossPools: an agent's durable task consumer is named
// by its id alone and its credential grants the consumer API on
// <stream>.<id>, so agent.staging.a1 could pull, ack and delete
// agent.default.a1's consumer when both hash to the same shard. Minting an
// id already minted in another pool is refused, through every entry.
func TestAgentIDUniqueAcrossPools(t *testing.T) {
	// In one list.
	if _, err := creds.Generate(creds.Config{Dir: t.TempDir(), Agents: []string{"default.a1", "staging.a1"}}); err == nil ||
		!strings.Contains(err.Error(), "agent.default.a1") || !strings.Contains(err.Error(), "staging.a1") {
		t.Errorf("Generate with default.a1 and staging.a1: %v", err)
	}

	dir := t.TempDir()
	if _, err := creds.Generate(creds.Config{Dir: dir, Agents: []string{"default.a1"}}); err != nil {
		t.Fatal(err)
	}
	// Against the directory: init, agent, agent --cluster, agent --rotate.
	if _, err := creds.Generate(creds.Config{Dir: dir, Agents: []string{"staging.a1"}}); err == nil {
		t.Error("Generate minted staging.a1 beside default.a1")
	}
	for _, tc := range []struct {
		id     string
		rotate bool
	}{{"a1", false}, {"a1@web", false}, {"a1", true}} {
		if _, err := creds.MintAgent(dir, "staging", tc.id, tc.rotate); err == nil ||
			!strings.Contains(err.Error(), "agent.default.a1") || !strings.Contains(err.Error(), "staging.a1") {
			t.Errorf("MintAgent staging %s (rotate %v) beside default.a1: %v", tc.id, tc.rotate, err)
		}
	}
	if _, err := os.Stat(creds.AgentCredsPath(dir, "staging", "a1")); !os.IsNotExist(err) {
		t.Errorf("a refused agent's credential was written: %v", err)
	}
	m, err := creds.LoadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Users[creds.AgentIdentity("staging", "a1")]; ok {
		t.Errorf("a refused agent is in the manifest: %v", m.Users)
	}

	// The same pool (re-minting, rotating, joining a cluster) is fine, and
	// so is another id.
	for _, tc := range []struct {
		pool, id string
		rotate   bool
	}{{"default", "a1", false}, {"default", "a1", true}, {"default", "a1@web", false}, {"staging", "a2", false}} {
		if _, err := creds.MintAgent(dir, tc.pool, tc.id, tc.rotate); err != nil {
			t.Errorf("MintAgent %s %s: %v", tc.pool, tc.id, err)
		}
	}
	// Once the other is revoked its id is free.
	if err := creds.Revoke(dir, creds.AgentIdentity("default", "a1")); err != nil {
		t.Fatal(err)
	}
	if _, err := creds.MintAgent(dir, "staging", "a1", false); err != nil {
		t.Errorf("MintAgent staging a1 after revoking default.a1: %v", err)
	}
}

// TestAgentClusterReportOnlyInItsCluster: an agent's credential let it
// write a member report "<cluster>.member.<pool>.<id>" (then in
// warden_clusters, now in warden_cluster_runtime) in every cluster, so any
// agent could pose as a member of any cluster (counted by its leader as
// alive, admitted, elected). A member joins only the cluster
// it is configured for, and needs AgentInCluster for it anyway (it opens
// warden_cluster_leases, which Agent does not grant); the report is granted there,
// for that cluster alone.
func TestAgentClusterReportOnlyInItsCluster(t *testing.T) {
	allowed := func(r creds.Role, subject string) bool {
		return slices.ContainsFunc(r.Pub, func(f string) bool { return server.SubjectMatchesFilter(subject, f) })
	}
	plain, err := creds.Agent("default", "a1", 4)
	if err != nil {
		t.Fatal(err)
	}
	web, err := creds.AgentInCluster("default", "a1", 4, "web")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		r       creds.Role
		subject string
		want    bool
	}{
		{plain, "$KV.warden_cluster_runtime.web.member.default.a1", false},
		{plain, "$KV.warden_cluster_runtime.db.member.default.a1", false},
		{web, "$KV.warden_cluster_runtime.web.member.default.a1", true},
		{web, "$KV.warden_cluster_runtime.db.member.default.a1", false},
		{web, "$KV.warden_cluster_runtime.web.member.default.a2", false},
		{web, "$KV.warden_cluster_runtime.db.state", false},
		{web, "$KV.warden_clusters.web", false},
		{web, "$KV.warden_clusters.web.member.default.a1", false},
	} {
		if got := allowed(tc.r, tc.subject); got != tc.want {
			t.Errorf("%s (%s) may publish %s: %v, want %v", tc.r.Name, tc.r.Purpose, tc.subject, got, tc.want)
		}
	}
}
