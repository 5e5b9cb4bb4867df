package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
)

// TestInspectObjects: objects put by a client are shown by name (size,
// pieces, tier), pinned and unpinned with inspect retain.
func TestInspectObjects(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	d := startDaemon(t, t.TempDir(), "--dram", "32MiB", "--nvme", "0", "--max-block-bytes", "1MiB")
	c, err := client.Dial(d.grpcAddr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Put(ctx, objectNamespace, client.Prompt{Names: []string{"k1"}}, [][]byte{make([]byte, 300<<10)}, client.PieceBytes(128<<10)); err != nil {
		t.Fatalf("Put of an object: %v", err)
	}
	var objs []objectJSON
	if err := json.Unmarshal(kvmesh(t, "inspect", "--addr", d.grpcAddr, "-o", "json", "object", "k1", "absent"), &objs); err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || !objs[0].Found || objs[0].Size != 300<<10 || objs[0].Pieces != 3 || objs[0].Tier != "dram" || objs[0].Pin != "" || objs[1].Found {
		t.Fatalf("inspect object: %+v", objs)
	}
	var r retainJSON
	if err := json.Unmarshal(kvmesh(t, "inspect", "--addr", d.grpcAddr, "-o", "json", "retain", "--object", "k1", "--pin", "hard", "--ttl", "1h"), &r); err != nil {
		t.Fatal(err)
	}
	if !r.Objects["k1"] {
		t.Fatalf("inspect retain: %+v", r)
	}
	if err := json.Unmarshal(kvmesh(t, "inspect", "--addr", d.grpcAddr, "-o", "json", "object", "k1"), &objs); err != nil {
		t.Fatal(err)
	}
	if objs[0].Pin != block.PinHard.String() || objs[0].TTLMillis <= 0 {
		t.Fatalf("after retain: %+v", objs)
	}
}
