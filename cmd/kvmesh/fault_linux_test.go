//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// tierStats returns a tier's blocks and bytes as the node's Stats report
// them.
func tierStats(t *testing.T, c *client.Client, tier string) (blocks, bytes, capacity uint64) {
	t.Helper()
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range st.Tiers {
		if ti.Name == tier {
			return uint64(ti.Blocks), uint64(ti.Bytes), uint64(ti.CapacityBytes)
		}
	}
	t.Fatalf("no tier %s in %+v", tier, st.Tiers)
	return 0, 0, 0
}

// TestFaultDiskFull: the node's data dir is a small filesystem (a tmpfs of
// 400 MiB: room for one segment and the NVMe tier's headroom) that another
// writer fills to the last byte while the node holds blocks on it. Writes
// go on: each is stored (DRAM makes room by dropping its coldest blocks,
// since nothing can be demoted) or refused with ResourceExhausted, never
// another error; the node never crashes, keeps within its DRAM limit,
// serves the newest blocks from DRAM byte for byte and never serves wrong
// bytes. Once the space comes back it spills to NVMe again.
func TestFaultDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=400m,mode=0700", "kvmesh-disk-full", dir).CombinedOutput(); err != nil {
		t.Skipf("disk-full test skipped: cannot mount a small tmpfs as the data dir (it needs root, or CAP_SYS_ADMIN): %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s; detaching it", dir, err, out)
			exec.Command("umount", "-l", dir).Run()
		}
	}) // registered first: runs after the daemon is killed
	d := startDaemon(t, dir, "--dram", "8MiB", "--nvme", "256MiB", "--max-block-bytes", "1MiB")
	c := dialNode(t, d)
	ctx := context.Background()
	payloadOf := map[prefixhash.Key][]byte{}
	var prompts [][]uint32
	put := func(p int) error {
		tokens, payloads := e2ePrompt(700+p, 4)
		_, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads)
		if err == nil {
			for i, k := range prefixhash.Keys(e2eNS, tokens) {
				payloadOf[k] = payloads[i]
			}
			prompts = append(prompts, tokens)
		}
		return err
	}
	for p := range 10 { // 20 MiB: blocks spill to NVMe
		if err := put(p); err != nil {
			t.Fatal(err)
		}
	}
	if blocks, _, _ := tierStats(t, c, "nvme"); blocks == 0 {
		t.Fatalf("no block on NVMe before the disk fills\n%s", d.stderr)
	}

	// Fill the filesystem to the last byte.
	ballast := filepath.Join(dir, "ballast")
	f, err := os.Create(ballast)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("ballast: %v", err)
			}
			break
		}
	}
	f.Close()

	// Writes go on: 40 prompts, 80 MiB, ten times DRAM.
	stored, refused := 0, 0
	for p := 10; p < 50; p++ {
		switch err := put(p); {
		case err == nil:
			stored++
		case status.Code(errors.Unwrap(err)) == codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("Put of prompt %d on a full disk: %v; want success or ResourceExhausted\n%s", p, err, d.stderr)
		}
	}
	select {
	case <-d.exited:
		t.Fatalf("the node died on a full disk: %v\n%s", d.exitErr, d.stderr)
	default:
	}
	if _, b, capacity := tierStats(t, c, "dram"); b > capacity {
		t.Fatalf("DRAM holds %d bytes, over its %d", b, capacity)
	}
	if stored == 0 {
		t.Fatalf("every write on a full disk was refused (%d)", refused)
	}
	// The newest prompt is a full hit from DRAM; every block read is right.
	last := prompts[len(prompts)-1]
	if got, err := c.Get(ctx, e2eNS, client.Prompt{Tokens: last}); err != nil || len(got) != 4 {
		t.Fatalf("the newest prompt on a full disk: %d of 4 blocks, %v", len(got), err)
	}
	hits := 0
	for _, tokens := range prompts {
		got, err := c.Get(ctx, e2eNS, client.Prompt{Tokens: tokens})
		if err != nil {
			t.Fatalf("Get on a full disk: %v", err)
		}
		for _, b := range got {
			if !bytes.Equal(b.Payload, payloadOf[b.Key]) {
				t.Fatalf("block %s served with other bytes than were put", b.Key)
			}
			hits++
		}
	}
	t.Logf("on a full disk: %d writes stored, %d refused; %d blocks still served", stored, refused, hits)

	// Space comes back: blocks spill to NVMe again.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for p := 50; ; p++ {
		if err := put(p); err != nil {
			t.Fatalf("Put after the disk emptied: %v", err)
		}
		if blocks, _, _ := tierStats(t, c, "nvme"); blocks > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no block spilled to NVMe 30s after the disk emptied\n%s", d.stderr)
		}
	}
	if _, err := d.stop(t); err != nil {
		t.Fatalf("stop: %v\n%s", err, d.stderr)
	}
}
