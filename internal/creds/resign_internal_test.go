package creds

import (
	"os"
	"slices"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// `warden creds init` run again re-signs every agent credential minted
// before with the code's current permissions, keeping its key and its
// cluster, as docs/security.md says: it re-signed only the fixed roles and
// the agents named in that run, so a tightened (or widened) permission
// never reached an agent minted with `warden creds agent`, whose JWT does
// not expire. Here each agent's JWT is first signed again without one of
// its permissions, as an older version would have signed it.
//
// Old code: "agent default.b7 still lacks … after init".
func TestInitResignsMintedAgents(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := Generate(Config{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	plain, err := MintAgent(dir, "default", "b7", false)
	if err != nil {
		t.Fatal(err)
	}
	member, err := MintAgent(dir, "default", "m1@c1", false)
	if err != nil {
		t.Fatal(err)
	}
	sk, err := loadKey(dir, "signing")
	if err != nil {
		t.Fatal(err)
	}
	type agent struct {
		path, identity string
		keyBefore      string
		dropped        string
	}
	agents := []*agent{{path: plain, identity: "default.b7"}, {path: member, identity: "default.m1"}}
	for _, a := range agents {
		uc := claimsOf(t, a.path)
		a.keyBefore = uc.Subject
		a.dropped = uc.Permissions.Pub.Allow[len(uc.Permissions.Pub.Allow)-1]
		uc.Permissions.Pub.Allow = uc.Permissions.Pub.Allow[:len(uc.Permissions.Pub.Allow)-1]
		writeClaims(t, a.path, uc, sk)
	}
	if _, err := Generate(Config{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		uc := claimsOf(t, a.path)
		if !slices.Contains(uc.Permissions.Pub.Allow, a.dropped) {
			t.Errorf("agent %s still lacks %s after init", a.identity, a.dropped)
		}
		if uc.Subject != a.keyBefore {
			t.Errorf("agent %s got a new key (%s, was %s): its holder would need a new file", a.identity, uc.Subject, a.keyBefore)
		}
	}
	if c := clusterOf(mustRead(t, member)); c != "c1" {
		t.Errorf("the cluster member's credential is for cluster %q after init, want c1", c)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func claimsOf(t *testing.T, path string) *jwt.UserClaims {
	t.Helper()
	token, err := jwt.ParseDecoratedJWT(mustRead(t, path))
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// writeClaims signs uc with sk and writes it with the file's own key.
func writeClaims(t *testing.T, path string, uc *jwt.UserClaims, sk nkeys.KeyPair) {
	t.Helper()
	kp, err := jwt.ParseDecoratedNKey(mustRead(t, path))
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	token, err := uc.Encode(sk)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
}
