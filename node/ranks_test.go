package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// Multi-GPU instances (issue 23) end to end: ranks of a model instance put
// and read their parts of blocks through real nodes (Open) and the client.

// partsDRAM is the DRAM tier of the nodes here: room for several slabs, so
// that the slots shared-memory puts reserve for parts, of sizes other than
// the whole block's, leave slabs for the blocks being assembled.
const partsDRAM = 128 * MiB

// rankModel is the bundled engine's tiny model with 4 KV heads (no
// grouping) and 2 layers: TP 1, 2 and 4 and PP 1 and 2 split it.
func rankModel() prefill.Config {
	c := prefill.Config{Layers: 2, Dim: 64, Heads: 4, KVHeads: 4, HeadDim: 16, FFNDim: 96, Vocab: 260,
		MaxContext: 1024, BlockTokens: 16}
	c.EnsureDefaults()
	return c
}

// partsNS has 4 KV heads and 2 layers, 4 KiB blocks of 16 tokens.
var partsNS = prefixhash.Namespace{Model: "test/parts", DType: prefixhash.Float16, BlockTokens: 16,
	Layers: 2, KVHeads: 4, HeadDim: 8}

// latentNS is an MLA namespace: 4 KiB blocks of one latent per token.
var latentNS = prefixhash.Namespace{Model: "test/mla", DType: prefixhash.Float16, BlockTokens: 16,
	Layers: 2, Layout: prefixhash.LatentKV, LatentDim: 64}

// partsPrompt returns blocks full blocks of tokens under ns (and a 3-token
// tail) and their whole payloads, derived from seed.
func partsPrompt(ns prefixhash.Namespace, seed, blocks int) ([]uint32, [][]byte) {
	tokens := make([]uint32, blocks*ns.BlockTokens+3)
	for i := range tokens {
		tokens[i] = uint32(seed*100000 + i)
	}
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	payloads := make([][]byte, blocks)
	for i := range payloads {
		payloads[i] = make([]byte, ns.BlockBytes())
		for j := range payloads[i] {
			payloads[i][j] = byte(r.Uint32())
		}
	}
	return tokens, payloads
}

// rankParts cuts rank r's part out of each whole payload.
func rankParts(t testing.TB, ns prefixhash.Namespace, payloads [][]byte, r client.Rank) [][]byte {
	t.Helper()
	p, err := r.Part(ns)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]byte, len(payloads))
	for i, pl := range payloads {
		out[i] = block.LayoutOf(ns).ExtractPart(nil, pl, ns.BlockTokens, p)
	}
	return out
}

// ranks lists every rank of an instance of tp × pp ranks.
func ranks(tp, pp int) []client.Rank {
	var out []client.Rank
	for p := range pp {
		for r := range tp {
			out = append(out, client.Rank{TPRank: r, TPSize: tp, PPRank: p, PPSize: pp})
		}
	}
	return out
}

// putRanks has every rank of a tp × pp instance put its part of payloads,
// each from its own goroutine and its own client of the node at addr, all
// at once, as the processes of an instance would.
func putRanks(t testing.TB, addr string, ns prefixhash.Namespace, tokens []uint32, payloads [][]byte, tp, pp int) {
	t.Helper()
	var wg sync.WaitGroup
	for _, r := range ranks(tp, pp) {
		parts := rankParts(t, ns, payloads, r)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(addr, client.Options{})
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			keys, err := c.PutRank(ctx, ns, tokens, parts, r)
			if err != nil || len(keys) != len(parts) {
				t.Errorf("rank %s: PutRank: %d keys, %v", r, len(keys), err)
			}
		}()
	}
	wg.Wait()
}

// readRanks reads the cached prefix of tokens through c as every rank of a
// tp × pp instance does, checks that each got its part of blocks blocks,
// and returns the whole payloads the parts put together make.
func readRanks(t testing.TB, c *client.Client, ns prefixhash.Namespace, tokens []uint32, blocks, tp, pp int) [][]byte {
	t.Helper()
	l := block.LayoutOf(ns)
	out := make([][]byte, blocks)
	for i := range out {
		out[i] = make([]byte, ns.BlockBytes())
	}
	for _, r := range ranks(tp, pp) {
		p, err := r.Part(ns)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.GetRank(context.Background(), ns, tokens, r)
		if err != nil || len(got) != blocks {
			t.Fatalf("rank %s: GetRank: %d blocks, %v; want %d", r, len(got), err, blocks)
		}
		for i, b := range got {
			if b.Index != i || len(b.Payload) != l.PartLen(ns.BlockTokens, p) {
				t.Fatalf("rank %s: block %d: index %d, %d bytes; want its %s, %d bytes", r, i, b.Index, len(b.Payload), p, l.PartLen(ns.BlockTokens, p))
			}
			l.PlacePart(out[i], b.Payload, ns.BlockTokens, p)
		}
	}
	return out
}

// recordingCache is a prefill.Cache that misses everything and keeps what
// the engine publishes: the blocks a cold prefill computes.
type recordingCache struct {
	mu     sync.Mutex
	blocks map[prefixhash.Key][]byte
}

func (*recordingCache) LongestPrefix(context.Context, []prefixhash.Key) (int, error) { return 0, nil }

func (*recordingCache) Get(context.Context, []prefixhash.Key) ([][]byte, func(), error) {
	return nil, func() {}, nil
}

func (rc *recordingCache) Put(_ context.Context, chain []prefixhash.Key, from int, blocks [][]byte) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for i, b := range blocks {
		rc.blocks[chain[from+i]] = bytes.Clone(b)
	}
	return nil
}

// coldBlocks returns the payloads of the full blocks of tokens a cold engine
// of model c computes (the node's weights), and its namespace.
func coldBlocks(t testing.TB, c prefill.Config, tokens []uint32) (prefixhash.Namespace, [][]byte) {
	t.Helper()
	rc := &recordingCache{blocks: map[prefixhash.Key][]byte{}}
	e, err := prefill.New(rc, prefill.Options{Config: c, Weights: seededWeights(c, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	if _, err := e.Prefill(ctx, tokens, ""); err != nil {
		t.Fatal(err)
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ns := e.Namespace()
	keys := prefixhash.Keys(ns, tokens)
	out := make([][]byte, len(keys))
	for i, k := range keys {
		b, err := block.Decode(rc.blocks[k], 0)
		if err != nil {
			t.Fatalf("block %d the cold engine published: %v", i, err)
		}
		out[i] = b.Payload
	}
	return ns, out
}

// TestRanksPrefillTPAndPP: the bundled engine's KV of a prompt, written by
// the ranks of an instance at TP 2 (and at TP 4 × PP 2), each rank putting
// its heads (and layers) of every block, is read back at TP 1, TP 2, TP 4,
// PP 2 and TP 2 × PP 2 byte for byte as the cold prefill computed it, and
// the node's engine generates from it what a cold engine generates, with
// the written prefix as its cached tokens.
func TestRanksPrefillTPAndPP(t *testing.T) {
	c := rankModel()
	rng := rand.New(rand.NewPCG(23, 5))
	for i, w := range []struct{ tp, pp int }{{2, 1}, {4, 2}} {
		n := openClusterNode(t, t.TempDir(), fmt.Sprintf("r%d", i), nil, func(o *Options) { o.Prefill.Model, o.Tiers.DRAMBytes = c, partsDRAM })
		prompt := longText(rng, 300)
		prefix := prefill.TokenizeBytes(prompt[:200])
		ns, cold := coldBlocks(t, c, prefix)
		if got := n.Node.prefill.engine.Namespace(); got != ns {
			t.Fatalf("the node's engine keys under %s, the cold one under %s", got, ns)
		}
		var shmPuts int64
		if n.cluster.shm != nil {
			shmPuts = n.cluster.shm.Stats().Puts
		}
		putRanks(t, n.GRPCAddr(), ns, prefix, cold, w.tp, w.pp)
		if n.cluster.shm != nil {
			// Same host: every part went through shared memory.
			if got := n.cluster.shm.Stats().Puts - shmPuts; got != int64(len(cold)*w.tp*w.pp) {
				t.Errorf("written at TP %d PP %d: %d parts put through shared memory, want %d", w.tp, w.pp, got, len(cold)*w.tp*w.pp)
			}
		}
		l, err := n.client.Lookup(context.Background(), ns, client.Prompt{Tokens: prefix})
		if err != nil || l.CachedBlocks != len(cold) {
			t.Fatalf("written at TP %d PP %d: lookup %+v, %v; want %d blocks", w.tp, w.pp, l, err, len(cold))
		}
		for _, rd := range []struct{ tp, pp int }{{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}} {
			got := readRanks(t, n.client, ns, prefix, len(cold), rd.tp, rd.pp)
			for b := range cold {
				if !bytes.Equal(got[b], cold[b]) {
					t.Errorf("written at TP %d PP %d, read at TP %d PP %d: block %d differs from the cold prefill's", w.tp, w.pp, rd.tp, rd.pp, b)
				}
			}
		}
		req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 16, "temperature": 0}
		got := parseCompletion(t, callAPI(t, "POST", apiURL(n.Node, "/v1/completions"), "", req), false)
		want := coldText(t, c, prompt, prefill.GenerateOptions{MaxTokens: 16})
		if got.Text != want || got.Cached != len(cold)*c.BlockTokens {
			t.Errorf("written at TP %d PP %d: completion %+v; want text %q and %d cached tokens", w.tp, w.pp, got, want, len(cold)*c.BlockTokens)
		}
	}
}

// TestClusterRanksOnTwoNodes: the two ranks of a TP 2 instance write the
// blocks of a prompt through two different nodes; a third client reads the
// blocks whole, and at TP 2, through a third node.
func TestClusterRanksOnTwoNodes(t *testing.T) {
	nodes := startClusterNodes(t, 3, func(_ int, o *Options) { o.Tiers.DRAMBytes = partsDRAM })
	ns := partsNS
	tokens, payloads := partsPrompt(ns, 3, 8) // 2 chunks of 4 blocks: owners differ
	ctx := context.Background()
	for rank := range 2 {
		r := client.Rank{TPRank: rank, TPSize: 2}
		if _, err := nodes[rank].client.PutRank(ctx, ns, tokens, rankParts(t, ns, payloads, r), r); err != nil {
			t.Fatalf("rank %d through node %d: %v", rank, rank, err)
		}
	}
	reader, err := client.Dial(nodes[2].GRPCAddr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	testkit.WaitFor(t, "node 2 to see the assembled blocks", func() bool {
		l, err := reader.Lookup(ctx, ns, client.Prompt{Tokens: tokens})
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		return l.CachedBlocks == len(payloads)
	})
	blocks, err := reader.Get(ctx, ns, client.Prompt{Tokens: tokens})
	if err != nil || len(blocks) != len(payloads) {
		t.Fatalf("Get through node 2: %d blocks, %v", len(blocks), err)
	}
	for i, b := range blocks {
		if !bytes.Equal(b.Payload, payloads[i]) {
			t.Errorf("block %d read whole through node 2 differs from what the ranks wrote", i)
		}
	}
	got := readRanks(t, reader, ns, tokens, len(payloads), 2, 1)
	for i := range got {
		if !bytes.Equal(got[i], payloads[i]) {
			t.Errorf("block %d read at TP 2 through node 2 differs from what the ranks wrote", i)
		}
	}
}

// TestRanksTransports: parts of a namespace with per-head scales, vLLM keys
// and extra keys travel shared memory and TCP (written at TP 2 × PP 2, read
// at TP 4); a gRPC-only client reads parts too (cut from the whole blocks
// BatchGet reads) but cannot put one, and says so.
func TestRanksTransports(t *testing.T) {
	n := openClusterNode(t, t.TempDir(), "n", nil, func(o *Options) { o.Tiers.DRAMBytes = partsDRAM })
	ns := prefixhash.Namespace{Model: "test/parts-vllm", DType: prefixhash.Float8E4M3, BlockTokens: 16, Layers: 3,
		KVHeads: 4, HeadDim: 8, Scales: prefixhash.ScalesPerHead, Scheme: prefixhash.SchemeVLLM, HashSeed: "0", ExtraKeyBytes: 64}
	ctx := context.Background()
	grpcOnly, err := client.Dial(n.GRPCAddr(), client.Options{Transport: client.TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	defer grpcOnly.Close()
	for i, tr := range []string{client.TransportAuto, client.TransportTCP} {
		c, err := client.Dial(n.GRPCAddr(), client.Options{Transport: tr, VerifySharedMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tokens, payloads := partsPrompt(ns, 20+i, 3)
		extra := []prefixhash.ExtraKeys{nil, {prefixhash.VLLMMultimodalKey("img", 2)}}
		for _, r := range ranks(2, 2) {
			if _, err := c.PutRankExtra(ctx, ns, tokens, extra, rankParts(t, ns, payloads, r), r); err != nil {
				t.Fatalf("%s: rank %s: %v", tr, r, err)
			}
		}
		for _, rd := range []*client.Client{c, grpcOnly} {
			l := block.LayoutOf(ns)
			for _, r := range ranks(4, 1) {
				p, _ := r.Part(ns)
				got, err := rd.GetRankExtra(ctx, ns, tokens, extra, r)
				if err != nil || len(got) != len(payloads) {
					t.Fatalf("%s: GetRankExtra %s: %d blocks, %v", tr, r, len(got), err)
				}
				for j, b := range got {
					if want := l.ExtractPart(nil, payloads[j], ns.BlockTokens, p); !bytes.Equal(b.Payload, want) {
						t.Errorf("%s: rank %s, block %d: not its part of what the ranks wrote", tr, r, j)
					}
				}
			}
		}
		if got, _ := c.GetRank(ctx, ns, tokens, client.Rank{TPSize: 2}); len(got) != 1 {
			t.Errorf("%s: GetRank without the extra keys: %d blocks, want 1", tr, len(got))
		}
	}
	tokens, payloads := partsPrompt(ns, 30, 1)
	r := client.Rank{TPRank: 1, TPSize: 2}
	if _, err := grpcOnly.PutRank(ctx, ns, tokens, rankParts(t, ns, payloads, r), r); err == nil || !strings.Contains(err.Error(), "data plane") {
		t.Errorf("PutRank of a part over gRPC alone: %v; want an error naming the data plane", err)
	}
}

// TestRanksIncompleteNeverCount: when only rank 0 of a TP 2 instance
// writes (rank 1 died), no block of the prompt counts: Lookup, GetRank of
// either rank, Get and the OpenAI usage's cached_tokens all see none. When
// rank 1 writes after all, every block does.
func TestRanksIncompleteNeverCount(t *testing.T) {
	c := rankModel()
	n := openClusterNode(t, t.TempDir(), "n", nil, func(o *Options) { o.Prefill.Model, o.Tiers.DRAMBytes = c, partsDRAM })
	prompt := longText(rand.New(rand.NewPCG(8, 8)), 200)
	tokens := prefill.TokenizeBytes(prompt)
	ns, cold := coldBlocks(t, c, tokens)
	ctx := context.Background()
	r0, r1 := client.Rank{TPRank: 0, TPSize: 2}, client.Rank{TPRank: 1, TPSize: 2}
	if _, err := n.client.PutRank(ctx, ns, tokens, rankParts(t, ns, cold, r0), r0); err != nil {
		t.Fatal(err)
	}
	none := func(when string) {
		t.Helper()
		if l, err := n.client.Lookup(ctx, ns, client.Prompt{Tokens: tokens}); err != nil || l.CachedBlocks != 0 {
			t.Errorf("%s: lookup %+v, %v; want no block", when, l, err)
		}
		for _, r := range []client.Rank{r0, r1, {}} {
			if got, err := n.client.GetRank(ctx, ns, tokens, r); err != nil || len(got) != 0 {
				t.Errorf("%s: GetRank %s: %d blocks, %v; want none", when, r, len(got), err)
			}
		}
		if got, err := n.client.Get(ctx, ns, client.Prompt{Tokens: tokens}); err != nil || len(got) != 0 {
			t.Errorf("%s: Get: %d blocks, %v; want none", when, len(got), err)
		}
	}
	none("rank 0 alone")
	req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 4, "temperature": 0}
	if got := parseCompletion(t, callAPI(t, "POST", apiURL(n.Node, "/v1/completions"), "", req), false); got.Cached != 0 {
		t.Errorf("completion with rank 0's parts alone: %d cached tokens, want 0", got.Cached)
	}
	// The completion's engine published the prompt's blocks itself: a
	// second prompt, never completed, shows that rank 1's parts complete
	// rank 0's.
	tokens2 := prefill.TokenizeBytes(longText(rand.New(rand.NewPCG(9, 9)), 100))
	ns2, cold2 := coldBlocks(t, c, tokens2)
	if _, err := n.client.PutRank(ctx, ns2, tokens2, rankParts(t, ns2, cold2, r0), r0); err != nil {
		t.Fatal(err)
	}
	if l, err := n.client.Lookup(ctx, ns2, client.Prompt{Tokens: tokens2}); err != nil || l.CachedBlocks != 0 {
		t.Errorf("second prompt, rank 0 alone: lookup %+v, %v; want no block", l, err)
	}
	if _, err := n.client.PutRank(ctx, ns2, tokens2, rankParts(t, ns2, cold2, r1), r1); err != nil {
		t.Fatal(err)
	}
	if l, err := n.client.Lookup(ctx, ns2, client.Prompt{Tokens: tokens2}); err != nil || l.CachedBlocks != len(cold2) {
		t.Errorf("second prompt, both ranks: lookup %+v, %v; want %d blocks", l, err, len(cold2))
	}
}

// TestRanksConflictsAndBadRanks: a part whose bytes differ from a stored
// part it overlaps is refused with the typed error and leaves nothing of
// itself; a repeated identical part is a no-op; every bad rank is refused
// with an error naming what is valid, before anything is stored; and the
// node keeps serving.
func TestRanksConflictsAndBadRanks(t *testing.T) {
	n := openClusterNode(t, t.TempDir(), "n", nil, func(o *Options) { o.Tiers.DRAMBytes = partsDRAM })
	ns := partsNS
	tokens, payloads := partsPrompt(ns, 5, 3)
	keys := prefixhash.Keys(ns, tokens)
	ctx := context.Background()
	put := func(r client.Rank, payloads [][]byte) error {
		_, err := n.client.PutRank(ctx, ns, tokens, rankParts(t, ns, payloads, r), r)
		return err
	}
	r0, r1 := client.Rank{TPRank: 0, TPSize: 2}, client.Rank{TPRank: 1, TPSize: 2}
	if err := put(r0, payloads); err != nil {
		t.Fatal(err)
	}
	if err := put(r0, payloads); err != nil {
		t.Errorf("the same part again: %v; want a no-op", err)
	}
	other := make([][]byte, len(payloads))
	for i, p := range payloads {
		other[i] = bytes.Clone(p)
		for j := range other[i] {
			other[i][j] ^= 0x5a
		}
	}
	// Heads [1,2) (rank 1 of TP 4) lie inside rank 0 of TP 2's [0,2).
	err := put(client.Rank{TPRank: 1, TPSize: 4}, other)
	var pc *client.PartConflictError
	if !errors.Is(err, client.ErrPartConflict) || !errors.Is(err, client.ErrInvalid) || !errors.As(err, &pc) ||
		pc.Key != keys[0] || pc.Part != (block.Part{L0: 0, L1: 2, H0: 1, H1: 2}) {
		t.Fatalf("a conflicting part: %v; want a *PartConflictError for block 0, heads [1,2)", err)
	}
	// Heads [2,4) with other bytes would have completed the block: they
	// conflict with nothing, so the block is complete, with rank 0's bytes
	// where the refused part tried to go.
	if err := put(r1, payloads); err != nil {
		t.Fatal(err)
	}
	blocks, err := n.client.Get(ctx, ns, client.Prompt{Tokens: tokens})
	if err != nil || len(blocks) != len(payloads) {
		t.Fatalf("Get after both ranks: %d blocks, %v", len(blocks), err)
	}
	for i, b := range blocks {
		if !bytes.Equal(b.Payload, payloads[i]) {
			t.Errorf("block %d: the refused part's bytes got in", i)
		}
	}
	if err := put(r1, payloads); err != nil {
		t.Errorf("a part of a complete block: %v; want a no-op", err)
	}

	// Bad ranks: refused before anything is sent, naming what is valid.
	fresh, freshPayloads := partsPrompt(ns, 6, 2)
	for _, c := range []struct {
		r    client.Rank
		want string
	}{
		{client.Rank{TPRank: 0, TPSize: 3}, "valid"},
		{client.Rank{TPRank: 2, TPSize: 2}, "0 <= rank < size"},
		{client.Rank{TPRank: -1, TPSize: 2}, "0 <= rank < size"},
		{client.Rank{TPSize: -4}, "0 <= rank < size"},
		{client.Rank{PPRank: 0, PPSize: 3}, "a stage holds at least one layer"},
		{client.Rank{PPRank: 2, PPSize: 2}, "0 <= rank < size"},
	} {
		_, err := n.client.PutRank(ctx, ns, fresh, [][]byte{make([]byte, 64)}, c.r)
		if !errors.Is(err, client.ErrInvalid) || !errors.Is(err, block.ErrBadPart) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("PutRank %s: %v; want ErrInvalid, ErrBadPart, naming %q", c.r, err, c.want)
		}
		if _, err := n.client.GetRank(ctx, ns, fresh, c.r); !errors.Is(err, client.ErrInvalid) || !errors.Is(err, block.ErrBadPart) {
			t.Errorf("GetRank %s: %v; want ErrInvalid, ErrBadPart", c.r, err)
		}
	}
	// A payload that is not the rank's part's length.
	if _, err := n.client.PutRank(ctx, ns, fresh, [][]byte{freshPayloads[0]}, r0); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "heads [0,2)") {
		t.Errorf("PutRank of a whole block as rank 0 of 2: %v; want ErrInvalid naming the part", err)
	}
	// Bad ranges on the wire, from a client that checks nothing: a record
	// whose part range is not a part of its block is refused
	// (StatusError), as are reads of such ranges, item by item.
	wire, err := transfer.NewClient(n.DataAddr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer wire.Close()
	fkey := prefixhash.Keys(ns, fresh)[0]
	half := block.Part{L0: 0, L1: 2, H0: 0, H1: 2}
	payload := block.LayoutOf(ns).ExtractPart(nil, freshPayloads[0], ns.BlockTokens, half)
	rec, _, err := block.AppendPartHeaderExt(nil, 0, ns, ns.RootLink(), fresh[:ns.BlockTokens], nil, half, payload)
	if err != nil {
		t.Fatal(err)
	}
	rec = append(rec, payload...)
	badParts := []block.Part{{L0: 0, L1: 3, H0: 0, H1: 4}, {L0: 0, L1: 2, H0: 1, H1: 3}, {L0: 1, L1: 1, H0: 0, H1: 4}, {L0: 0, L1: 2, H0: 0, H1: 3}}
	for _, bp := range badParts {
		if got := wirePut(t, wire, fkey, withPart(t, rec, bp)); got != transfer.StatusError {
			t.Errorf("a record of %s: status %s, want %s", bp, got, transfer.StatusError)
		}
	}
	keys4 := []prefixhash.Key{keys[0], keys[0], keys[0], keys[0]}
	r, err := wire.GetParts(ctx, keys4, badParts)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range r.Status {
		if st != transfer.StatusError {
			t.Errorf("a read of %s of a stored block: status %s, want %s", badParts[i], st, transfer.StatusError)
		}
	}
	r.Release()
	if l, err := n.client.Lookup(ctx, ns, client.Prompt{Tokens: fresh}); err != nil || l.CachedBlocks != 0 || len(n.cluster.local.Partials()) != 0 {
		t.Errorf("after the refused puts: lookup %+v, %v, %d incomplete blocks; want nothing stored", l, err, len(n.cluster.local.Partials()))
	}
	if got := wirePut(t, wire, fkey, withPart(t, rec, half)); got != transfer.StatusOK {
		t.Errorf("the same record with its own range: status %s; want it stored (the refusals were the ranges')", got)
	}
	// The node keeps serving.
	if _, err := n.client.Put(ctx, ns, client.Prompt{Tokens: fresh}, freshPayloads); err != nil {
		t.Fatal(err)
	}
	if got := readRanks(t, n.client, ns, fresh, len(freshPayloads), 4, 2); !bytes.Equal(got[1], freshPayloads[1]) {
		t.Error("a whole put after the refusals does not read back at TP 4 PP 2")
	}
}

// withPart returns a copy of the encoded record rec with its part range set
// to p, valid or not, and its header checksum made right: what a client
// that checks nothing could send.
func withPart(t testing.TB, rec []byte, p block.Part) []byte {
	t.Helper()
	h, err := block.DecodeHeader(rec, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := bytes.Clone(rec)
	for i, v := range []int{p.L0, p.L1, p.H0, p.H1} {
		binary.LittleEndian.PutUint32(out[104+4*i:], uint32(v))
	}
	n := len(h.Tokens)
	ext := int(binary.LittleEndian.Uint32(out[block.FixedHeaderLen+4*n:]))
	var d xxhash.Digest
	d.Reset()
	d.Write(out[:120])
	d.Write(out[block.FixedHeaderLen : block.FixedHeaderLen+4*n+4+ext])
	binary.LittleEndian.PutUint64(out[120:], d.Sum64())
	return out
}

// wirePut puts one value under key through a data-plane client and returns
// its status.
func wirePut(t testing.TB, c *transfer.Client, key prefixhash.Key, v []byte) transfer.Status {
	t.Helper()
	st, err := c.Put(context.Background(), []prefixhash.Key{key}, [][]byte{v})
	if err != nil || len(st) != 1 {
		t.Fatalf("put: %v, %v", st, err)
	}
	return st[0]
}

// TestRanksLatentStoredOnce: the 8 TP ranks of an MLA instance put the same
// latent blocks at once; the latent crosses to the node once (its data
// plane's byte counters), the node stores one copy, and every rank reads
// the whole latent.
func TestRanksLatentStoredOnce(t *testing.T) {
	n := openClusterNode(t, t.TempDir(), "n", nil, func(o *Options) { o.Tiers.DRAMBytes = partsDRAM })
	ns := latentNS
	tokens, payloads := partsPrompt(ns, 4, 6)
	bytesIn := func() int64 {
		in := n.cluster.data.Stats().BytesIn
		if n.cluster.shm != nil {
			in += n.cluster.shm.Stats().BytesIn
		}
		return in
	}
	before := bytesIn()
	putRanks(t, n.GRPCAddr(), ns, tokens, payloads, 8, 1)
	one := int64(len(payloads) * block.EncodedLen(ns.BlockTokens, ns.BlockBytes()))
	if in := bytesIn() - before; in < one || float64(in) > 1.05*float64(one) {
		t.Errorf("8 ranks sent %d bytes for %d of one copy; want one copy", in, one)
	}
	var blocks, stored int64
	for _, x := range n.cache.Stats().Namespaces {
		if x.Digest == ns.Digest() {
			blocks, stored = x.Blocks, x.Bytes
		}
	}
	if blocks != int64(len(payloads)) || stored != one {
		t.Errorf("the node stores %d blocks, %d bytes; want %d blocks, %d bytes: one copy", blocks, stored, len(payloads), one)
	}
	for _, r := range ranks(8, 1) {
		got, err := n.client.GetRank(context.Background(), ns, tokens, r)
		if err != nil || len(got) != len(payloads) {
			t.Fatalf("rank %s: %d blocks, %v", r, len(got), err)
		}
		for i, b := range got {
			if !bytes.Equal(b.Payload, payloads[i]) {
				t.Errorf("rank %s: block %d is not the whole latent", r, i)
			}
		}
	}
}

// TestGetRankOwnsTokens: what GetRank returns is the caller's to keep, its
// tokens too, after the client that read it (its shared-memory mappings)
// is closed: a part cut from a block read in place used to keep tokens
// that viewed the node's arena.
func TestGetRankOwnsTokens(t *testing.T) {
	n := openClusterNode(t, t.TempDir(), "n", nil, func(o *Options) { o.Tiers.DRAMBytes = partsDRAM })
	ns := partsNS
	tokens, payloads := partsPrompt(ns, 5, 2)
	ctx := context.Background()
	if _, err := n.client.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(n.GRPCAddr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.GetRank(ctx, ns, tokens, client.Rank{TPRank: 1, TPSize: 2})
	c.Close()
	if err != nil || len(got) != len(payloads) {
		t.Fatalf("GetRank: %d blocks, %v", len(got), err)
	}
	for i, b := range got {
		if !slices.Equal(b.Tokens, tokens[i*ns.BlockTokens:(i+1)*ns.BlockTokens]) {
			t.Fatalf("block %d: tokens %v after the client closed", i, b.Tokens)
		}
	}
}

//lint:file-ignore SA1019 the node's tests call the client's deprecated methods, kept one release (client/deprecated.go).
