package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// TestObjects: objects put through A (one piece and several, one pinned)
// are read through C, removed through B from every node, and refused with
// a clear error when their names or retention are bad.
func TestObjects(t *testing.T) {
	nodes := startClusterNodes(t, 3, func(_ int, o *Options) { o.Tiers.MaxRetentionTTL = time.Hour })
	a, b, c := nodes[0], nodes[1], nodes[2]
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(33, 33))
	var names []string
	var values [][]byte
	for i := range 10 {
		v := make([]byte, 1+rng.IntN(300<<10))
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		names, values = append(names, fmt.Sprintf("model@tp0@%04d", i)), append(values, v)
	}
	keys, err := a.client.Put(ctx, clusterNS, client.Prompt{Names: names}, values, client.PieceBytes(64<<10))
	if err != nil || keys[3] != prefixhash.ObjectKey(clusterNS.Root(), names[3]) {
		t.Fatalf("Put of objects: %v (key %x)", err, keys[3])
	}
	names = append(names, "absent")
	check := func(who string, cl *client.Client) {
		t.Helper()
		got := 0
		_, err := cl.Get(ctx, clusterNS, client.Prompt{Names: names}, client.Each(func(b client.Block) error {
			if b.Index == len(values) {
				if b.Found {
					return errors.New("absent object found")
				}
				return nil
			}
			if !b.Found || !bytes.Equal(b.Payload, values[b.Index]) {
				return fmt.Errorf("object %d (%d bytes): found %v, %d bytes", b.Index, len(values[b.Index]), b.Found, len(b.Payload))
			}
			got++
			return nil
		}))
		if err != nil || got != len(values) {
			t.Fatalf("Get of objects through %s: %d of %d, %v", who, got, len(values), err)
		}
		// Into the caller's buffers: each must hold its value.
		bufs := make([][]byte, len(names))
		for i := range bufs {
			bufs[i] = make([]byte, 300<<10)
		}
		bufs[0] = bufs[0][:len(values[0])-1]
		blocks, err := cl.Get(ctx, clusterNS, client.Prompt{Names: names}, client.Into(bufs))
		var ie client.ItemErrors
		if !errors.As(err, &ie) || ie[0] == nil || ie[1] != nil || len(blocks) != len(names) || blocks[0].Found ||
			!bytes.Equal(blocks[2].Payload, values[2]) || &blocks[2].Payload[0] != &bufs[2][0] || blocks[len(values)].Found {
			t.Fatalf("Get of objects Into through %s: %v", who, err)
		}
	}
	// Reads go to the owners, which A's pushes reach in the background
	// (A keeps copies only while it has room for them).
	flush := func() {
		for _, n := range nodes {
			if err := n.cluster.cluster.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	flush()
	check("A", a.client)
	check("C", c.client)

	// A second put keeps the first value; an upsert replaces it.
	if _, err := b.client.Put(ctx, clusterNS, client.Prompt{Names: names[:1]}, [][]byte{[]byte("new")}); err != nil {
		t.Fatalf("put again: %v", err)
	}
	if _, err := b.client.Put(ctx, clusterNS, client.Prompt{Names: names[1:2]}, [][]byte{[]byte("new")}, client.Upsert()); err != nil {
		t.Fatalf("upsert: %v", err)
	}
	values[1] = []byte("new")
	flush()
	check("C after the upsert", c.client)

	// Removed through B: gone from every node, copies included.
	found, err := b.client.Remove(ctx, clusterNS, client.Prompt{Names: names[:3]})
	if err != nil || !found[0] || !found[2] {
		t.Fatalf("Remove: %v %v", found, err)
	}
	for _, n := range nodes {
		blocks, err := n.client.Get(ctx, clusterNS, client.Prompt{Names: names[:3]})
		if err != nil || len(blocks) != 3 || blocks[0].Found || blocks[1].Found || blocks[2].Found {
			t.Fatalf("removed objects through %s: %v", n.ID(), err)
		}
	}

	// Bad input: a clear error per object, the others stored.
	bad := []string{"", strings.Repeat("n", prefixhash.MaxObjectName+1), "bad\xff", "ok"}
	keys, err = a.client.Put(ctx, clusterNS, client.Prompt{Names: bad}, [][]byte{[]byte("x"), nil, nil, []byte("y")})
	var ie client.ItemErrors
	if !errors.As(err, &ie) || !errors.Is(ie[0], client.ErrInvalid) || !errors.Is(ie[1], client.ErrInvalid) || !errors.Is(ie[2], client.ErrInvalid) ||
		ie[3] != nil || !keys[0].IsZero() || keys[3].IsZero() {
		t.Fatalf("bad names: %v", err)
	}
	// A TTL over the node's limit: InvalidArgument.
	_, err = a.client.Put(ctx, clusterNS, client.Prompt{Names: []string{"ttl"}}, [][]byte{[]byte("z")},
		client.Retention(block.Retention{TTL: 2 * time.Hour}))
	if !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("TTL over the limit: %v", err)
	}
	// Objects are not blocks: Lookup and View refuse them, Put refuses
	// object options for blocks.
	if _, err := a.client.Lookup(ctx, clusterNS, client.Prompt{Names: []string{"x"}}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Lookup of names: %v", err)
	}
	tokens, payloads := clusterPrompt(9, 1)
	if _, err := a.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads, client.Upsert()); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Put of blocks with Upsert: %v", err)
	}
}

// TestRetention pins an object and a prompt's prefix through the client,
// sees the pin in BlockInfo, and is refused past the node's limits.
func TestRetention(t *testing.T) {
	nodes := startClusterNodes(t, 1, func(_ int, o *Options) { o.Tiers.MaxPinnedFraction = 0.01; o.Tiers.MaxRetentionTTL = time.Hour })
	a := nodes[0]
	ctx := context.Background()
	if _, err := a.client.Put(ctx, clusterNS, client.Prompt{Names: []string{"pinned"}}, [][]byte{[]byte("v")},
		client.Retention(block.Retention{Pin: block.PinHard})); err != nil {
		t.Fatalf("put pinned: %v", err)
	}
	info, err := a.client.BlockInfo(ctx, prefixhash.ObjectKey(clusterNS.Root(), "pinned"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := kvmeshv1.NewAdminServiceClient(conn).BlockInfo(ctx, &kvmeshv1.BlockInfoRequest{Key: keyBytes(prefixhash.ObjectKey(clusterNS.Root(), "pinned"))})
	if err != nil || !raw.GetObject() || raw.GetObjectName() != "pinned" || raw.GetRetention().GetPin() != kvmeshv1.Pin_PIN_HARD {
		t.Fatalf("BlockInfo of the pinned object: %v %v (client: %+v)", raw, err, info)
	}
	tokens, payloads := clusterPrompt(5, 4)
	if _, err := a.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	soft := block.Retention{Pin: block.PinSoft, TTL: time.Minute}
	applied, err := a.client.Retain(ctx, clusterNS, client.Prompt{Names: []string{"pinned", "absent"}}, soft)
	if err != nil || len(applied) != 2 || !applied[0] || applied[1] {
		t.Fatalf("Retain of objects: %v %v", applied, err)
	}
	applied, err = a.client.Retain(ctx, clusterNS, client.Prompt{Tokens: tokens}, soft)
	if err != nil || len(applied) != 4 || !applied[3] {
		t.Fatalf("Retain of a prefix: %v %v", applied, err)
	}
	// 1% of 160 MiB: a hard pin of the prompt's blocks passes it after a
	// few megabytes of objects.
	big := make([]byte, 1<<20)
	err = nil
	for i := 0; i < 4 && err == nil; i++ {
		_, err = a.client.Put(ctx, clusterNS, client.Prompt{Names: []string{fmt.Sprintf("big%d", i)}}, [][]byte{big},
			client.Retention(block.Retention{Pin: block.PinHard}), client.PieceBytes(256<<10))
	}
	var ie client.ItemErrors
	if !errors.As(err, &ie) || !errors.Is(err, client.ErrExhausted) {
		t.Fatalf("pins past the node's share: %v", err)
	}
	_, err = a.client.Retain(ctx, clusterNS, client.Prompt{Names: []string{"pinned"}}, block.Retention{TTL: 2 * time.Hour})
	if status.Code(errors.Unwrap(err)) != codes.InvalidArgument && !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Retain with a TTL over the limit: %v", err)
	}
}
