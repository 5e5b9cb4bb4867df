package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

func TestTokensSet(t *testing.T) {
	if _, err := NewTokens(); err == nil {
		t.Error("an empty token set was accepted")
	}
	if _, err := NewTokens("a", ""); err == nil {
		t.Error("an empty token was accepted")
	}
	if _, err := NewTokens(strings.Repeat("x", MaxTokenLen+1)); err == nil {
		t.Error("a token over MaxTokenLen was accepted")
	}
	tk, err := NewTokens("alpha", "beta")
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]bool{"alpha": true, "beta": true, "": false, "alph": false, "alphaa": false, "gamma": false} {
		if got := tk.Check([]byte(tok)); got != want {
			t.Errorf("Check(%q) = %v, want %v", tok, got, want)
		}
	}
	if err := tk.Set(); err == nil || !tk.Check([]byte("alpha")) {
		t.Error("a failed Set changed the set")
	}
	var zero Tokens
	if zero.Check([]byte("alpha")) {
		t.Error("the zero Tokens accepted a token")
	}
}

func TestReadTokenList(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens")
	os.WriteFile(path, []byte("# rotated 2025-01\n  first-token \n\nsecond\n"), 0o600)
	got, err := ReadTokenList(path)
	if err != nil || len(got) != 2 || got[0] != "first-token" || got[1] != "second" {
		t.Fatalf("ReadTokenList: %q, %v", got, err)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("# nothing\n\n"), 0o600)
	if _, err := ReadTokenList(empty); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("file without tokens: %v", err)
	}
	if _, err := ReadTokenList(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing file accepted")
	}
}

const testSecret = "0123456789abcdef0123456789abcdef"

func tokensFile(t *testing.T, body string) *File {
	t.Helper()
	f, err := ParseFile([]byte(body))
	if err != nil {
		t.Fatalf("ParseFile: %v\n%s", err, body)
	}
	return f
}

func TestParseFile(t *testing.T) {
	sum := sha256.Sum256([]byte("acme-admin"))
	f := tokensFile(t, `
secret: "`+testSecret+`"
tokens:
  - token: acme-rw
    tenant: acme
    scopes: [read, write]
  - sha256: "`+hex.EncodeToString(sum[:])+`"
    tenant: acme
    scopes: [admin]
  - token: beta-r
    tenant: beta
    scopes: [read]
  - token: ops
    scopes: [read, admin]
  - token: node-to-node
    scopes: [cluster, read, write]
`)
	if f.ClusterToken != "node-to-node" || strings.Join(f.Tenants, ",") != "acme,beta" {
		t.Fatalf("cluster token %q, tenants %v", f.ClusterToken, f.Tenants)
	}
	set, err := NewCredentials(f.Credentials)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token, tenant string
		scopes        Scope
	}{
		{"acme-rw", "acme", Read | Write},
		{"acme-admin", "acme", Admin},
		{"beta-r", "beta", Read},
		{"ops", "", Read | Admin},
		{"node-to-node", "", Cluster | Read | Write},
	} {
		p, ok := set.Lookup([]byte(c.token))
		if !ok || p.Tenant != c.tenant || p.Scopes != c.scopes {
			t.Errorf("Lookup(%q) = %+v, %v; want tenant %q scopes %s", c.token, p, ok, c.tenant, c.scopes)
			continue
		}
		if p.Scoped() != (c.tenant != "") || p.Tag != TagOf(c.tenant) {
			t.Errorf("%q: scoped %v tag %x", c.token, p.Scoped(), p.Tag)
		}
		if want := ""; c.tenant != "" {
			want = SaltOf([]byte(testSecret), c.tenant)
			if p.Salt != want {
				t.Errorf("%q: salt %q, want %q", c.token, p.Salt, want)
			}
		} else if p.Salt != want {
			t.Errorf("node-wide %q has a salt", c.token)
		}
	}
	if _, ok := set.Lookup([]byte("acme-rw ")); ok {
		t.Error("a token with a trailing blank was accepted")
	}
	a, _ := set.Lookup([]byte("acme-rw"))
	b, _ := set.Lookup([]byte("beta-r"))
	if a.Tag == b.Tag || a.Salt == b.Salt || len(a.Salt) != 2*saltLen {
		t.Errorf("tenants share a tag or salt: %+v %+v", a, b)
	}
}

func TestParseFileErrors(t *testing.T) {
	cluster := "\n  - token: n\n    scopes: [cluster]\n"
	for name, c := range map[string]struct{ body, want string }{
		"not yaml":           {"[", "not a tokens file"},
		"unknown field":      {"tokenz: []", "not a tokens file"},
		"no tokens":          {"secret: x", "no tokens"},
		"no cluster token":   {"tokens:\n  - token: a\n    scopes: [read]\n", "cluster scope"},
		"digest cluster":     {"tokens:\n  - sha256: " + strings.Repeat("ab", 32) + "\n    scopes: [cluster]\n", "cluster scope"},
		"short secret":       {"secret: short\ntokens:\n  - token: a\n    tenant: t\n    scopes: [read]" + cluster, "secret"},
		"both token and sum": {"tokens:\n  - token: a\n    sha256: " + strings.Repeat("ab", 32) + "\n    scopes: [read]" + cluster, "not both"},
		"bad sum":            {"tokens:\n  - sha256: xyz\n    scopes: [read]" + cluster, "64 hex digits"},
		"no scopes":          {"tokens:\n  - token: a" + cluster, "needs scopes"},
		"bad scope":          {"tokens:\n  - token: a\n    scopes: [root]" + cluster, "unknown scope"},
		"bad tenant":         {"secret: " + testSecret + "\ntokens:\n  - token: a\n    tenant: \"a b\"\n    scopes: [read]" + cluster, "tenant"},
		"tenant cluster":     {"secret: " + testSecret + "\ntokens:\n  - token: a\n    tenant: t\n    scopes: [cluster]" + cluster, "may not hold the cluster scope"},
		"duplicate":          {"tokens:\n  - token: n\n    scopes: [read]" + cluster, "twice"},
	} {
		_, err := ParseFile([]byte(c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.want)
		}
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing file was accepted")
	}
}

func TestNamespaceSalting(t *testing.T) {
	ns := prefixhash.Namespace{Model: "m", DType: prefixhash.Float16, BlockTokens: 16, Layers: 2, KVHeads: 1, HeadDim: 8, TenantSalt: "mine"}
	open, err := Open.Namespace(ns)
	if err != nil || open != ns {
		t.Fatalf("a node-wide principal's namespace changed: %+v, %v", open, err)
	}
	acme := Principal{Tenant: "acme", Scopes: Read, Tag: TagOf("acme"), Salt: SaltOf([]byte(testSecret), "acme")}
	beta := Principal{Tenant: "beta", Scopes: Read, Tag: TagOf("beta"), Salt: SaltOf([]byte(testSecret), "beta")}
	na, err := acme.Namespace(ns)
	if err != nil {
		t.Fatal(err)
	}
	nb, _ := beta.Namespace(ns)
	if na.Root() == nb.Root() || na.Root() == ns.Root() {
		t.Error("two tenants (or a tenant and the open namespace) share a root")
	}
	if na.TenantSalt != SaltedWith(acme.Salt, "mine") {
		t.Errorf("salt %q does not follow SaltedWith", na.TenantSalt)
	}
	// Salting is idempotent: a client that salted already gets the same.
	if again, _ := acme.Namespace(na); again != na {
		t.Errorf("salting twice changed the namespace: %q", again.TenantSalt)
	}
	// A tenant cannot reach another's namespace by choosing its own salt,
	// not even by sending the other's whole salt.
	for _, own := range []string{nb.TenantSalt, strings.TrimPrefix(nb.TenantSalt, beta.Salt+saltSep), beta.Salt} {
		forged := ns
		forged.TenantSalt = own
		if got, _ := acme.Namespace(forged); got.Root() == nb.Root() || !strings.HasPrefix(got.TenantSalt, acme.Salt+saltSep) {
			t.Errorf("salt %q reached another tenant's namespace (%q)", own, got.TenantSalt)
		}
	}
	long := 2*saltLen + len(saltSep)
	ns.TenantSalt = strings.Repeat("s", prefixhash.MaxSaltLen-long+1)
	if _, err := acme.Namespace(ns); err == nil {
		t.Error("a salt that makes the namespace's salt too long was accepted")
	}
	ns.TenantSalt = strings.Repeat("s", prefixhash.MaxSaltLen-long)
	if got, err := acme.Namespace(ns); err != nil || got.Validate() != nil {
		t.Errorf("the longest own salt: %v / %v", err, got.Validate())
	}
}

func TestAccess(t *testing.T) {
	ctx := context.Background()
	if a := AccessFrom(ctx); a.Scoped || !a.Allows(7) {
		t.Errorf("a bare context is not unscoped: %+v", a)
	}
	p := Principal{Tenant: "acme", Scopes: Read, Tag: TagOf("acme")}
	ctx = WithPrincipal(ctx, p)
	a := AccessFrom(ctx)
	if !a.Scoped || !a.Allows(p.Tag) || a.Allows(0) || a.Allows(TagOf("beta")) {
		t.Errorf("tenant access %+v", a)
	}
	if PrincipalFrom(ctx).Tenant != "acme" || PrincipalFrom(context.Background()).Scopes != All {
		t.Error("PrincipalFrom")
	}
	if TagOf("") != 0 || TagOf("a") == 0 {
		t.Error("TagOf: the empty tenant must be 0 and no tenant may be")
	}
	if !p.Can(Read) || p.Can(Write) || p.Can(Read|Write) {
		t.Error("Can")
	}
}
