package store

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
)

// TestNodeWideReclaims: a tenant writes first, with its own tag, under the
// keys and namespace digest of a node-wide prompt (neither is salted, so
// anyone can compute them). A node-wide reader is not served those blocks,
// a node-wide write of the same prompt takes the keys and the namespace
// back (the tenant's blocks are dropped), and from then on the tenant's
// writes there are refused.
func TestNodeWideReclaims(t *testing.T) {
	ns := blocktest.NS()
	l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 256, 1024)})
	acme := auth.Access{Scoped: true, Tag: auth.TagOf("acme")}
	tenantCtx := auth.WithAccess(context.Background(), acme)
	nodeCtx := auth.WithAccess(context.Background(), auth.NodeWide)

	tokens := make([]uint32, ns.BlockTokens)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	real := bytes.Repeat([]byte{1}, ns.BlockBytes())
	forged := bytes.Repeat([]byte{0x66}, ns.BlockBytes())
	planted, key, err := block.EncodeTenant(nil, acme.Tag, ns, ns.Root(), tokens, forged)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Put(tenantCtx, planted); err != nil {
		t.Fatalf("the tenant's plant: %v", err)
	}
	if _, err := l.Get(nodeCtx, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a node-wide reader was served the tenant's block under a node-wide key: %v", err)
	}

	good, key2, err := block.Encode(nil, ns, ns.Root(), tokens, real)
	if err != nil || key2 != key {
		t.Fatal(err)
	}
	if err := l.Put(nodeCtx, good); err != nil {
		t.Fatalf("the node-wide write under keys a tenant wrote first: %v", err)
	}
	r, err := l.Get(nodeCtx, key)
	if err != nil {
		t.Fatalf("node-wide read after the reclaim: %v", err)
	}
	if !bytes.Equal(r.Bytes(), good) {
		t.Fatal("the node-wide reader got other bytes")
	}
	r.Release()
	if st := l.Stats(); st.NamespaceDrops != 1 {
		t.Errorf("%d blocks dropped for the reclaim, want the tenant's one", st.NamespaceDrops)
	}
	// The tenant can no longer write there.
	tokens[0] = 99
	again, _, err := block.EncodeTenant(nil, acme.Tag, ns, ns.Root(), tokens, forged)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Put(tenantCtx, again); !errors.Is(err, ErrTenant) {
		t.Fatalf("a tenant's write under a node-wide namespace: %v, want ErrTenant", err)
	}
}
