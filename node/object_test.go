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
	nodes := startClusterNodes(t, 3, func(_ int, o *Options) { o.MaxRetentionTTL = time.Hour })
	a, b, c := nodes[0], nodes[1], nodes[2]
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(33, 33))
	var objs []client.Object
	for i := range 10 {
		v := make([]byte, 1+rng.IntN(300<<10))
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		objs = append(objs, client.Object{Name: fmt.Sprintf("model@tp0@%04d", i), Value: v})
	}
	errs, err := a.client.PutObjects(ctx, clusterNS, objs, client.PieceBytes(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("object %d: %v", i, e)
		}
	}
	names := make([]string, len(objs))
	for i, o := range objs {
		names[i] = o.Name
	}
	names = append(names, "absent")
	check := func(who string, cl *client.Client) {
		t.Helper()
		got := 0
		err := cl.GetObjects(ctx, clusterNS, names, func(v client.ObjectValue) error {
			if v.Index == len(objs) {
				if v.Found {
					return errors.New("absent object found")
				}
				return nil
			}
			if !v.Found || !bytes.Equal(v.Value, objs[v.Index].Value) {
				return fmt.Errorf("object %d (%d bytes): found %v, %d bytes", v.Index, len(objs[v.Index].Value), v.Found, len(v.Value))
			}
			got++
			return nil
		})
		if err != nil || got != len(objs) {
			t.Fatalf("GetObjects through %s: %d of %d, %v", who, got, len(objs), err)
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
	if errs, err := b.client.PutObjects(ctx, clusterNS, []client.Object{{Name: objs[0].Name, Value: []byte("new")}}); err != nil || errs[0] != nil {
		t.Fatalf("put again: %v %v", errs, err)
	}
	if errs, err := b.client.PutObjects(ctx, clusterNS, []client.Object{{Name: objs[1].Name, Value: []byte("new")}}, client.Upsert()); err != nil || errs[0] != nil {
		t.Fatalf("upsert: %v %v", errs, err)
	}
	objs[1].Value = []byte("new")
	flush()
	check("C after the upsert", c.client)

	// Removed through B: gone from every node, copies included.
	found, err := b.client.RemoveObjects(ctx, clusterNS, names[:3])
	if err != nil || !found[0] || !found[2] {
		t.Fatalf("RemoveObjects: %v %v", found, err)
	}
	for _, n := range nodes {
		err := n.client.GetObjects(ctx, clusterNS, names[:3], func(v client.ObjectValue) error {
			if v.Found {
				return fmt.Errorf("removed object %d found through %s", v.Index, n.ID())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	// Bad input: a clear error per object, the others stored.
	bad := []client.Object{{Name: "", Value: []byte("x")}, {Name: strings.Repeat("n", prefixhash.MaxObjectName+1)}, {Name: "bad\xff"}, {Name: "ok", Value: []byte("y")}}
	errs, err = a.client.PutObjects(ctx, clusterNS, bad)
	if err != nil || !errors.Is(errs[0], client.ErrInvalid) || !errors.Is(errs[1], client.ErrInvalid) || !errors.Is(errs[2], client.ErrInvalid) || errs[3] != nil {
		t.Fatalf("bad names: %v %v", errs, err)
	}
	// A TTL over the node's limit: InvalidArgument.
	errs, err = a.client.PutObjects(ctx, clusterNS, []client.Object{{Name: "ttl", Value: []byte("z")}},
		client.WithRetention(block.Retention{TTL: 2 * time.Hour}))
	if err != nil || !errors.Is(errs[0], client.ErrInvalid) {
		t.Fatalf("TTL over the limit: %v %v", errs, err)
	}
}

// TestRetention pins an object and a prompt's prefix through the client,
// sees the pin in BlockInfo, and is refused past the node's limits.
func TestRetention(t *testing.T) {
	nodes := startClusterNodes(t, 1, func(_ int, o *Options) { o.MaxPinnedFraction = 0.01; o.MaxRetentionTTL = time.Hour })
	a := nodes[0]
	ctx := context.Background()
	if errs, err := a.client.PutObjects(ctx, clusterNS, []client.Object{{Name: "pinned", Value: []byte("v")}},
		client.WithRetention(block.Retention{Pin: block.PinHard})); err != nil || errs[0] != nil {
		t.Fatalf("put pinned: %v %v", errs, err)
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
	if _, err := a.client.Put(ctx, clusterNS, tokens, payloads); err != nil {
		t.Fatal(err)
	}
	applied, err := a.client.Retain(ctx, clusterNS, client.Retained{Objects: []string{"pinned", "absent"}, Tokens: tokens},
		block.Retention{Pin: block.PinSoft, TTL: time.Minute})
	if err != nil || len(applied) != 6 || !applied[0] || applied[1] || !applied[5] {
		t.Fatalf("Retain: %v %v", applied, err)
	}
	// 1% of 160 MiB: a hard pin of the prompt's blocks passes it after a
	// few megabytes of objects.
	big := make([]byte, 1<<20)
	var errs []error
	for i := 0; i < 4 && (errs == nil || errs[0] == nil); i++ {
		errs, err = a.client.PutObjects(ctx, clusterNS, []client.Object{{Name: fmt.Sprintf("big%d", i), Value: big}},
			client.WithRetention(block.Retention{Pin: block.PinHard}), client.PieceBytes(256<<10))
		if err != nil {
			t.Fatal(err)
		}
	}
	if !errors.Is(errs[0], client.ErrExhausted) {
		t.Fatalf("pins past the node's share: %v", errs)
	}
	_, err = a.client.Retain(ctx, clusterNS, client.Retained{Objects: []string{"pinned"}}, block.Retention{TTL: 2 * time.Hour})
	if status.Code(errors.Unwrap(err)) != codes.InvalidArgument && !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Retain with a TTL over the limit: %v", err)
	}
}
