//go:build linux

package transfer

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestFloodDoesNotStarve: sockets that connect and never say hello (many
// more than the server's slots) do not keep a credentialed client out: a
// new connection evicts the oldest still in its handshake, and an
// authenticated one is never evicted, so the client's reads succeed before,
// during and after further floods.
func TestFloodDoesNotStarve(t *testing.T) {
	tokens, err := auth.NewTokens("good")
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource()
	keys := fill(src, []int{4096})
	const maxConns = 16
	srv, addr := startServer(t, src, &ServerOptions{Tokens: tokens, MaxConns: maxConns})
	flood := func(n int) {
		for range n {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { nc.Close() })
		}
	}
	get := func(c *Client, when string) {
		r, err := c.Get(context.Background(), keys)
		if err != nil || r.Hits() != 1 {
			t.Fatalf("%s: get: %v", when, err)
		}
		r.Release()
	}
	flood(200) // 12 times the slots: every one of them pending
	testkit.WaitFor(t, "the flood accepted", func() bool { return srv.Stats().Evicted >= 200-int64(pendingSlots(maxConns)) })
	c := newClient(t, addr, &ClientOptions{Token: "good", MaxConns: 2})
	get(c, "after a flood")
	flood(200)
	get(c, "during a flood") // its connection is authenticated: never evicted
	d := newClient(t, addr, &ClientOptions{Token: "good", MaxConns: 1})
	get(d, "a new client after two floods")
	if st := srv.Stats(); st.Unauthorized != 0 {
		t.Errorf("stats %+v", st)
	}
	srv.mu.Lock()
	order := len(srv.mu.order)
	srv.mu.Unlock()
	if order > 2*(maxConns+pendingSlots(maxConns)) {
		t.Errorf("the eviction order holds %d connections after 400 were accepted; it should be compacted", order)
	}
}

// TestTenantSlotShare: one tenant's clients take at most its share of a
// server's slots, TCP and shared memory alike: past it, its hello is
// refused with ErrLimit, while another tenant and node-wide clients still
// connect.
func TestTenantSlotShare(t *testing.T) {
	acme := auth.Principal{Tenant: "acme", Scopes: auth.Read, Tag: auth.TagOf("acme")}
	beta := auth.Principal{Tenant: "beta", Scopes: auth.Read, Tag: auth.TagOf("beta")}
	creds, _ := auth.Shared("node")
	creds = append(creds, auth.Credential{Sum: sha("acme"), Principal: acme}, auth.Credential{Sum: sha("beta"), Principal: beta})
	tokens, err := auth.NewCredentials(creds)
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource()
	keys := []prefixhash.Key{testKey(0)}
	_, addr := startServer(t, src, &ServerOptions{Tokens: tokens, MaxConns: 8, MaxConnsPerTenant: 2})
	_, path := startShm(t, src, &ShmServerOptions{Tokens: tokens, MaxClients: 8, MaxClientsPerTenant: 2})
	ctx := context.Background()
	for i := range 3 {
		c := newClient(t, addr, &ClientOptions{Token: "acme", MaxConns: 1})
		r, err := c.Get(ctx, keys)
		if i < 2 && err != nil {
			t.Fatalf("acme's TCP client %d: %v", i, err)
		}
		if i == 2 && !errors.Is(err, ErrRemote) {
			t.Fatalf("acme's third TCP connection, over its share: %v", err)
		}
		if err == nil {
			r.Release()
		}
		sc, err := DialShm(ctx, path, &ShmClientOptions{Token: "acme"})
		if i < 2 && err != nil {
			t.Fatalf("acme's shared-memory client %d: %v", i, err)
		}
		if i == 2 && err == nil {
			t.Fatal("acme's third shared-memory client, over its share, was accepted")
		}
		if err == nil {
			t.Cleanup(func() { sc.Close() })
		}
	}
	for _, tok := range []string{"beta", "node"} {
		c := newClient(t, addr, &ClientOptions{Token: tok, MaxConns: 1})
		if r, err := c.Get(ctx, keys); err != nil {
			t.Errorf("%s over TCP beside acme's full share: %v", tok, err)
		} else {
			r.Release()
		}
		sc, err := DialShm(ctx, path, &ShmClientOptions{Token: tok})
		if err != nil {
			t.Errorf("%s over shared memory beside acme's full share: %v", tok, err)
			continue
		}
		sc.Close()
	}
}
