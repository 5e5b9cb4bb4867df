package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestWarmRestart: a lone node whose blocks are all in DRAM is stopped with
// SIGTERM and restarted on its data dir: it serves every block again, byte
// for byte, since the stop wrote DRAM to NVMe (and said so in its log).
// kill -9 keeps its meaning: what only DRAM held is gone.
func TestWarmRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dataDir := t.TempDir()
	flags := []string{"--dram", "64MiB", "--nvme", "512MiB", "--max-block-bytes", "1MiB"}
	ctx := context.Background()
	const prompts, blocks = 6, 16 // 96 blocks of 512 KiB: 48 MiB, most of DRAM

	put := func(c *client.Client, seed int) (tokens [][]uint32, payloads map[prefixhash.Key][]byte) {
		payloads = map[prefixhash.Key][]byte{}
		for p := range prompts {
			tk, pl := e2ePrompt(seed+p, blocks)
			keys, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: tk}, pl)
			if err != nil {
				t.Fatal(err)
			}
			for i, k := range keys {
				payloads[k] = pl[i]
			}
			tokens = append(tokens, tk)
		}
		return tokens, payloads
	}
	cached := func(c *client.Client, tokens [][]uint32) int {
		n := 0
		for _, tk := range tokens {
			l, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: tk})
			if err != nil {
				t.Fatal(err)
			}
			n += l.CachedBlocks
		}
		return n
	}

	d := startDaemon(t, dataDir, flags...)
	c := dialNode(t, d)
	tokens, payloads := put(c, 10)
	if n, _, _ := tierStats(t, c, "nvme"); n != 0 {
		t.Fatalf("%d blocks on NVMe before the stop; the test wants them all in DRAM", n)
	}
	if _, err := d.stop(t); err != nil {
		t.Fatalf("stop: %v\n%s", err, d.stderr)
	}
	if log := d.stderr.String(); !strings.Contains(log, "wrote DRAM to NVMe") {
		t.Fatalf("the stop's log does not say it wrote DRAM to NVMe:\n%s", log)
	}

	d = startDaemon(t, dataDir, flags...)
	c = dialNode(t, d)
	if n := cached(c, tokens); n != prompts*blocks {
		t.Fatalf("after a graceful restart, %d of %d blocks cached\n%s", n, prompts*blocks, d.stderr)
	}
	keys := make([]prefixhash.Key, 0, len(payloads))
	for k := range payloads {
		keys = append(keys, k)
	}
	got := 0
	_, err := c.Get(ctx, e2eNS, client.Prompt{Keys: keys}, client.Each(func(b client.Block) error {
		if !b.Found || !bytes.Equal(b.Payload, payloads[b.Key]) {
			return fmt.Errorf("block %s: found %v, bytes equal %v", b.Key, b.Found, bytes.Equal(b.Payload, payloads[b.Key]))
		}
		got++
		return nil
	}))
	if err != nil || got != len(keys) {
		t.Fatalf("after a graceful restart: %d of %d blocks read back, %v", got, len(keys), err)
	}

	// kill -9: nothing is written; the blocks only DRAM held are gone,
	// those on NVMe stay.
	fresh, _ := put(c, 20)
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	d = startDaemon(t, dataDir, flags...)
	c = dialNode(t, d)
	if n := cached(c, fresh); n == prompts*blocks {
		t.Fatalf("after kill -9, all %d blocks that only DRAM held are still cached", n)
	}
	if n := cached(c, tokens); n != prompts*blocks {
		t.Fatalf("after kill -9, %d of the %d blocks on NVMe are cached", n, prompts*blocks)
	}
	if _, err := d.stop(t); err != nil {
		t.Fatalf("stop: %v\n%s", err, d.stderr)
	}
}
