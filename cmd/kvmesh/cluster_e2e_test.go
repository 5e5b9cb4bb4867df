package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// clusterFlags are the flags of every node of the multi-process tests:
// small tiers (so that blocks spill to NVMe), fast failure detection, short
// remote deadlines.
var clusterFlags = []string{"--dram", "8MiB", "--nvme", "256MiB", "--max-block-bytes", "1MiB", "--max-batch-blocks", "256",
	"--gossip-profile", "local", "--lookup-timeout", "200ms", "--get-timeout", "1s", "--peer-backoff", "500ms",
	"--chunk-tokens", "64", "--shutdown-timeout", "5s"}

// e2eChunkBlocks is C for e2eNS (16 tokens per block) and --chunk-tokens 64.
const e2eChunkBlocks = 4

// waitMembers waits until the node c talks to sees want members alive.
func waitMembers(t *testing.T, c *client.Client, want int, logs ...*daemon) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := c.Members(ctx)
		cancel()
		alive := 0
		for _, mb := range m.Members {
			if mb.State == "alive" {
				alive++
			}
		}
		if err == nil && alive == want && len(m.Members) == want {
			return
		}
		if time.Now().After(deadline) {
			var stderr strings.Builder
			for _, d := range logs {
				fmt.Fprintf(&stderr, "--- %s\n%s", d.id, d.stderr)
			}
			t.Fatalf("after 60s: members %+v, %v; want %d alive\n%s", m.Members, err, want, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dialNode(t *testing.T, d *daemon) *client.Client {
	t.Helper()
	c, err := client.Dial(d.grpcAddr, client.Options{MaxBatchBlocks: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestClusterProcesses runs three kvmesh serve processes as an operator
// would: B and C join A; a prompt put through A is a hit through C. Then B
// is killed with SIGKILL in the middle of a stream of lookups and gets
// through C: they all answer, with misses for what B held, and none waits
// past its deadline. B restarted on its data dir rejoins and serves the
// blocks it had on NVMe again.
func TestClusterProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three kvmesh processes")
	}
	// 40 MiB of 512 KiB blocks: B owns about a third, 13 MiB, well over its
	// 8 MiB of DRAM, so that the first prompts' blocks are on its NVMe even
	// after C has read every block once (a read promotes). Fewer prompts
	// left B at its DRAM's size, and the test without blocks on NVMe.
	prompts, blocks := 10, 8
	a := startDaemon(t, t.TempDir(), clusterFlags...)
	dirB := t.TempDir()
	b := startDaemon(t, dirB, append(clusterFlags, "--join", a.gossip)...)
	c := startDaemon(t, t.TempDir(), append(clusterFlags, "--join", a.gossip)...)
	ca, cb, cc := dialNode(t, a), dialNode(t, b), dialNode(t, c)
	waitMembers(t, cc, 3, a, b, c)
	ctx := context.Background()

	// inspect members, as people and scripts read it.
	out, err := exec.Command(binary(t), "inspect", "--addr", c.grpcAddr, "members", "-o", "json").CombinedOutput()
	var members []memberJSON
	if err != nil || json.Unmarshal(out, &members) != nil || len(members) != 3 || !members[0].Self || members[0].ID != c.id {
		t.Fatalf("inspect members -o json: %v\n%s", err, out)
	}
	for _, m := range members {
		if m.State != "alive" || m.DataAddr == "" || m.GossipAddr == "" || len(m.Tiers) != 2 {
			t.Fatalf("inspect members: %+v", m)
		}
	}
	out, err = exec.Command(binary(t), "inspect", "--addr", c.grpcAddr, "members").CombinedOutput()
	if err != nil || !strings.Contains(string(out), a.id) || !strings.Contains(string(out), b.id) || !strings.Contains(string(out), c.id+" *") {
		t.Fatalf("inspect members:\n%s", out)
	}

	// Put through A; every prompt becomes a full hit through C.
	tokens, payloads := make([][]uint32, prompts), make([][][]byte, prompts)
	for p := range prompts {
		tokens[p], payloads[p] = e2ePrompt(100+p, blocks)
		if _, err := ca.Put(ctx, e2eNS, client.Prompt{Tokens: tokens[p]}, payloads[p]); err != nil {
			t.Fatalf("Put prompt %d through A: %v\n%s", p, err, a.stderr)
		}
	}
	for p := range prompts {
		waitFullHit(t, cc, tokens[p], blocks)
		// A peer slower than --get-timeout on a busy machine is a miss by
		// contract: read again until every block comes; wrong bytes never.
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := cc.Get(ctx, e2eNS, client.Prompt{Tokens: tokens[p]})
			if err != nil {
				t.Fatalf("Get prompt %d through C: %v", p, err)
			}
			for i, blk := range got {
				if !bytes.Equal(blk.Payload, payloads[p][i]) {
					t.Fatalf("prompt %d block %d read through C differs from what was put through A", p, i)
				}
			}
			if len(got) == blocks {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Get prompt %d through C: %d of %d blocks after 30s", p, len(got), blocks)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// The blocks B holds on NVMe (B's lookup tells the tier of its own),
	// and the prompts that have none: the stream below reads only those,
	// since a read of a block on NVMe moves it to DRAM, which SIGKILL
	// empties. Which prompts B owns blocks of depends on the nodes' ids,
	// so the split is found, not fixed.
	onDisk := map[prefixhash.Key][]byte{}
	chunkOf := map[prefixhash.Key]prefixhash.Key{}
	var streamTokens [][]uint32
	var streamPayloads [][][]byte
	ownedByB := 0
	for p := range prompts {
		l, err := cb.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens[p]})
		if err != nil {
			t.Fatal(err)
		}
		keys := prefixhash.Keys(e2eNS, tokens[p])
		disk := 0
		for i, blk := range l.Blocks() {
			if blk.NodeID == b.id {
				ownedByB++
				if blk.Tier == "nvme" {
					onDisk[blk.Key], chunkOf[blk.Key] = payloads[p][i], prefixhash.ChunkKey(keys, i, e2eChunkBlocks)
					disk++
				}
			}
		}
		if disk == 0 {
			streamTokens, streamPayloads = append(streamTokens, tokens[p]), append(streamPayloads, payloads[p])
		}
	}
	if len(onDisk) == 0 || len(streamTokens) == 0 {
		t.Fatalf("B holds %d blocks, %d on NVMe, and %d prompts have none there: the test needs DRAM pressure on B and prompts to read\n%s",
			ownedByB, len(onDisk), len(streamTokens), b.stderr)
	}

	// A stream of lookups and gets through C; B dies in the middle.
	var killed atomic.Bool
	stream := newLookupStream([]*client.Client{cc, cc, cc}, streamTokens, streamPayloads, 5*time.Second)
	stream.missedWhile = killed.Load
	streamEnd := time.Now().Add(90 * time.Second)
	stream.start(streamEnd)
	stream.waitFor(streamEnd, func() bool { return stream.calls.Load() >= 30 })
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-b.exited
	killed.Store(true)
	before := stream.calls.Load()
	waitMembers(t, cc, 2, a, c)
	stream.waitFor(streamEnd, func() bool { return stream.calls.Load() >= before+60 })
	stream.finish(t, c)
	if stream.missed.Load() == 0 {
		t.Fatal("no lookup missed after B was killed: B's blocks must be misses")
	}
	t.Logf("%d calls, %d after SIGKILL; slowest %v (deadline %v)", stream.calls.Load(), stream.calls.Load()-before,
		time.Duration(stream.slowest.Load()), stream.deadline)

	// B comes back on its data dir (so its id), on new ports: port 0 again,
	// since its old ones may have gone to another process; the others take
	// the id back at the new gossip address. It serves its NVMe blocks
	// again: C asks the owner (chunk keys given), which is B.
	b2 := startDaemon(t, dirB, append(clusterFlags, "--join", a.gossip)...)
	if b2.id != b.id {
		t.Fatalf("B restarted as %q, was %q: the node id must survive a restart", b2.id, b.id)
	}
	waitMembers(t, cc, 3, a, b2, c)
	raw := kvmeshv1.NewCacheServiceClient(rawConn(t, c.grpcAddr))
	req := &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(e2eNS)}
	for k := range onDisk {
		ck := chunkOf[k]
		req.Keys, req.ChunkKeys = append(req.Keys, k[:]), append(req.ChunkKeys, ck[:])
	}
	deadlineB := time.Now().Add(30 * time.Second)
	for {
		found, err := batchGetFound(ctx, raw, req, onDisk)
		if err != nil {
			t.Fatal(err)
		}
		if found == len(onDisk) {
			break
		}
		if time.Now().After(deadlineB) {
			t.Fatalf("after B's restart, C reads %d of the %d blocks B had on NVMe\n%s", found, len(onDisk), b2.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("B served its %d NVMe blocks again after its restart", len(onDisk))

	for _, d := range []*daemon{a, b2, c} {
		if _, err := d.stop(t); err != nil {
			t.Errorf("%s: exit %v\n%s", d.id, err, d.stderr)
		}
	}
}

// waitFullHit waits until a lookup through c finds all blocks of tokens.
func waitFullHit(t *testing.T, c *client.Client, tokens []uint32, blocks int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := c.Lookup(context.Background(), e2eNS, client.Prompt{Tokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		if l.CachedBlocks == blocks {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lookup finds %d of %d blocks after 30s", l.CachedBlocks, blocks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// batchGetFound streams req and counts the blocks found with the bytes
// want holds for them.
func batchGetFound(ctx context.Context, raw kvmeshv1.CacheServiceClient, req *kvmeshv1.BatchGetRequest, want map[prefixhash.Key][]byte) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := raw.BatchGet(ctx, req)
	if err != nil {
		return 0, err
	}
	found := 0
	var cur []byte
	var key prefixhash.Key
	for {
		f, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return found, nil
		}
		if err != nil {
			return found, err
		}
		if len(f.GetKey()) > 0 {
			key, cur = prefixhash.Key(f.GetKey()), nil
		}
		cur = append(cur, f.GetData()...)
		if f.GetLast() && bytes.Equal(cur, want[key]) {
			found++
		}
	}
}

// rawConn is a plain gRPC connection to addr, closed when the test ends.
func rawConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// lookupStream is a stream of lookups and gets of prompts: each worker reads
// the prompts in turn through its client, each call under its own deadline,
// until stopped; the first error stops the worker and is kept. It counts the
// calls and the lookups that missed part of their prompt, and keeps the
// slowest call.
type lookupStream struct {
	deadline        time.Duration
	calls, missed   atomic.Int64
	slowest         atomic.Int64
	stop            atomic.Bool
	wg              sync.WaitGroup
	mu              sync.Mutex
	errs            []error
	tokens          [][]uint32
	payloads        [][][]byte
	missedWhile     func() bool // counts misses only while it is true; nil: always
	missedBy        []atomic.Int64
	clients         []*client.Client
	blocksPerPrompt int
}

func newLookupStream(clients []*client.Client, tokens [][]uint32, payloads [][][]byte, deadline time.Duration) *lookupStream {
	return &lookupStream{deadline: deadline, clients: clients, tokens: tokens, payloads: payloads,
		missedBy: make([]atomic.Int64, len(clients)), blocksPerPrompt: len(payloads[0])}
}

// start runs one worker per client until stop or until.
func (s *lookupStream) start(until time.Time) {
	for w, c := range s.clients {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for i := 0; !s.stop.Load() && time.Now().Before(until); i++ {
				if err := s.call(c, w, (w+i)%len(s.tokens)); err != nil {
					s.mu.Lock()
					s.errs = append(s.errs, fmt.Errorf("client %d, call %d: %w", w, i, err))
					s.mu.Unlock()
					return
				}
			}
		}()
	}
}

// call looks prompt p up and reads its cached prefix, checking the bytes,
// within the deadline.
func (s *lookupStream) call(c *client.Client, w, p int) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.deadline)
	defer cancel()
	start := time.Now()
	l, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: s.tokens[p]})
	var got []client.Block
	if err == nil {
		got, err = c.Get(ctx, e2eNS, client.Prompt{Tokens: s.tokens[p]})
	}
	took := time.Since(start)
	for old := s.slowest.Load(); int64(took) > old && !s.slowest.CompareAndSwap(old, int64(took)); old = s.slowest.Load() {
	}
	for j, blk := range got {
		if err == nil && !bytes.Equal(blk.Payload, s.payloads[p][j]) {
			err = fmt.Errorf("prompt %d block %d: wrong bytes", p, j)
		}
	}
	if err == nil && took >= s.deadline {
		err = fmt.Errorf("took %v, past its %v deadline", took, s.deadline)
	}
	if err != nil {
		return err
	}
	s.calls.Add(1)
	if l.CachedBlocks < s.blocksPerPrompt && (s.missedWhile == nil || s.missedWhile()) {
		s.missed.Add(1)
		s.missedBy[w].Add(1)
	}
	return nil
}

func (s *lookupStream) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs) > 0
}

// waitFor waits until cond holds, a worker failed or until passes.
func (s *lookupStream) waitFor(until time.Time, cond func() bool) {
	for !cond() && !s.failed() && time.Now().Before(until) {
		time.Sleep(10 * time.Millisecond)
	}
}

// finish stops the workers, waits for them and fails t with their errors.
func (s *lookupStream) finish(t *testing.T, logs ...*daemon) {
	t.Helper()
	s.stop.Store(true)
	s.wg.Wait()
	for _, err := range s.errs {
		t.Error(err)
	}
	if t.Failed() {
		for _, d := range logs {
			t.Logf("--- %s\n%s", d.id, d.stderr)
		}
		t.FailNow()
	}
}
