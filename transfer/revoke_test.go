//go:build linux

package transfer

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestCloseRevoked: once a token leaves the server's set (or names
// another principal), CloseRevoked closes the connections it opened, TCP
// and shared memory, so the credential stops reading at once; a shared-
// memory client's lease on arena blocks ends with it. Connections of the
// tokens that stay keep working.
func TestCloseRevoked(t *testing.T) {
	ctx := context.Background()
	tokens, err := auth.NewTokens("keep", "drop", "narrow")
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource()
	keys := fill(src, []int{4096, 100})
	tcp, addr := startServer(t, src, &ServerOptions{Tokens: tokens})
	a := newArenaSource(t, 4<<20, 1<<20)
	a.set(t, testKey(0), sealed(0, 4096))
	shm, path := startArenaShm(t, a, ShmServerOptions{Tokens: tokens})

	tcpc := map[string]*Client{}
	shmc := map[string]*ShmClient{}
	for _, tok := range []string{"keep", "drop", "narrow"} {
		tcpc[tok] = newClient(t, addr, &ClientOptions{Token: tok, MaxConns: 1})
		r, err := tcpc[tok].Get(ctx, keys)
		if err != nil || r.Hits() != 2 {
			t.Fatalf("%s: TCP get before: %v", tok, err)
		}
		r.Release()
		shmc[tok] = dialShm(t, path, &ShmClientOptions{Token: tok})
	}
	// The writer about to be revoked holds a lease on an arena block.
	held, err := shmc["drop"].Get(ctx, []prefixhash.Key{testKey(0)})
	if err != nil || held.Hits() != 1 || shm.Stats().Leases != 1 {
		t.Fatalf("shm get before: %v, %d leases", err, shm.Stats().Leases)
	}

	if n := tcp.CloseRevoked(); n != 0 {
		t.Fatalf("nothing changed, yet %d connections closed", n)
	}
	creds, _ := auth.Shared("keep")
	narrow, _ := auth.Shared("narrow")
	narrow[0].Principal = auth.Principal{Scopes: auth.Read}
	if err := tokens.SetCredentials(append(creds, narrow...)); err != nil {
		t.Fatal(err)
	}
	if n := tcp.CloseRevoked(); n != 2 {
		t.Errorf("TCP: %d connections closed, want 2 (drop's, and narrow's whose scopes changed)", n)
	}
	if n := shm.CloseRevoked(); n != 2 {
		t.Errorf("shared memory: %d clients closed, want 2", n)
	}
	testkit.WaitFor(t, "the revoked client's lease to end", func() bool { return shm.Stats().Leases == 0 })
	a.check(t)
	held.Release()

	if r, err := tcpc["drop"].Get(ctx, keys); err == nil {
		r.Release()
		t.Error("the dropped token still reads over TCP")
	}
	if r, err := shmc["drop"].Get(ctx, []prefixhash.Key{testKey(0)}); err == nil {
		r.Release()
		t.Error("the dropped token still reads over shared memory")
	}
	r, err := tcpc["keep"].Get(ctx, keys)
	if err != nil || r.Hits() != 2 {
		t.Fatalf("the kept token over TCP: %v", err)
	}
	r.Release()
	r, err = shmc["keep"].Get(ctx, []prefixhash.Key{testKey(0)})
	if err != nil || r.Hits() != 1 {
		t.Fatalf("the kept token over shared memory: %v", err)
	}
	r.Release()
	if st := tcp.Stats(); st.Revoked != 2 {
		t.Errorf("TCP stats: %d revoked, want 2", st.Revoked)
	}
}
