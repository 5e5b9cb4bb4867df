package main

import (
	"context"
	"strconv"
	"testing"

	"github.com/kvmesh/kvmesh/client"
)

// TestServeMaxBlocks: --max-blocks bounds what a node caches in DRAM and
// NVMe together, however much room the tiers have (the trace replay relies
// on it to give each node its share of the capacity).
func TestServeMaxBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	// 512 KiB blocks: DRAM holds a handful, NVMe hundreds; the bound is 12.
	const maxBlocks = 12
	d := startDaemon(t, t.TempDir(), "--dram", "4MiB", "--nvme", "256MiB", "--max-block-bytes", "1MiB",
		"--max-blocks", strconv.Itoa(maxBlocks))
	ctx := context.Background()
	c, err := client.Dial(d.grpcAddr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const prompts, blocks = 10, 6
	var last []uint32
	for p := range prompts {
		tokens, payloads := e2ePrompt(p, blocks)
		if _, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatalf("Put prompt %d: %v\n%s", p, err, d.stderr)
		}
		last = tokens
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var held int64
		for _, tier := range st.Tiers {
			held += tier.Blocks
		}
		if held > maxBlocks {
			t.Fatalf("after prompt %d the node holds %d blocks (tiers %v), over --max-blocks %d", p, held, st.Tiers, maxBlocks)
		}
	}
	if l, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: last}); err != nil || l.CachedBlocks == 0 {
		t.Fatalf("Lookup of the last prompt = %+v, %v: want it cached", l, err)
	}
}
