package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// chunking is a node whose cluster cuts prompts into chunks of 8 tokens
// (2 blocks of testNS), and whose Lookup records the chain it was asked
// and answers that the first cached blocks of it are cached, the first 2
// on "a", the rest on "b".
type chunking struct {
	flaky
	cached int
	mu     sync.Mutex
	chain  []byte
	tokens uint64
}

func (n *chunking) Members(context.Context, *kvmeshv1.MembersRequest) (*kvmeshv1.MembersResponse, error) {
	return &kvmeshv1.MembersResponse{SelfId: "a", ChunkTokens: 8, Members: []*kvmeshv1.Member{{Id: "a"}}}, nil
}

func (n *chunking) Lookup(_ context.Context, req *kvmeshv1.LookupRequest) (*kvmeshv1.LookupResponse, error) {
	n.mu.Lock()
	n.chain, n.tokens = req.GetChain(), req.GetPromptTokens()
	n.mu.Unlock()
	blocks := len(req.GetChain()) / prefixhash.KeySize
	cached := min(n.cached, blocks)
	resp := &kvmeshv1.LookupResponse{CachedBlocks: uint32(cached), CachedTokens: uint64(cached * 4),
		PromptBlocks: uint32(blocks), PromptTokens: req.GetPromptTokens(), Nodes: []string{"a", "b"}}
	if a := min(cached, 2); a > 0 {
		resp.Runs = append(resp.Runs, &kvmeshv1.CachedRun{Blocks: uint32(a), Node: 0, Tier: "dram"})
	}
	if cached > 2 {
		resp.Runs = append(resp.Runs, &kvmeshv1.CachedRun{Blocks: uint32(cached - 2), Node: 1})
	}
	return resp, nil
}

// TestParentContinuesTheChain: a prompt that continues a Parent chain puts
// the blocks the whole prompt would have put, with the same keys, parents
// and chunk keys (placement), under both key schemes; and its Lookup asks
// for the whole chain and answers for the continuation's blocks.
func TestParentContinuesTheChain(t *testing.T) {
	vllm := testNS
	vllm.Scheme, vllm.HashSeed = prefixhash.SchemeVLLM, "0"
	tokens := make([]uint32, 5*testNS.BlockTokens+1)
	for i := range tokens {
		tokens[i] = uint32(7 + i)
	}
	for _, ns := range []prefixhash.Namespace{testNS, vllm} {
		t.Run(ns.Scheme.String(), func(t *testing.T) {
			node := &chunking{cached: 4}
			c := serve(t, node)
			rb := &recordingBulk{}
			c.bulk = rb
			ctx := context.Background()
			payloads := make([][]byte, 5)
			for i := range payloads {
				payloads[i] = make([]byte, ns.BlockBytes())
			}
			if _, err := c.Put(ctx, ns, Prompt{Tokens: tokens}, payloads); err != nil {
				t.Fatal(err)
			}
			whole := rb.items
			rb.items = nil
			head := prefixhash.NewChain(ns)
			head.Extend(tokens[:3*ns.BlockTokens])
			p := Prompt{Tokens: tokens[3*ns.BlockTokens:], Parent: head}
			keys, err := c.Put(ctx, ns, p, payloads[3:])
			if err != nil {
				t.Fatal(err)
			}
			if len(rb.items) != 2 || !slices.Equal(keys, prefixhash.Keys(ns, tokens)[3:]) {
				t.Fatalf("Put after a parent: keys %v, %d items; want blocks 3 and 4's keys", keys, len(rb.items))
			}
			for i, it := range rb.items {
				w := whole[3+i]
				if it.key != w.key || it.parent != w.parent || it.chunk != w.chunk || it.chunk.IsZero() || !slices.Equal(it.tokens, w.tokens) {
					t.Errorf("block %d after a parent: key %s parent %s chunk %s; the whole prompt's: %s %s %s",
						3+i, it.key, it.parent, it.chunk, w.key, w.parent, w.chunk)
				}
			}

			l, err := c.Lookup(ctx, ns, p)
			if err != nil {
				t.Fatal(err)
			}
			all := prefixhash.Keys(ns, tokens)
			node.mu.Lock()
			chain, promptTokens := node.chain, node.tokens
			node.mu.Unlock()
			if string(chain) != string(chainBytes(all)) || promptTokens != uint64(len(tokens)) {
				t.Errorf("Lookup after a parent asked for %d bytes of chain, %d tokens; want the whole prompt's", len(chain), promptTokens)
			}
			want := Lookup{PromptTokens: len(p.Tokens), PromptBlocks: 2, CachedTokens: 4, CachedBlocks: 1, Keys: all[3:],
				Runs: []Run{{Start: 0, Blocks: 1, NodeID: "b"}}}
			if !equalLookup(l, want) {
				t.Errorf("Lookup after a parent = %+v; want %+v", l, want)
			}
		})
	}
}

func equalLookup(a, b Lookup) bool {
	return a.PromptTokens == b.PromptTokens && a.PromptBlocks == b.PromptBlocks && a.CachedTokens == b.CachedTokens &&
		a.CachedBlocks == b.CachedBlocks && slices.Equal(a.Keys, b.Keys) && slices.Equal(a.Runs, b.Runs)
}

// TestLookupAfter: a whole prompt's answer, seen from a block on.
func TestLookupAfter(t *testing.T) {
	keys := prefixhash.Keys(testNS, make([]uint32, 6*4))
	l := Lookup{PromptTokens: 26, PromptBlocks: 6, CachedTokens: 16, CachedBlocks: 4, Keys: keys,
		Runs: []Run{{Start: 0, Blocks: 3, NodeID: "a", Tier: "dram"}, {Start: 3, Blocks: 1, NodeID: "b"}}}
	for _, c := range []struct {
		n    int
		want Lookup
	}{
		{0, l},
		{2, Lookup{PromptTokens: 18, PromptBlocks: 4, CachedTokens: 8, CachedBlocks: 2, Keys: keys[2:],
			Runs: []Run{{Start: 0, Blocks: 1, NodeID: "a", Tier: "dram"}, {Start: 1, Blocks: 1, NodeID: "b"}}}},
		{3, Lookup{PromptTokens: 14, PromptBlocks: 3, CachedTokens: 4, CachedBlocks: 1, Keys: keys[3:], Runs: []Run{{Start: 0, Blocks: 1, NodeID: "b"}}}},
		{5, Lookup{PromptTokens: 6, PromptBlocks: 1, Keys: keys[5:]}}, // the parent itself is not all cached
	} {
		if got := l.after(c.n, 4); !equalLookup(got, c.want) {
			t.Errorf("after(%d) = %+v; want %+v", c.n, got, c.want)
		}
	}
}

// TestPromptRefusedBeforeSending: a Prompt or an option a verb cannot use
// is ErrInvalid, and nothing reaches the node.
func TestPromptRefusedBeforeSending(t *testing.T) {
	f := &flaky{}
	c := serve(t, f)
	ctx := context.Background()
	tokens := make([]uint32, 3*testNS.BlockTokens)
	keys := prefixhash.Keys(testNS, tokens)
	other := testNS
	other.Model = "other"
	otherChain := prefixhash.NewChain(other)
	partial := prefixhash.NewChain(testNS)
	partial.Extend(tokens[:5])
	for name, call := range map[string]func() error{
		"Tokens and Keys": func() error { _, err := c.Get(ctx, testNS, Prompt{Tokens: tokens, Keys: keys}); return err },
		"Keys with Extra": func() error {
			_, err := c.Lookup(ctx, testNS, Prompt{Keys: keys, Extra: []prefixhash.ExtraKeys{{[]byte("x")}}})
			return err
		},
		"Put by Keys":       func() error { _, err := c.Put(ctx, testNS, Prompt{Keys: keys}, nil); return err },
		"Into on Lookup":    func() error { _, err := c.Lookup(ctx, testNS, Prompt{Tokens: tokens}, Into(nil)); return err },
		"SendTokens on Get": func() error { _, err := c.Get(ctx, testNS, Prompt{Tokens: tokens}, SendTokens()); return err },
		"Into and Each": func() error {
			_, err := c.Get(ctx, testNS, Prompt{Tokens: tokens}, Into(nil), Each(func(Block) error { return nil }))
			return err
		},
		"the zero option": func() error { _, err := c.View(ctx, testNS, Prompt{Tokens: tokens}, CallOption{}); return err },
		"SendTokens with Parent": func() error {
			_, err := c.Lookup(ctx, testNS, Prompt{Tokens: tokens, Parent: prefixhash.NewChain(testNS)}, SendTokens())
			return err
		},
		"Parent of another model": func() error { _, err := c.Get(ctx, testNS, Prompt{Tokens: tokens, Parent: otherChain}); return err },
		"Parent mid-block":        func() error { _, err := c.Get(ctx, testNS, Prompt{Tokens: tokens, Parent: partial}); return err },
		"Extra past the blocks": func() error {
			_, err := c.Get(ctx, testNS, Prompt{Tokens: tokens, Extra: make([]prefixhash.ExtraKeys, 4)})
			return err
		},
	} {
		if err := call(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", name, err)
		}
	}
	if f.calls.Load() != 0 {
		t.Fatal("invalid calls reached the node")
	}
}

// TestGetEach: Get with Each hands the blocks to the callback in order as
// they arrive, returns none, and an error from the callback ends the read
// and is returned.
func TestGetEach(t *testing.T) {
	c := serve(t, &flaky{})
	keys := prefixhash.Keys(testNS, make([]uint32, 5*4))
	var got []int
	blocks, err := c.Get(context.Background(), testNS, Prompt{Keys: keys}, Each(func(b Block) error {
		got = append(got, b.Index)
		return nil
	}))
	if err != nil || blocks != nil || !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("Get with Each = %v, %v; delivered %v; want blocks 0..4 to the callback", blocks, err, got)
	}
	stop := errors.New("enough")
	got = nil
	_, err = c.Get(context.Background(), testNS, Prompt{Keys: keys}, Each(func(b Block) error {
		got = append(got, b.Index)
		if b.Index == 1 {
			return stop
		}
		return nil
	}))
	if !errors.Is(err, stop) || !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("Get with Each stopped at block 1 = %v, delivered %v; want the callback's error after 0, 1", err, got)
	}
}
