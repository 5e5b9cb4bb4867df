package main

// The fault suite: what a node does when things break, each test bounded in
// time and asserting the contract of DESIGN.md (faults are misses within the
// deadline, never errors or hangs; nothing wrong is ever served; the node
// keeps serving). Run them all with
//
//	go test -race -run 'Fault|Crash|Partition|ClusterProcesses' ./...
//
//	fault                        test (package)
//	SIGKILL of a node under load TestClusterProcesses (cmd/kvmesh)
//	SIGKILL during NVMe writes   TestNVMeCrash (tiers): every acknowledged block recovered, nothing torn served
//	corrupt bytes in a segment   TestFaultCorruptSegment (cmd/kvmesh)
//	disk full                    TestFaultDiskFull (cmd/kvmesh; Linux, root: a tmpfs data dir)
//	a slow (stopped) peer        TestFaultSlowPeer (cmd/kvmesh)
//	a network partition          TestClusterPartition (cmd/kvmesh; Linux, root: network namespaces)
//	faulty peers, in process     TestClusterFaultyPeersAreMisses (store), TestCacheFaultsAreMisses (prefill)
//
// Tests that need root or a Linux facility skip with a message saying so.

import (
	"bytes"
	"context"
	bin "encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// segRecord is one record found in an NVMe segment file: where its value
// is, and the key its header names (tiers/segment.go: value, padding, then
// a 64-byte header, "KVNR" first, the key at byte 16, the value's length at
// byte 32, ending on a 4 KiB boundary).
type segRecord struct {
	valueOff int64
	valueLen int64
	key      prefixhash.Key
}

func segRecords(b []byte) []segRecord {
	var out []segRecord
	for end := int64(4096); end <= int64(len(b)); end += 4096 {
		h := b[end-64 : end]
		if string(h[:4]) != "KVNR" {
			continue
		}
		n := int64(bin.LittleEndian.Uint64(h[32:40]))
		start := end - ((n+64+4095)/4096)*4096
		if n <= 0 || start < 0 {
			continue
		}
		var k prefixhash.Key
		copy(k[:], h[16:32])
		out = append(out, segRecord{valueOff: start, valueLen: n, key: k})
	}
	return out
}

// TestFaultCorruptSegment: bytes of a stopped node's NVMe segment file are
// corrupted — one byte in every other block's value. Restarted, the node
// detects each damaged block, drops it and answers it as a miss; every
// other block is served byte for byte; the node keeps serving.
func TestFaultCorruptSegment(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dataDir := t.TempDir()
	flags := []string{"--dram", "8MiB", "--nvme", "256MiB", "--max-block-bytes", "1MiB", "--shm-socket", "off"}
	d := startDaemon(t, dataDir, flags...)
	c := dialNode(t, d)
	ctx := context.Background()
	payloadOf := map[prefixhash.Key][]byte{}
	onDisk := map[prefixhash.Key]bool{}
	var prompts [][]uint32
	for p := range 10 { // 40 blocks of 512 KiB: most spill to NVMe
		tokens, payloads := e2ePrompt(300+p, 4)
		if _, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatal(err)
		}
		for i, k := range prefixhash.Keys(e2eNS, tokens) {
			payloadOf[k] = payloads[i]
		}
		prompts = append(prompts, tokens)
	}
	for _, tokens := range prompts { // Lookup tells tiers without moving blocks
		l, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range l.Blocks() {
			if b.Tier == "nvme" {
				onDisk[b.Key] = true
			}
		}
	}
	if _, err := d.stop(t); err != nil {
		t.Fatalf("stop: %v\n%s", err, d.stderr)
	}

	segs, _ := filepath.Glob(filepath.Join(dataDir, "nvme", "segments", "*.seg"))
	corrupt := map[prefixhash.Key]bool{}
	for _, path := range segs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range segRecords(b) {
			if !onDisk[r.key] {
				continue
			}
			if n%2 == 0 {
				b[r.valueOff+r.valueLen/2] ^= 0x5a
				corrupt[r.key] = true
			}
			n++
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(corrupt) == 0 || len(corrupt) == len(onDisk) {
		t.Fatalf("corrupted %d of the %d blocks on NVMe (segments %v); the test needs some of each", len(corrupt), len(onDisk), segs)
	}

	d2 := startDaemon(t, dataDir, flags...)
	c2 := dialNode(t, d2)
	keys := make([]prefixhash.Key, 0, len(onDisk))
	for k := range onDisk {
		keys = append(keys, k)
	}
	var hits, misses int
	blocks, err := c2.Get(ctx, e2eNS, client.Prompt{Keys: keys})
	for _, b := range blocks {
		switch {
		case err != nil:
		case b.Found && corrupt[b.Key]:
			err = fmt.Errorf("block %s was corrupted on disk and was served", b.Key)
		case b.Found && !bytes.Equal(b.Payload, payloadOf[b.Key]):
			err = fmt.Errorf("block %s served with other bytes than were put", b.Key)
		case !b.Found && !corrupt[b.Key]:
			err = fmt.Errorf("block %s was intact on disk and is missing", b.Key)
		case b.Found:
			hits++
		default:
			misses++
		}
	}
	if err != nil || misses != len(corrupt) || hits != len(onDisk)-len(corrupt) {
		t.Fatalf("after the restart: %d hits, %d misses, %v; want %d misses (the corrupted blocks)\n%s", hits, misses, err, len(corrupt), d2.stderr)
	}
	// Detected: dropped by the tier's recovery check, or by the store's
	// verification on read; each read of one was a miss.
	dropped := 0
	if m := regexp.MustCompile(`dropped_entries=(\d+)`).FindStringSubmatch(d2.stderr.String()); m != nil {
		dropped, _ = strconv.Atoi(m[1])
	}
	body := scrapeMetrics(t, d2.http)
	corruptDrops := metricOf(body, "kvmesh_cache_corrupt_drops_total")
	if dropped+int(corruptDrops) < len(corrupt) || metricOf(body, "kvmesh_cache_misses_total") < float64(len(corrupt)) {
		t.Errorf("corruption not counted: recovery dropped %d, kvmesh_cache_corrupt_drops_total %v, misses %v; want %d",
			dropped, corruptDrops, metricOf(body, "kvmesh_cache_misses_total"), len(corrupt))
	}
	tokens, payloads := e2ePrompt(399, 2)
	if _, err := c2.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatalf("Put after the restart: %v", err)
	}
	if got, err := c2.Get(ctx, e2eNS, client.Prompt{Tokens: tokens}); err != nil || len(got) != 2 {
		t.Fatalf("Get after the restart: %d blocks, %v", len(got), err)
	}
	t.Logf("%d blocks on NVMe, %d corrupted: all detected (%d at recovery, %d on read), the rest served", len(onDisk), len(corrupt), dropped, int(corruptDrops))
	if _, err := d2.stop(t); err != nil {
		t.Fatalf("stop: %v\n%s", err, d2.stderr)
	}
}

// metricOf returns a series' value in a /metrics text, -1 when absent.
func metricOf(body, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

// TestFaultSlowPeer: a node stops answering (SIGSTOP: its sockets stay
// open, nothing is read or written) in the middle of a stream of lookups
// and gets through another node. Every call answers within its deadline,
// with misses for the blocks the stopped node holds and the right bytes for
// the rest; once it resumes (SIGCONT) the cluster is whole again and its
// blocks are hits.
func TestFaultSlowPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two kvmesh processes")
	}
	a := startDaemon(t, t.TempDir(), clusterFlags...)
	b := startDaemon(t, t.TempDir(), append(clusterFlags, "--join", a.gossip)...)
	ca, cb := dialNode(t, a), dialNode(t, b)
	waitMembers(t, ca, 2, a, b)
	ctx := context.Background()
	const prompts, blocks = 6, 8 // two chunks each
	tokens, payloads := make([][]uint32, prompts), make([][][]byte, prompts)
	for p := range prompts {
		// Through B: B keeps every block, A only the chunks it owns.
		tokens[p], payloads[p] = e2ePrompt(500+p, blocks)
		if _, err := cb.Put(ctx, e2eNS, client.Prompt{Tokens: tokens[p]}, payloads[p]); err != nil {
			t.Fatal(err)
		}
	}
	onB := 0
	for p := range prompts {
		waitFullHit(t, ca, tokens[p], blocks)
		l, err := ca.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens[p]})
		if err != nil {
			t.Fatal(err)
		}
		for _, blk := range l.Blocks() {
			if blk.NodeID == b.id {
				onB++
			}
		}
	}
	if onB == 0 {
		t.Fatal("B owns none of the blocks: the test needs some")
	}

	var stopped atomic.Bool
	stream := newLookupStream([]*client.Client{ca, ca}, tokens, payloads, 3*time.Second)
	stream.missedWhile = stopped.Load
	end := time.Now().Add(60 * time.Second)
	stream.start(end)
	stream.waitFor(end, func() bool { return stream.calls.Load() >= 20 })
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped.Store(true)
	before := stream.calls.Load()
	// Through the calls that wait for B and find it slow, and those after
	// A gave up on it (backoff, then gossip declaring it dead).
	stream.waitFor(end, func() bool { return stream.calls.Load() >= before+40 })
	stream.finish(t, a, b)
	if stream.missed.Load() == 0 {
		t.Fatal("no call missed while B was stopped: B's blocks must be misses")
	}
	t.Logf("%d calls while B was stopped, %d missed part of their prompt; slowest call %v (deadline %v)",
		stream.calls.Load()-before, stream.missed.Load(), time.Duration(stream.slowest.Load()), stream.deadline)

	if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, ca, 2, a, b)
	for p := range prompts {
		waitFullHit(t, ca, tokens[p], blocks)
	}
	for _, d := range []*daemon{a, b} {
		if _, err := d.stop(t); err != nil {
			t.Errorf("%s: exit %v\n%s", d.id, err, d.stderr)
		}
	}
}
