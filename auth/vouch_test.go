package auth

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestVouch: a node's vouch for a caller is accepted by a node with the
// same tokens file for that one request until it expires, and yields the
// caller's tenant (salt and tag as the file derives them) and scopes, never
// the cluster scope; a tampered value, another request, a later time, a
// file with another secret or without the tenant refuse it.
func TestVouch(t *testing.T) {
	const body = `secret: "0123456789abcdef0123456789abcdef-vouch"
tokens:
  - {token: acme-rw, tenant: acme, scopes: [read, write]}
  - {token: node, scopes: [cluster, read, write]}
`
	f, err := ParseFile([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	acme := f.Credentials[0].Principal
	now := time.Unix(1_700_000_000, 0)
	v := f.Vouch(Principal{Tenant: "acme", Tag: acme.Tag, Salt: acme.Salt, Scopes: Read | Cluster}, "GET /v1/queue/x", now)
	p, err := f.Vouched(v, "GET /v1/queue/x", now.Add(time.Second))
	if err != nil || p.Tenant != "acme" || p.Salt != acme.Salt || p.Tag != acme.Tag || p.Scopes != Read {
		t.Fatalf("Vouched = %+v, %v; want acme with read only", p, err)
	}
	if p, err := f.Vouched(f.Vouch(Principal{Scopes: Read}, "GET /v1/queue/y", now), "GET /v1/queue/y", now); err != nil || p.Scoped() || p.Scopes != Read {
		t.Fatalf("a node-wide vouch: %+v, %v", p, err)
	}
	other, _ := ParseFile([]byte(strings.Replace(body, "-vouch", "-other", 1)))
	noAcme, _ := ParseFile([]byte(strings.Replace(body, "  - {token: acme-rw, tenant: acme, scopes: [read, write]}\n", "  - {token: beta, tenant: beta, scopes: [read]}\n", 1)))
	claim, sig, _ := strings.Cut(v, ".")
	for name, tc := range map[string]struct {
		f    *File
		v    string
		what string
		at   time.Time
	}{
		"another request": {f, v, "DELETE /v1/queue/x", now},
		"expired":         {f, v, "GET /v1/queue/x", now.Add(VouchTTL + time.Second)},
		"tampered claim":  {f, claim[:len(claim)-2] + "AA." + sig, "GET /v1/queue/x", now},
		"no signature":    {f, claim, "GET /v1/queue/x", now},
		"another secret":  {other, v, "GET /v1/queue/x", now},
		"unknown tenant":  {noAcme, v, "GET /v1/queue/x", now},
	} {
		if _, err := tc.f.Vouched(tc.v, tc.what, tc.at); !errors.Is(err, ErrVouch) {
			t.Errorf("%s: %v, want ErrVouch", name, err)
		}
	}
}
