package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// tinyModel is small enough for -race: two layers, grouped-query attention,
// 16-token blocks of 8 KiB.
func tinyModel() prefill.Config {
	c := prefill.Config{Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96, Vocab: 260,
		MaxContext: 1024, BlockTokens: 16}
	c.EnsureDefaults()
	return c
}

// prefillNode is a node with the tiny model over a fake cache, served on
// loopback.
type prefillNode struct {
	*Node
	cache  *fakeCache
	c      *client.Client
	raw    kvmeshv1.PrefillServiceClient
	ns     prefixhash.Namespace
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startPrefillNode serves a node with the tiny model on dataDir (a fresh
// one when empty) over cache (a fresh fake when nil). before, when set,
// runs between New and Serve.
func startPrefillNode(t testing.TB, dataDir string, cache *fakeCache, mod func(*Options), before func(*Node)) *prefillNode {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	if cache == nil {
		cache = newFakeCache(64 << 20)
	}
	opts := Options{
		DataDir: dataDir,
		Listen:  ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Tiers:   TierOptions{DRAMBytes: 64 * MiB, NVMeBytes: 64 * MiB},
		Logger:  slog.New(slog.DiscardHandler),
		Prefill: PrefillOptions{Model: tinyModel()},
	}
	if mod != nil {
		mod(&opts)
	}
	n, err := New(opts, cache)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if before != nil {
		before(n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pn := &prefillNode{Node: n, cache: cache, cancel: cancel, done: make(chan error, 1)}
	go func() { pn.done <- n.Serve(ctx) }()
	if pn.c, err = client.Dial(n.GRPCAddr(), client.Options{}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	pn.raw = kvmeshv1.NewPrefillServiceClient(conn)
	eng, err := pn.c.Engine(context.Background())
	if err != nil {
		t.Fatalf("Engine: %v", err)
	}
	pn.ns = eng.Namespace
	t.Cleanup(func() {
		pn.stop(t)
		pn.c.Close()
		conn.Close()
	})
	return pn
}

// stop stops the node (once) and checks that it shut down cleanly.
func (pn *prefillNode) stop(t testing.TB) {
	t.Helper()
	pn.once.Do(func() {
		pn.cancel()
		if err := <-pn.done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if got := pn.cache.pins.Load(); got != 0 {
			t.Errorf("%d blocks still pinned after shutdown", got)
		}
	})
}

func (pn *prefillNode) run(t *testing.T, tokens []uint32, session string) client.PrefillResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := pn.c.Prefill(ctx, client.PrefillRequest{Tokens: tokens, Session: session, ReturnLogits: true})
	if err != nil {
		t.Fatalf("Prefill: %v", err)
	}
	return r
}

// waitCached waits until the engine has published what it computed, and
// checks that the node's cache then holds the full blocks of tokens.
func (pn *prefillNode) waitCached(t *testing.T, tokens []uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pn.Node.prefill.engine.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := pn.c.Lookup(ctx, pn.ns, client.Prompt{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(tokens) / pn.ns.BlockTokens * pn.ns.BlockTokens; l.CachedTokens != want {
		t.Fatalf("%d of %d tokens cached after the engine published", l.CachedTokens, want)
	}
}

func randPrompt(r *rand.Rand, n, vocab int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(r.IntN(vocab))
	}
	return t
}

func relErr(got, want []float32) float64 {
	var diff, scale float64
	for i := range want {
		diff = max(diff, math.Abs(float64(got[i])-float64(want[i])))
		scale = max(scale, math.Abs(float64(want[i])))
	}
	return diff / scale
}

// TestPrefillHitEqualsColdThroughNode: for random prompts and split points,
// a node that holds a prompt's prefix (from an earlier request) answers the
// whole prompt with the logits a node with an empty cache computes, within
// 1e-4 relative, and reports the prefix as cached tokens.
func TestPrefillHitEqualsColdThroughNode(t *testing.T) {
	warm := startPrefillNode(t, "", nil, nil, nil)
	cold := startPrefillNode(t, "", nil, nil, nil)
	c := tinyModel()
	r := rand.New(rand.NewPCG(31, 32))
	for i := range 6 {
		n := 2 + r.IntN(400)
		tokens := randPrompt(r, n, c.Vocab)
		split := 1 + r.IntN(n-1)
		warm.run(t, tokens[:split], "")
		warm.waitCached(t, tokens[:split])
		got := warm.run(t, tokens, "")
		want := cold.run(t, tokens, "")
		if u := (client.Usage{PromptTokens: n, CachedTokens: split / c.BlockTokens * c.BlockTokens}); got.Usage != u {
			t.Errorf("case %d (n=%d, split=%d): usage %+v, want %+v", i, n, split, got.Usage, u)
		}
		if want.Usage.CachedTokens != 0 {
			t.Errorf("case %d: the cold node reports %d cached tokens", i, want.Usage.CachedTokens)
		}
		if e := relErr(got.Logits, want.Logits); e > 1e-4 {
			t.Errorf("case %d (n=%d, split=%d): logits with a prefix hit differ from cold by %.2g", i, n, split, e)
		}
		if len(got.TopTokens) != 5 || got.TopTokens[0] != want.TopTokens[0] {
			t.Errorf("case %d: top tokens %v, cold %v", i, got.TopTokens, want.TopTokens)
		}
		// Nodes of the same model agree on keys: cold cached the prompt too.
		cold.waitCached(t, tokens)
	}
}

// TestPrefillPrefixFromPeer: in a cluster of three real nodes (Open,
// memberlist, the data planes), a prefix prefilled on one member is a hit for
// the whole prompt on another, and the logits equal the cold ones within
// 1e-4 relative, for random prompts, split points and pairs of members.
func TestPrefillPrefixFromPeer(t *testing.T) {
	nodes := startClusterNodes(t, 3, func(_ int, o *Options) { o.Prefill.Model = tinyModel() })
	c := tinyModel()
	cold, err := prefill.New(nil, prefill.Options{Config: c, Weights: seededWeights(c, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Close()
	eng, err := nodes[0].client.Engine(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(38, 38))
	for i := range 5 {
		a := r.IntN(len(nodes))
		b := (a + 1 + r.IntN(len(nodes)-1)) % len(nodes)
		n := 2*c.BlockTokens + r.IntN(300)
		tokens := randPrompt(r, n, c.Vocab)
		split := c.BlockTokens + r.IntN(n-c.BlockTokens)
		hit := split / c.BlockTokens * c.BlockTokens
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := nodes[a].client.Prefill(ctx, client.PrefillRequest{Tokens: tokens[:split]}); err != nil {
			t.Fatal(err)
		}
		if err := nodes[a].Node.prefill.engine.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		// Each step has its own deadline, so that a slow prefill on a busy
		// machine does not eat the wait's.
		testkit.WaitFor(t, fmt.Sprintf("node %d to see the prefix node %d computed", b, a), func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l, err := nodes[b].client.Lookup(ctx, eng.Namespace, client.Prompt{Tokens: tokens[:split]})
			return err == nil && l.CachedTokens == hit
		})
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		got, err := nodes[b].client.Prefill(ctx, client.PrefillRequest{Tokens: tokens, ReturnLogits: true})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		want, err := cold.Prefill(context.Background(), tokens, "")
		if err != nil {
			t.Fatal(err)
		}
		if got.Usage != (client.Usage{PromptTokens: n, CachedTokens: hit}) {
			t.Errorf("case %d (n=%d, split=%d, prefix on node %d, prompt on node %d): usage %+v, want %d cached",
				i, n, split, a, b, got.Usage, hit)
		}
		if e := relErr(got.Logits, want.Logits); e > 1e-4 {
			t.Errorf("case %d (n=%d, split=%d, node %d to node %d): logits differ from cold by %.2g", i, n, split, a, b, e)
		}
	}
}

// gatedCache returns a fake cache whose Gets block, while hold(true) is in
// force, until the Get's context ends; entered receives a token when a Get
// blocks.
func gatedCache() (c *fakeCache, hold func(bool), entered chan struct{}) {
	c = newFakeCache(64 << 20)
	var on atomic.Bool
	entered = make(chan struct{}, 16)
	c.gate = func(ctx context.Context, _ int64) error {
		if !on.Load() {
			return nil
		}
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	return c, on.Store, entered
}

// holdEngine starts a synchronous prefill of prompt, whose prefix is
// cached, that blocks in the cache until the node stops: while it waits, no
// queued request computes. prompt must have a cached block.
func holdEngine(t *testing.T, pn *prefillNode, hold func(bool), entered chan struct{}, prompt []uint32) chan error {
	t.Helper()
	hold(true)
	errc := make(chan error, 1)
	go func() {
		_, err := pn.c.Prefill(context.Background(), client.PrefillRequest{Tokens: prompt})
		errc <- err
	}()
	<-entered
	return errc
}

// TestPrefillQueueSurvivesRestart: requests queued behind a synchronous
// prefill are still queued when the node stops; the node reopened on the
// same data dir runs them, and their results equal cold prefills.
func TestPrefillQueueSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	cache, hold, entered := gatedCache()
	first := startPrefillNode(t, dir, cache, func(o *Options) { o.ShutdownTimeout = time.Millisecond }, nil)
	c := tinyModel()
	r := rand.New(rand.NewPCG(33, 33))
	blocker := randPrompt(r, 3*c.BlockTokens, c.Vocab)
	first.run(t, blocker, "")
	first.waitCached(t, blocker)
	held := holdEngine(t, first, hold, entered, blocker)

	prompts := make([][]uint32, 4)
	ids := make([]string, len(prompts))
	for i := range prompts {
		prompts[i] = randPrompt(r, 20+r.IntN(200), c.Vocab)
		if i == 3 {
			prompts[i] = append(append([]uint32(nil), blocker...), prompts[i]...) // shares the cached prefix
		}
		res, err := first.c.Prefill(context.Background(), client.PrefillRequest{Tokens: prompts[i], Session: "s", Queue: true, ReturnLogits: true})
		if err != nil {
			t.Fatalf("queue prompt %d: %v", i, err)
		}
		if res.State != client.PrefillQueued || res.RequestID == "" {
			t.Fatalf("queue prompt %d: %+v, want a queued request id", i, res)
		}
		ids[i] = res.RequestID
	}
	for i, id := range ids {
		res, err := first.c.GetResult(context.Background(), id)
		if err != nil || (res.State != client.PrefillQueued && res.State != client.PrefillRunning) {
			t.Fatalf("request %d before the restart: %+v, %v; want queued or running", i, res, err)
		}
	}
	first.stop(t)
	if err := <-held; err == nil {
		t.Errorf("the held synchronous prefill succeeded across the shutdown")
	}

	second := startPrefillNode(t, dir, nil, nil, func(n *Node) {
		if pending, _ := n.prefill.q.depth(); pending != len(ids) {
			t.Errorf("reopened queue holds %d pending requests, want %d", pending, len(ids))
		}
	})
	cold := startPrefillNode(t, "", nil, nil, nil)
	for i, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := second.c.WaitResult(ctx, id, time.Millisecond)
		cancel()
		if err != nil || res.State != client.PrefillDone {
			t.Fatalf("request %d after the restart: %+v, %v", i, res, err)
		}
		want := cold.run(t, prompts[i], "")
		if res.Usage.PromptTokens != len(prompts[i]) || len(res.TopTokens) != 5 || res.Session != "s" {
			t.Errorf("request %d: %+v", i, res)
		}
		if e := relErr(res.Logits, want.Logits); e > 1e-4 {
			t.Errorf("request %d: queued logits differ from cold by %.2g", i, e)
		}
	}
}

// TestPrefillQueueFull: a queue of 2 refuses a third request with
// ResourceExhausted, and accepts work again once it drained.
func TestPrefillQueueFull(t *testing.T) {
	cache, hold, entered := gatedCache()
	pn := startPrefillNode(t, "", cache, func(o *Options) { o.Prefill.QueueSize = 2 }, nil)
	c := tinyModel()
	r := rand.New(rand.NewPCG(34, 34))
	blocker := randPrompt(r, 2*c.BlockTokens, c.Vocab)
	pn.run(t, blocker, "")
	pn.waitCached(t, blocker)

	// Hold the engine with a synchronous prefill we can cancel.
	hold(true)
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		_, err := pn.c.Prefill(ctx, client.PrefillRequest{Tokens: blocker})
		held <- err
	}()
	<-entered
	var ids []string
	for i := range 3 {
		res, err := pn.c.Prefill(context.Background(), client.PrefillRequest{Tokens: randPrompt(r, 30, c.Vocab), Queue: true})
		if i < 2 {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			ids = append(ids, res.RequestID)
			continue
		}
		if st, _ := status.FromError(errors.Unwrap(err)); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "limit is 2") {
			t.Fatalf("third request into a queue of 2: %v; want ResourceExhausted naming the limit", err)
		}
		wantRefusal(t, err, codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_QUEUE_FULL)
	}
	hold(false)
	cancel() // the engine is free: the queue drains
	<-held
	for _, id := range ids {
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		if res, err := pn.c.WaitResult(wctx, id, time.Millisecond); err != nil || res.State != client.PrefillDone {
			t.Fatalf("%s: %+v, %v", id, res, err)
		}
		wcancel()
	}
	if _, err := pn.c.Prefill(context.Background(), client.PrefillRequest{Tokens: randPrompt(r, 30, c.Vocab), Queue: true}); err != nil {
		t.Fatalf("after the queue drained: %v", err)
	}
}

// TestPrefillBadInput: every malformed request is InvalidArgument naming
// the field, synchronous or queued, and the node keeps serving.
func TestPrefillBadInput(t *testing.T) {
	pn := startPrefillNode(t, "", nil, nil, nil)
	c := tinyModel()
	other := testNS // another namespace than the engine's
	for _, queue := range []bool{false, true} {
		for _, tc := range []struct {
			name, field, says string
			req               *kvmeshv1.PrefillRequest
		}{
			{"empty prompt", "tokens", "empty", &kvmeshv1.PrefillRequest{}},
			{"token outside the vocabulary", "tokens", "outside the vocabulary", &kvmeshv1.PrefillRequest{Tokens: []uint32{1, 2, uint32(c.Vocab)}}},
			{"huge token", "tokens", "outside the vocabulary", &kvmeshv1.PrefillRequest{Tokens: []uint32{math.MaxUint32}}},
			{"over the context", "tokens", "the context holds 1024", &kvmeshv1.PrefillRequest{Tokens: make([]uint32, c.MaxContext+1)}},
			{"other namespace", "namespace", "not the namespace", &kvmeshv1.PrefillRequest{Namespace: client.NamespaceProto(other), Tokens: []uint32{1}}},
			{"invalid namespace", "namespace", "", &kvmeshv1.PrefillRequest{Namespace: &kvmeshv1.Namespace{Model: "x"}, Tokens: []uint32{1}}},
			{"other model", "model", "not this node's model", &kvmeshv1.PrefillRequest{Model: "meta/llama", Tokens: []uint32{1}}},
			{"long session", "session", "at most 256", &kvmeshv1.PrefillRequest{Session: strings.Repeat("s", 257), Tokens: []uint32{1}}},
		} {
			tc.req.Queue = queue
			_, err := pn.raw.Prefill(context.Background(), tc.req)
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), tc.field+":") || !strings.Contains(st.Message(), tc.says) {
				t.Errorf("%s (queue %v): %v; want InvalidArgument starting %q and saying %q", tc.name, queue, err, tc.field+":", tc.says)
			}
		}
	}
	for _, tc := range []struct {
		id   string
		code codes.Code
	}{{"", codes.InvalidArgument}, {"nope", codes.NotFound}} {
		if _, err := pn.raw.GetResult(context.Background(), &kvmeshv1.GetResultRequest{RequestId: tc.id}); status.Code(err) != tc.code {
			t.Errorf("GetResult(%q): %v, want %s", tc.id, err, tc.code)
		}
	}
	// Still serving, and the engine's own namespace and model are accepted.
	resp, err := pn.raw.Prefill(context.Background(), &kvmeshv1.PrefillRequest{Namespace: client.NamespaceProto(pn.ns), Model: pn.ns.Model,
		Tokens: prefill.TokenizeBytes("still serving")})
	res := resp.GetResult()
	if err != nil || res.GetUsage().GetPromptTokens() != 13 || len(res.GetTopTokens()) != 5 {
		t.Fatalf("after the refusals: %v, %v", res, err)
	}
	if res.GetModel() != pn.ns.Model || res.GetState() != kvmeshv1.PrefillState_PREFILL_STATE_DONE {
		t.Errorf("result %v", res)
	}
}

// TestPrefillSessionIsAHint: the session comes from the request or the
// x-session-affinity header, is echoed and counted, and never changes what
// is cached or hit.
func TestPrefillSessionIsAHint(t *testing.T) {
	pn := startPrefillNode(t, "", nil, nil, nil)
	c := tinyModel()
	tokens := randPrompt(rand.New(rand.NewPCG(35, 35)), 4*c.BlockTokens+3, c.Vocab)
	pn.run(t, tokens, "alice")
	pn.waitCached(t, tokens)
	ctx := metadata.AppendToOutgoingContext(context.Background(), SessionHeader, "bob")
	pr, err := pn.raw.Prefill(ctx, &kvmeshv1.PrefillRequest{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if res := pr.GetResult(); res.GetSession() != "bob" || res.GetUsage().GetCachedTokens() != uint64(4*c.BlockTokens) {
		t.Errorf("another session, from the header: %v; want session bob and the 64 cached tokens alice's request left", res)
	}
	pr, err = pn.raw.Prefill(context.Background(), &kvmeshv1.PrefillRequest{Tokens: tokens})
	if res := pr.GetResult(); err != nil || res.GetUsage().GetCachedTokens() != uint64(4*c.BlockTokens) || res.GetSession() != "" {
		t.Errorf("no session: %v, %v", res, err)
	}

	resp, err := http.Get("http://" + pn.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"kvmesh_prefill_session_hints_total 2",
		`kvmesh_prefill_requests_total{mode="sync"} 3`,
		`kvmesh_prefill_cached_tokens_total{mode="sync"} 128`,
		"kvmesh_prefill_queue_pending 0",
		`kvmesh_prefill_ttft_seconds_count{mode="sync"} 3`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestPrefillResultsExpire: results are kept for ResultTTL, then NotFound;
// and at most MaxResults are kept, oldest deleted first.
func TestPrefillResultsExpire(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	pn := startPrefillNode(t, "", nil, func(o *Options) { o.Prefill.ResultTTL = time.Minute; o.Prefill.MaxResults = 2 },
		func(n *Node) { n.prefill.q.opts.now = clock })
	c := tinyModel()
	r := rand.New(rand.NewPCG(36, 36))
	var ids []string
	for range 3 {
		res, err := pn.c.Prefill(context.Background(), client.PrefillRequest{Tokens: randPrompt(r, 20, c.Vocab), Queue: true})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := pn.c.WaitResult(wctx, res.RequestID, time.Millisecond); err != nil {
			t.Fatal(err)
		}
		cancel()
		ids = append(ids, res.RequestID)
		now.Add(int64(time.Second))
	}
	get := func(id string) codes.Code {
		_, err := pn.c.GetResult(context.Background(), id)
		return status.Code(errors.Unwrap(err))
	}
	if get(ids[0]) != codes.NotFound || get(ids[1]) != codes.OK || get(ids[2]) != codes.OK {
		t.Errorf("with MaxResults 2: results %s %s %s; want the oldest gone", get(ids[0]), get(ids[1]), get(ids[2]))
	}
	now.Add(int64(time.Minute) - int64(time.Second)) // ids[1] finished 61s ago, ids[2] 60s ago
	if get(ids[1]) != codes.NotFound || get(ids[2]) != codes.NotFound {
		t.Errorf("after the TTL: %s %s, want NotFound", get(ids[1]), get(ids[2]))
	}
	q := pn.Node.prefill.q
	q.expire()
	if _, kept := q.depth(); kept != 0 {
		t.Errorf("%d results kept after the sweep", kept)
	}
}

// TestPrefillDisabled: with the engine off, PrefillService is not served.
func TestPrefillDisabled(t *testing.T) {
	tn := startNode(t, func(o *Options) { o.Prefill.Disabled = true })
	if _, err := tn.client.Engine(context.Background()); !errors.Is(err, client.ErrNoEngine) {
		t.Errorf("Engine on a node without one: %v", err)
	}
}
