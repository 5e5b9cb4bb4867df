package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// staticMembers is a Membership whose list the test changes.
type staticMembers struct {
	self string
	mu   sync.Mutex
	ms   []Member
	v    uint64
}

func (s *staticMembers) LocalID() string { return s.self }
func (s *staticMembers) Members() ([]Member, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ms, s.v
}
func (s *staticMembers) set(ms []Member) {
	s.mu.Lock()
	s.ms, s.v = ms, s.v+1
	s.mu.Unlock()
}

// loopback is an in-process network: Peers calls go straight to the other
// node's Local, unless the test made that node dead, slow or corrupting.
type loopback struct {
	mu    sync.Mutex
	nodes map[string]*Local
	fault map[string]string   // "dead", "slow", "corrupt"
	calls map[string]int      // RPCs per kind
	asked map[string][]string // the members asked, per kind, in order
	// gate, when a member has one, holds its answers until it is closed
	// (or the call's deadline passes).
	gate map[string]chan struct{}
}

type loopPeers struct{ net *loopback }

func (n *loopback) check(ctx context.Context, id, kind string) (*Local, string, error) {
	n.mu.Lock()
	n.calls[kind]++
	if n.asked != nil {
		n.asked[kind] = append(n.asked[kind], id)
	}
	l, f, gate := n.nodes[id], n.fault[id], n.gate[id]
	n.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, f, ctx.Err()
		}
	}
	switch {
	case l == nil || f == "dead":
		return nil, f, errors.New("connection refused")
	case f == "slow":
		<-ctx.Done() // a peer that never answers: only the deadline ends the call
		return nil, f, ctx.Err()
	}
	return l, f, nil
}

func (p loopPeers) Lookup(ctx context.Context, id string, runs [][]prefixhash.Key) ([]int, error) {
	l, _, err := p.net.check(ctx, id, "lookup")
	if err != nil {
		return nil, err
	}
	out := make([]int, len(runs))
	for i, r := range runs {
		out[i] = l.LongestPrefix(auth.Access{}, r)
	}
	return out, nil
}

func (p loopPeers) Get(ctx context.Context, id string, keys []prefixhash.Key) ([][]byte, func(), error) {
	l, f, err := p.net.check(ctx, id, "get")
	if err != nil {
		return nil, nil, err
	}
	refs, err := l.GetMany(ctx, keys)
	if err != nil {
		return nil, nil, err
	}
	out := make([][]byte, len(keys))
	for i, r := range refs {
		if r != nil {
			out[i] = bytes.Clone(r.Bytes()) // a network copy
			r.Release()
			if f == "corrupt" {
				out[i][len(out[i])-1] ^= 1
			}
		}
	}
	return out, nil, nil
}

func (p loopPeers) Put(ctx context.Context, id string, blocks [][]byte) error {
	l, _, err := p.net.check(ctx, id, "put")
	if err != nil {
		return err
	}
	return l.PutMany(ctx, blocks)
}

func (p loopPeers) Remove(ctx context.Context, id string, keys []prefixhash.Key) ([]bool, error) {
	l, _, err := p.net.check(ctx, id, "remove")
	if err != nil {
		return nil, err
	}
	return l.Remove(ctx, keys)
}

func (p loopPeers) Retain(ctx context.Context, id string, keys []prefixhash.Key, r block.Retention) ([]bool, error) {
	l, _, err := p.net.check(ctx, id, "retain")
	if err != nil {
		return nil, err
	}
	return l.Retain(ctx, keys, r)
}

type testCluster struct {
	net     *loopback
	nodes   []*Cluster
	members []*staticMembers
}

func newTestCluster(t testing.TB, n int, opts ClusterOptions) *testCluster {
	t.Helper()
	return newTestClusterWith(t, n, opts, Options{})
}

// newTestClusterWith is newTestCluster whose Locals take lopts (a DRAM tier
// of their own each).
func newTestClusterWith(t testing.TB, n int, opts ClusterOptions, lopts Options) *testCluster {
	t.Helper()
	tc := &testCluster{net: &loopback{nodes: map[string]*Local{}, fault: map[string]string{}, calls: map[string]int{}}}
	var ms []Member
	for i := range n {
		ms = append(ms, Member{ID: fmt.Sprintf("n%d", i), Weight: 1})
	}
	for i := range n {
		lo := lopts
		lo.DRAM = newFakeMem(1<<20, 64, 256, 4096)
		l, err := Open(lo)
		if err != nil {
			t.Fatal(err)
		}
		sm := &staticMembers{self: ms[i].ID}
		sm.set(ms)
		c, err := NewCluster(l, sm, loopPeers{tc.net}, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); l.Close() })
		tc.net.nodes[ms[i].ID] = l
		tc.nodes = append(tc.nodes, c)
		tc.members = append(tc.members, sm)
	}
	return tc
}

func clusterNS() prefixhash.Namespace {
	return prefixhash.Namespace{Model: "cluster-test", DType: prefixhash.Int8, BlockTokens: 4, Layers: 1, KVHeads: 1, HeadDim: 8}
}

// prompt returns a chain of n blocks and their encoded blocks.
func prompt(t *testing.T, rng *rand.Rand, ns prefixhash.Namespace, n int) ([]prefixhash.Key, [][]byte) {
	t.Helper()
	toks := make([]uint32, n*ns.BlockTokens)
	for i := range toks {
		toks[i] = rng.Uint32()
	}
	chain := prefixhash.Keys(ns, toks)
	blocks := make([][]byte, n)
	for i := range blocks {
		payload := make([]byte, ns.BlockBytes())
		for j := range payload {
			payload[j] = byte(rng.Uint32())
		}
		parent := ns.Root()
		if i > 0 {
			parent = chain[i-1]
		}
		b, key, err := block.Encode(nil, ns, parent, toks[i*ns.BlockTokens:(i+1)*ns.BlockTokens], payload)
		if err != nil || key != chain[i] {
			t.Fatal(err)
		}
		blocks[i] = b
	}
	return chain, blocks
}

func flush(t testing.TB, nodes ...*Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range nodes {
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClusterPutOnAHitOnC: a prompt put through one node is found, whole, and
// read back byte for byte through every other node.
func TestClusterPutOnAHitOnC(t *testing.T) {
	tc := newTestCluster(t, 4, ClusterOptions{ChunkTokens: 8}) // 2 blocks per chunk
	ns := clusterNS()
	rng := rand.New(rand.NewPCG(1, 1))
	chain, blocks := prompt(t, rng, ns, 20)
	a := tc.nodes[0]
	ctx := context.Background()
	if err := a.Put(ctx, blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	if st := a.Stats(); st.PushDropped != 0 || st.PushFailed != 0 || st.Pushed == 0 {
		t.Fatalf("push stats %+v", st)
	}
	for _, c := range tc.nodes[1:] {
		if n := c.LongestPrefix(ctx, chain, ns.BlockTokens); n != len(chain) {
			t.Fatalf("%s: longest prefix %d, want %d", c.self, n, len(chain))
		}
		f, err := c.Get(ctx, chain, ns.BlockTokens, 0, len(chain))
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range f.Blocks {
			if !bytes.Equal(b, blocks[i]) {
				t.Fatalf("%s: block %d differs from what was put", c.self, i)
			}
		}
		f.Release()
	}
	// A longer prompt sharing the prefix: the cluster-wide prefix is the
	// shared part.
	longer, _ := prompt(t, rng, ns, 3)
	mixed := append(append([]prefixhash.Key(nil), chain[:7]...), longer...)
	if n := tc.nodes[2].LongestPrefix(ctx, mixed, ns.BlockTokens); n != 7 {
		t.Fatalf("shared prefix: %d, want 7", n)
	}
}

// TestClusterLookupIsOneRound: one LongestPrefix sends at most one lookup
// RPC per other member, however long the prompt.
func TestClusterLookupIsOneRound(t *testing.T) {
	tc := newTestCluster(t, 4, ClusterOptions{ChunkTokens: 4})
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(2, 2)), ns, 200)
	a := tc.nodes[0]
	if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	tc.net.mu.Lock()
	tc.net.calls = map[string]int{}
	tc.net.mu.Unlock()
	if n := tc.nodes[3].LongestPrefix(context.Background(), chain, ns.BlockTokens); n != 200 {
		t.Fatalf("prefix %d", n)
	}
	if got := tc.net.calls["lookup"]; got > 3 {
		t.Fatalf("%d lookup RPCs for one prompt, want at most 3 (one per other member)", got)
	}
}

// TestClusterFaultyPeersAreMisses: dead, silent and corrupting peers turn into
// misses within the deadlines — never an error, a hang or wrong bytes.
func TestClusterFaultyPeersAreMisses(t *testing.T) {
	opts := ClusterOptions{ChunkTokens: 4, LookupTimeout: 50 * time.Millisecond, GetTimeout: 100 * time.Millisecond}
	for _, fault := range []string{"dead", "slow", "corrupt"} {
		t.Run(fault, func(t *testing.T) {
			tc := newTestCluster(t, 3, opts)
			ns := clusterNS()
			chain, blocks := prompt(t, rand.New(rand.NewPCG(3, 3)), ns, 60)
			a := tc.nodes[0]
			if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
				t.Fatal(err)
			}
			flush(t, a)
			tc.net.mu.Lock()
			tc.net.fault["n1"] = fault
			tc.net.mu.Unlock()
			c := tc.nodes[2]
			start := time.Now()
			n := c.LongestPrefix(context.Background(), chain, ns.BlockTokens)
			f, err := c.Get(context.Background(), chain, ns.BlockTokens, 0, len(chain))
			if err != nil {
				t.Fatalf("Get returned %v; a faulty peer must be a miss", err)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("lookup + get took %v with a %s peer", el, fault)
			}
			// Blocks owned by n1 are missing (the corrupt peer answers
			// lookups truthfully but its bytes fail verification).
			p := c.placement()
			firstN1 := len(chain)
			for i := range chain {
				if p.Owner(prefixhash.ChunkKey(chain, i, 1)) == "n1" {
					firstN1 = i
					break
				}
			}
			if fault != "corrupt" && n != firstN1 {
				t.Fatalf("prefix %d with n1 %s, want %d (n1's first block)", n, fault, firstN1)
			}
			got := 0
			for i, b := range f.Blocks {
				owner := p.Owner(prefixhash.ChunkKey(chain, i, 1))
				switch {
				case b != nil && !bytes.Equal(b, blocks[i]):
					t.Fatalf("block %d: wrong bytes served", i)
				case b != nil && owner == "n1":
					t.Fatalf("block %d came from faulty n1", i)
				case b == nil && owner != "n1":
					t.Fatalf("block %d of healthy %s missed", i, owner)
				case b != nil:
					got++
				}
			}
			f.Release()
			if got == 0 || got == len(chain) {
				t.Fatalf("%d of %d blocks served: the test should span both healthy and faulty owners", got, len(chain))
			}
			st := c.Stats()
			if fault == "corrupt" && st.RemoteCorrupt == 0 {
				t.Fatalf("corrupt blocks not counted: %+v", st)
			}
			if fault != "corrupt" && (st.RemoteLookupFails == 0 || st.RemoteGetFails == 0) {
				t.Fatalf("failed RPCs not counted: %+v", st)
			}
		})
	}
}

// TestClusterPushNeverBlocks: with an owner that never answers, Put returns
// at once and what does not fit the queue is dropped and counted.
func TestClusterPushNeverBlocks(t *testing.T) {
	tc := newTestCluster(t, 2, ClusterOptions{ChunkTokens: 4, PushQueueBytes: 4096, PushTimeout: time.Hour})
	tc.net.fault["n1"] = "slow"
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(4, 4)), ns, 100)
	a := tc.nodes[0]
	if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.PushDropped == 0 {
		t.Fatalf("a full queue dropped nothing: %+v", st)
	}
	if n := a.Local().LongestPrefix(auth.Access{}, chain); n != len(chain) {
		t.Fatalf("the producer kept %d of %d blocks", n, len(chain))
	}
	a.Close() // stops the stuck push through the cluster's context
}

// TestClusterMembershipChange: after a member leaves, its queue is dropped and
// lookups no longer ask it.
func TestClusterMembershipChange(t *testing.T) {
	tc := newTestCluster(t, 3, ClusterOptions{ChunkTokens: 4})
	for _, sm := range tc.members {
		sm.set([]Member{{ID: "n0", Weight: 1}, {ID: "n1", Weight: 1}})
	}
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(5, 5)), ns, 40)
	a := tc.nodes[0]
	if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	if tc.net.nodes["n2"].Stats().Puts != 0 {
		t.Fatal("a departed member received pushes")
	}
	if n := tc.nodes[1].LongestPrefix(context.Background(), chain, ns.BlockTokens); n != len(chain) {
		t.Fatalf("prefix %d after the membership change", n)
	}
}

// TestClusterHandoff: a node leaving gracefully hands its blocks to the
// members that own them without it, so the prompt stays a full hit.
func TestClusterHandoff(t *testing.T) {
	tc := newTestCluster(t, 3, ClusterOptions{ChunkTokens: 8})
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(6, 6)), ns, 30)
	a := tc.nodes[0]
	if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	// n1 leaves: first its handoff, then the others drop it.
	leaving := tc.nodes[1]
	held := leaving.Local().Stats().Tiers[0].Blocks
	if n := len(leaving.Handoff(context.Background(), 1<<30)); held == 0 || n < int(held) {
		t.Fatalf("handoff pushed %d of the %d blocks n1 held", n, held)
	}
	for _, sm := range tc.members {
		sm.set([]Member{{ID: "n0", Weight: 1}, {ID: "n2", Weight: 1}})
	}
	tc.net.mu.Lock()
	tc.net.fault["n1"] = "dead"
	tc.net.mu.Unlock()
	// Every block n1 owned is now held by its new owner; check those that
	// moved to n2 (n0 produced them all, so it proves nothing).
	before := NewPlacement([]Member{{ID: "n0", Weight: 1}, {ID: "n1", Weight: 1}, {ID: "n2", Weight: 1}}, 1)
	after := NewPlacement([]Member{{ID: "n0", Weight: 1}, {ID: "n2", Weight: 1}}, 1)
	moved := 0
	for i, k := range chain {
		ck := prefixhash.ChunkKey(chain, i, 2)
		if before.Owner(ck) == "n1" && after.Owner(ck) == "n2" {
			moved++
			if !tc.net.nodes["n2"].Contains(auth.Access{}, k) {
				t.Fatalf("block %d moved from n1 to n2 but n2 does not hold it", i)
			}
		}
	}
	if moved == 0 {
		t.Fatal("no block moved from n1 to n2: the test proves nothing")
	}
	if n := tc.nodes[2].LongestPrefix(context.Background(), chain, ns.BlockTokens); n != len(chain) {
		t.Fatalf("after n1 left, prefix %d of %d", n, len(chain))
	}
}

// putPrompt puts a prompt of n blocks through node a and waits for its
// pushes.
func (tc *testCluster) putPrompt(t *testing.T, seed uint64, n int) ([]prefixhash.Key, [][]byte) {
	t.Helper()
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(seed, seed)), ns, n)
	a := tc.nodes[0]
	if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	return chain, blocks
}

// TestClusterGetKeys: blocks asked for by key, in any order, with or without
// their chunk keys, are read from whoever holds them.
func TestClusterGetKeys(t *testing.T) {
	tc := newTestCluster(t, 4, ClusterOptions{ChunkTokens: 8})
	chain, blocks := tc.putPrompt(t, 7, 30)
	c := tc.nodes[3]
	ns := clusterNS()
	order := rand.New(rand.NewPCG(8, 8)).Perm(len(chain))
	keys := make([]prefixhash.Key, len(order))
	cks := make([]prefixhash.Key, len(order))
	all := c.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))
	for j, i := range order {
		keys[j], cks[j] = chain[i], all[i]
	}
	unknown := prefixhash.Keys(ns, []uint32{9, 9, 9, 9})[0]
	keys, cks = append(keys, unknown), append(cks, unknown)
	for _, withChunks := range []bool{true, false} {
		ask := cks
		if !withChunks {
			ask = nil
		}
		tc.net.mu.Lock()
		tc.net.calls = map[string]int{}
		tc.net.mu.Unlock()
		f, err := c.GetKeys(context.Background(), keys, ask, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		for j, i := range order {
			if !bytes.Equal(f.Blocks[j], blocks[i]) {
				t.Fatalf("chunk keys %v: key %d (block %d) read wrong or missed", withChunks, j, i)
			}
		}
		if f.Blocks[len(order)] != nil {
			t.Fatal("a key nobody holds was found")
		}
		f.Release()
		tc.net.mu.Lock()
		lookups, gets := tc.net.calls["lookup"], tc.net.calls["get"]
		tc.net.mu.Unlock()
		if withChunks && lookups != 0 || !withChunks && lookups != 3 || gets > 3 {
			t.Fatalf("chunk keys %v: %d lookups and %d gets; want one round of lookups only without chunk keys, one get per holder", withChunks, lookups, gets)
		}
	}
	if _, err := c.GetKeys(context.Background(), keys, cks[:1], time.Time{}); err == nil {
		t.Fatal("mismatched chunk keys accepted")
	}
}

// TestClusterLocate: Locate says which member holds each block of the prefix.
func TestClusterLocate(t *testing.T) {
	tc := newTestCluster(t, 3, ClusterOptions{ChunkTokens: 8})
	chain, _ := tc.putPrompt(t, 9, 21)
	ns := clusterNS()
	p := NewPlacement([]Member{{ID: "n0", Weight: 1}, {ID: "n1", Weight: 1}, {ID: "n2", Weight: 1}}, 1)
	for _, c := range tc.nodes {
		n, spans := c.Locate(context.Background(), chain, ns.BlockTokens)
		var where, tiers []string // per block
		for k, sp := range spans {
			if sp.Blocks < 1 || k > 0 && spans[k-1].Node == sp.Node && spans[k-1].Tier == sp.Tier {
				t.Fatalf("%s: span %d of %v is empty or not joined to the one before", c.self, k, spans)
			}
			for range sp.Blocks {
				where, tiers = append(where, sp.Node), append(tiers, sp.Tier)
			}
		}
		if n != len(chain) || len(where) != n {
			t.Fatalf("%s: Locate = %d blocks, %d located", c.self, n, len(where))
		}
		for i, w := range where {
			owner := p.Owner(prefixhash.ChunkKey(chain, i, 2))
			if c.self == "n0" && w != "n0" || c.self != "n0" && w != owner && w != c.self {
				t.Fatalf("%s: block %d located on %s; owner %s, producer n0", c.self, i, w, owner)
			}
			info, held := c.Local().Info(auth.Access{}, chain[i])
			if w == c.self && (!held || tiers[i] != info.Tier) {
				t.Fatalf("%s: block %d located here in tier %q; held %v in %q", c.self, i, tiers[i], held, info.Tier)
			}
			if w != c.self && tiers[i] != "" {
				t.Fatalf("%s: block %d located on %s has a local tier %q", c.self, i, w, tiers[i])
			}
		}
	}
	if n, spans := tc.nodes[1].Locate(context.Background(), nil, ns.BlockTokens); n != 0 || len(spans) != 0 {
		t.Fatalf("empty chain: %d, %v", n, spans)
	}
}

// TestClusterExists: presence anywhere in the cluster, with and without chunk
// keys; a dead holder reads as absent.
func TestClusterExists(t *testing.T) {
	tc := newTestCluster(t, 3, ClusterOptions{ChunkTokens: 4, LookupTimeout: 50 * time.Millisecond})
	chain, _ := tc.putPrompt(t, 10, 12)
	ns := clusterNS()
	unknown := prefixhash.Keys(ns, []uint32{7, 7, 7, 7})[0]
	keys := append(append([]prefixhash.Key(nil), chain...), unknown)
	c := tc.nodes[2]
	cks := append(c.ChunkKeys(chain, ns.BlockTokens, 0, len(chain)), unknown)
	for _, ask := range [][]prefixhash.Key{cks, nil} {
		got, err := c.Exists(context.Background(), keys, ask)
		if err != nil {
			t.Fatal(err)
		}
		for i := range chain {
			if !got[i] {
				t.Fatalf("block %d not found (chunk keys %v)", i, ask != nil)
			}
		}
		if got[len(chain)] {
			t.Fatal("an unknown key exists")
		}
	}
	tc.net.mu.Lock()
	tc.net.fault["n1"] = "slow"
	tc.net.mu.Unlock()
	got, err := c.Exists(context.Background(), keys, cks)
	if err != nil {
		t.Fatal(err)
	}
	p := c.placement()
	for i := range chain {
		owner := p.Owner(cks[i])
		if want := owner != "n1" || c.Local().Contains(auth.Access{}, chain[i]); got[i] != want {
			t.Fatalf("block %d (owner %s) with n1 silent: exists %v, want %v", i, owner, got[i], want)
		}
	}
}

// TestClusterPublish: blocks stored locally without their placement reach
// their owners once published.
func TestClusterPublish(t *testing.T) {
	tc := newTestCluster(t, 3, ClusterOptions{ChunkTokens: 4})
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(11, 11)), ns, 12)
	a := tc.nodes[0]
	if err := a.Local().PutMany(context.Background(), blocks); err != nil {
		t.Fatal(err)
	}
	if n := tc.nodes[1].LongestPrefix(context.Background(), chain, ns.BlockTokens); n == len(chain) {
		t.Fatal("unpublished blocks are already found elsewhere: the test proves nothing")
	}
	cks := a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))
	n, err := a.Publish(context.Background(), chain, cks)
	if err != nil {
		t.Fatal(err)
	}
	p := a.placement()
	want := 0
	for _, ck := range cks {
		if p.Owner(ck) != "n0" {
			want++
		}
	}
	if n != want {
		t.Fatalf("published %d blocks, want %d (those n0 does not own)", n, want)
	}
	flush(t, a)
	if got := tc.nodes[1].LongestPrefix(context.Background(), chain, ns.BlockTokens); got != len(chain) {
		t.Fatalf("after Publish, prefix %d of %d", got, len(chain))
	}
	if _, err := a.Publish(context.Background(), chain, nil); err == nil {
		t.Fatal("Publish without chunk keys accepted")
	}
}

// TestClusterRemoteDeadline: GetKeys gives up on a silent peer at remoteBy,
// however long GetTimeout is, and still serves what is local.
func TestClusterRemoteDeadline(t *testing.T) {
	tc := newTestCluster(t, 2, ClusterOptions{ChunkTokens: 4, GetTimeout: time.Hour, LookupTimeout: time.Hour})
	chain, _ := tc.putPrompt(t, 12, 16)
	tc.net.mu.Lock()
	tc.net.fault["n0"] = "slow"
	tc.net.mu.Unlock()
	b := tc.nodes[1]
	ns := clusterNS()
	cks := b.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))
	start := time.Now()
	f, err := b.GetKeys(context.Background(), chain, cks, time.Now().Add(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release()
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("GetKeys returned after %v; remoteBy was 50ms away", el)
	}
	for i, blk := range f.Blocks {
		if (blk != nil) != b.Local().Contains(auth.Access{}, chain[i]) {
			t.Fatalf("block %d: found %v, held locally %v", i, blk != nil, b.Local().Contains(auth.Access{}, chain[i]))
		}
	}
}

// TestClusterPartsCompleteAtOwner: ranks put the parts of one block
// through two nodes that do not own it, one through Cluster.Put, the other
// as the data plane does (stored, then PublishBlocks); each node keeps its
// parts and pushes them to the owners, where the block completes.
func TestClusterPartsCompleteAtOwner(t *testing.T) {
	tc := newTestCluster(t, 4, ClusterOptions{ChunkTokens: 4, Replicas: 1})
	ctx := context.Background()
	b := newPartBlock(t, rand.New(rand.NewPCG(21, 22)), blocktest.NS()) // 2 layers
	chunk := tc.nodes[0].ChunkKeys([]prefixhash.Key{b.key}, b.ns.BlockTokens, 0, 1)
	var writers []*Cluster
	var owner *Local
	for _, c := range tc.nodes {
		if c.Owns(chunk[0]) {
			owner = tc.net.nodes[c.self]
		} else {
			writers = append(writers, c)
		}
	}
	if owner == nil || len(writers) < 2 {
		t.Fatalf("owner %v, %d other nodes", owner, len(writers))
	}
	for tp, c := range writers[:2] { // tensor-parallel ranks 0 and 1, each of 2 pipeline stages
		for stage := range 2 {
			p, err := block.RankPart(b.ns, tp, 2, stage, 2)
			if err != nil {
				t.Fatal(err)
			}
			rec := b.record(t, p, nil)
			if tp == 0 {
				err = c.Put(ctx, [][]byte{rec}, chunk)
			} else if err = tc.net.nodes[c.self].PutCopy(ctx, rec); err == nil {
				_, err = c.PublishBlocks([][]byte{rec}, chunk)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	flush(t, writers[:2]...)
	checkWhole(t, owner, b)
	for _, c := range writers[:2] {
		l := tc.net.nodes[c.self]
		if l.Contains(auth.Access{}, b.key) || len(l.Partials()) != 1 {
			t.Fatalf("%s: a writer holds its half as an incomplete block, never whole", c.self)
		}
	}
	if n := writers[2].LongestPrefix(ctx, []prefixhash.Key{b.key}, b.ns.BlockTokens); n != 1 {
		t.Fatalf("the block is not found through a third node: %d", n)
	}
}
