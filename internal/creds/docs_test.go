package creds_test

import (
	"os"
	"strings"
	"testing"

	"github.com/wardenhq/warden/internal/creds"
)

// TestDocsListTheRealPermissions keeps docs/security.md's permission list
// equal to what `warden creds` puts in the credentials.
func TestDocsListTheRealPermissions(t *testing.T) {
	b, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- roles:begin (go run ./cmd/warden creds roles) -->\n", "<!-- roles:end -->"
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("docs/security.md lacks the %q ... %q block", begin, end)
	}
	got := doc[i+len(begin) : j]
	want := creds.Markdown(creds.DocRoles(4))
	if got != want {
		t.Fatalf("docs/security.md's role permissions differ from internal/creds; replace the block with the output of "+
			"`go run ./cmd/warden creds roles`.\nwant:\n%s", want)
	}
}

// TestGenerateIsStableAndRotates: a second Generate keeps every key; Rotate
// replaces one credential and revokes the old key.
func TestGenerateIsStableAndRotates(t *testing.T) {
	dir := t.TempDir()
	m1, err := creds.Generate(creds.Config{Dir: dir, Agents: []string{"default.a1"}, TLS: true, Routes: []string{"nats-1:6222"}})
	if err != nil {
		t.Fatal(err)
	}
	m2, err := creds.Generate(creds.Config{Dir: dir, TLS: true, Routes: []string{"nats-1:6222"}})
	if err != nil {
		t.Fatal(err)
	}
	if m1.Account != m2.Account || m1.Users["scheduler"] != m2.Users["scheduler"] || m2.Users["agent.default.a1"] == "" {
		t.Fatalf("regenerating changed keys: %v vs %v", m1.Users, m2.Users)
	}
	old := m2.Users["scheduler"]
	if _, err := creds.Rotate(dir, "scheduler"); err != nil {
		t.Fatal(err)
	}
	m3, err := creds.LoadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m3.Users["scheduler"] == old || m3.Revoked[old] == 0 {
		t.Fatalf("rotate: users %v revoked %v", m3.Users, m3.Revoked)
	}
	auth, _ := os.ReadFile(creds.AuthConfPath(dir))
	conf, _ := os.ReadFile(creds.ServerConfPath(dir))
	if !strings.Contains(string(auth), "resolver_preload") || !strings.Contains(string(conf), "verify: true") {
		t.Fatalf("server files:\n%s\n%s", auth, conf)
	}
	for _, f := range []string{creds.CredsPath(dir, "scheduler"), creds.AuthConfPath(dir)} {
		st, err := os.Stat(f)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, %v", f, st.Mode(), err)
		}
	}
}

// TestClusterMemberGrant: a member of cluster c may lead c, nothing of
// another cluster.
func TestClusterMemberGrant(t *testing.T) {
	r, err := creds.AgentInCluster("default", "a1", 4, "web")
	if err != nil {
		t.Fatal(err)
	}
	has := func(s string) bool {
		for _, p := range r.Pub {
			if p == s {
				return true
			}
		}
		return false
	}
	for _, want := range []string{"$KV.warden_cluster_runtime.web.state", "$KV.warden_cluster_runtime.web.req.*", "$KV.warden_cluster_leases.cluster.web",
		"$JS.API.DIRECT.GET.KV_warden_clusters.$KV.warden_clusters.web",
		"warden.event.cluster_leader_elected.*", "$JS.API.CONSUMER.CREATE.KV_warden_health.*.$KV.warden_health.default.a1"} {
		if !has(want) {
			t.Errorf("member of web lacks %s", want)
		}
	}
	for _, not := range []string{"$KV.warden_cluster_runtime.db.state", "$KV.warden_cluster_leases.cluster.db", "$KV.warden_leases.supervisor",
		"$KV.warden_leases.cluster.web", "$JS.API.STREAM.INFO.KV_warden_leases",
		"$KV.warden_clusters.web", "$KV.warden_clusters.>", "$JS.API.DIRECT.GET.KV_warden_clusters.>"} {
		if has(not) {
			t.Errorf("member of web has %s", not)
		}
	}
	if _, err := creds.AgentInCluster("default", "a1", 4, "bad.name"); err == nil {
		t.Error("a cluster name with a dot accepted")
	}
}
