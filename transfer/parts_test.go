package transfer

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// claimSource is a scopeSource whose sink answers claims (block.ClaimCovered),
// recording the access each ran with.
type claimSource struct{ *scopeSource }

func (s claimSource) Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part, st []block.ClaimStatus) {
	s.note(ctx)
	for i := range st {
		st[i] = block.ClaimCovered
	}
}

// partTestBlock stores in src one whole block of a small split namespace
// and returns its key and a part of it.
func partTestBlock(t *testing.T, src *memSource) (prefixhash.Key, block.Part) {
	t.Helper()
	ns := prefixhash.Namespace{Model: "transfer/parts", DType: prefixhash.Float16, BlockTokens: 4, Layers: 2, KVHeads: 4, HeadDim: 8}
	b, k, err := block.Encode(nil, ns, ns.Root(), []uint32{1, 2, 3, 4}, testValue(1, ns.BlockBytes()))
	if err != nil {
		t.Fatal(err)
	}
	src.set(k, b)
	return k, block.Part{L0: 1, L1: 2, H0: 2, H1: 4}
}

// TestPartRequestScope: get-part and claim requests are scoped as gets and
// puts are: a tenant's run confined to its tag whatever its frames say, a
// node's as its frame says; a claim needs the write scope. The whole
// blocks a get-part request pinned are released once answered. Over TCP
// and shared memory.
func TestPartRequestScope(t *testing.T) {
	acme := auth.Principal{Tenant: "acme", Scopes: auth.Read, Tag: auth.TagOf("acme")}
	creds, _ := auth.Shared("node")
	creds = append(creds, auth.Credential{Sum: sha("acme"), Principal: acme})
	tokens, err := auth.NewCredentials(creds)
	if err != nil {
		t.Fatal(err)
	}
	src := claimSource{&scopeSource{memSource: newMemSource()}}
	key, part := partTestBlock(t, src.memSource)
	srv, err := NewServer(src, src, &ServerOptions{Tokens: tokens}, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	dialers := map[string]func(token string) PartPeer{
		"tcp": func(token string) PartPeer { return newClient(t, ln.String(), &ClientOptions{Token: token}) },
	}
	if runtime.GOOS == "linux" {
		shm, err := NewShmServer(src, src, &ShmServerOptions{Tokens: tokens}, quietLog)
		if err != nil {
			t.Fatal(err)
		}
		path := t.TempDir() + "/parts.sock"
		if err := shm.Listen(path); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shm.Close() })
		dialers["shm"] = func(token string) PartPeer {
			c, err := DialShm(context.Background(), path, &ShmClientOptions{Token: token})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
	}
	beta := auth.Access{Scoped: true, Tag: auth.TagOf("beta")}
	keys, parts := []prefixhash.Key{key}, []block.Part{part}
	for name, dial := range dialers {
		ctx := context.Background()
		p := dial("acme")
		r, err := p.GetParts(auth.WithAccess(ctx, beta), keys, parts)
		if err != nil {
			t.Fatalf("%s: tenant GetParts: %v", name, err)
		}
		if b, err := block.Decode(r.Values[0], 0); err != nil || b.Part != part {
			t.Fatalf("%s: the part read is %v, %v", name, b.Part, err)
		}
		r.Release()
		if a := src.last(t); a != acme.Access() {
			t.Errorf("%s: a tenant's part read ran with %+v, want %+v", name, a, acme.Access())
		}
		if _, err := p.Claim(ctx, keys, parts); !errors.Is(err, ErrAuth) {
			t.Errorf("%s: a read-only tenant's claim: %v, want ErrAuth", name, err)
		}
		p = dial("node")
		st, err := p.Claim(auth.WithAccess(ctx, beta), keys, parts)
		if err != nil || st[0] != block.ClaimCovered {
			t.Fatalf("%s: node claim: %v, %v", name, st, err)
		}
		if a := src.last(t); a != beta {
			t.Errorf("%s: a scoped claim ran with %+v", name, a)
		}
		src.mu.Lock()
		pins := src.pins
		src.mu.Unlock()
		if pins != 0 {
			t.Errorf("%s: %d whole blocks still pinned after part reads", name, pins)
		}
	}
}

// TestClaimWithoutClaimer: a server whose sink takes no claims answers a
// claim with an error frame (ErrRemote), over TCP and shared memory.
func TestClaimWithoutClaimer(t *testing.T) {
	src := newMemSource() // a Sink, not a Claimer
	key, part := partTestBlock(t, src)
	_, addr := startServer(t, src, nil)
	peers := map[string]PartPeer{"tcp": newClient(t, addr, nil)}
	if runtime.GOOS == "linux" {
		_, path := startShm(t, src, nil)
		peers["shm"] = dialShm(t, path, nil)
	}
	for name, p := range peers {
		_, err := p.Claim(context.Background(), []prefixhash.Key{key}, []block.Part{part})
		if !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "takes no claims") {
			t.Errorf("%s: claim of a server without claims: %v", name, err)
		}
	}
}
