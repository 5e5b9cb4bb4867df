package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
)

// scaleLookup gathers the data-plane phase's figures: lookups, and what a
// leave with handoff and a crash do to them.
type scaleLookup struct {
	rows    []scaleLookupRow
	changes []scaleChangeRow
	pushes  []scalePushRow
}

// scaleLookupRow is one prompt length and case at one size.
type scaleLookupRow struct {
	Nodes        int `json:"nodes"`
	PromptTokens int `json:"prompt_tokens"`
	// Rounds is how the lookup asks: "rounds" (store's default: the first
	// chunk's owners, then up to LookupRoundPeers more, then the rest) or
	// "one" (LookupRoundPeers -1: every owner at once, kvmesh before
	// issue 35).
	Mode string `json:"mode"`
	// Case is "full" (every block cached) or "1k cached" (a prompt that
	// shares its first 1,024 tokens with a cached one, and nothing after).
	Case         string `json:"case"`
	CachedTokens int    `json:"cached_tokens"`
	// Peers is the mean number of peers asked per lookup; Rounds the mean
	// number of sequential rounds.
	Peers    float64 `json:"peers"`
	MaxPeers int     `json:"max_peers" table:"-"`
	Rounds   float64 `json:"rounds"`
	// P50MS and P99MS are the lookup's latency: network (virtual: each
	// round as long as its slowest call's round trip plus the owner's
	// service time) plus the lookup's CPU time: this process's, the
	// asking node's and every owner's part together, as if on one core
	// (an upper bound: owners answer in parallel), counted by the kernel
	// so that other processes' load does not inflate it.
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	// NetP50MS and NetP99MS are the network part alone.
	NetP50MS float64 `json:"net_p50_ms"`
	NetP99MS float64 `json:"net_p99_ms"`
	CPUP50MS float64 `json:"cpu_p50_ms" table:"-"`
	CPUP99MS float64 `json:"cpu_p99_ms"`
	// BoundP50MS and BoundP99MS are the lower bound: one round trip to
	// the slowest owner whose answer is needed (the owners of the chunks
	// up to the first that misses, the nearest replica of each).
	BoundP50MS float64 `json:"bound_p50_ms"`
	BoundP99MS float64 `json:"bound_p99_ms"`
	Lookups    int     `json:"lookups"`
	// Wrong counts lookups whose answer was not CachedTokens.
	Wrong int `json:"wrong"`
}

// scaleChangeRow is what a leave (with its handoff) or a crash did to the
// cached prompts.
type scaleChangeRow struct {
	Nodes int    `json:"nodes"`
	Event string `json:"event"` // leave (handoff first) or crash
	// Handed is the blocks the leaving node pushed to their next owners.
	Handed int `json:"handed_blocks"`
	// Whole is the share of cached prompts a lookup still finds whole;
	// TokensKept the share of their cached tokens still found.
	Whole      float64 `json:"whole_prompts"`
	TokensKept float64 `json:"tokens_kept"`
	Prompts    int     `json:"prompts"`
}

// scalePushRow is what publishing the prompts cost in pushes and peers.
type scalePushRow struct {
	Nodes int `json:"nodes"`
	// PushesPerPrompt is the push RPCs per prompt put, by length.
	PushesPer1k   float64 `json:"pushes_per_1k_prompt"`
	PushesPer16k  float64 `json:"pushes_per_16k_prompt"`
	PushesPer128k float64 `json:"pushes_per_128k_prompt"`
	// PushWorkers is the push workers (goroutine and queue) a producer
	// holds once its pushes are done, the most of any node.
	PushWorkers int `json:"push_workers_max"`
	// PeersHeld is the most peers one node called (lookups, gets, pushes)
	// over the phase: what a node holds a data-plane client and a gRPC
	// connection for, as kvmesh serve keeps them until a peer leaves.
	PeersHeld int `json:"peers_held_max"`
}

// scalePrompt is a cached prompt of the phase.
type scalePrompt struct {
	tokens   int
	producer int
	chain    []prefixhash.Key
	// partial is the chain of a prompt that shares the first partialBlocks
	// blocks and nothing after.
	partial []prefixhash.Key
}

const scaleBlockTokens = 16

// partialTokens is how much a "1k cached" prompt shares with a cached one.
const partialTokens = 1024

// measure runs the data-plane phase at n nodes: with the store's lookup
// rounds, then again with one round, for comparison.
func (s *scaleLookup) measure(ctx context.Context, o ScaleOptions, n int, quick bool, bar Bar) error {
	for _, mode := range []string{"rounds", "one"} {
		if err := s.measureMode(ctx, o, n, quick, bar, mode); err != nil {
			return err
		}
	}
	return nil
}

func (s *scaleLookup) measureMode(ctx context.Context, o ScaleOptions, n int, quick bool, bar Bar, mode string) error {
	// The rounds' real deadline is far: the store's own (100ms) applies on
	// the virtual clock, where this machine's load does not reach.
	co := store.ClusterOptions{LookupTimeout: time.Minute, GetTimeout: time.Minute}
	if mode == "one" {
		co.LookupRoundPeers = -1
	}
	ds, err := newDataSim(n, &o.Links, co, 64<<20)
	if err != nil {
		return err
	}
	defer ds.Close()
	ds.dilation = o.Dilation
	rng := rand.New(rand.NewPCG(o.Seed, uint64(n)+7))
	ns := lookupNamespace(scaleBlockTokens)
	lengths := []int{1 << 10, 16 << 10, 128 << 10}
	perLength := pick(quick, 3, 2)

	// Publish the prompts through random producers, as prefills would.
	var prompts []scalePrompt
	pushes := map[int]uint64{}
	for _, length := range lengths {
		before := ds.c.puts.Load()
		for range perLength {
			p, err := s.publish(ctx, ds, ns, rng, length)
			if err != nil {
				return err
			}
			prompts = append(prompts, p)
		}
		if err := flushAll(ctx, ds); err != nil {
			return err
		}
		pushes[length] = ds.c.puts.Load() - before
	}
	push := scalePushRow{Nodes: n, PushesPer1k: float64(pushes[1<<10]) / float64(perLength),
		PushesPer16k: float64(pushes[16<<10]) / float64(perLength), PushesPer128k: float64(pushes[128<<10]) / float64(perLength)}
	for _, d := range ds.nodes {
		push.PushWorkers = max(push.PushWorkers, int(d.cluster.Stats().PushWorkers))
	}

	lookups := pick(quick, 200, 40)
	for _, length := range lengths {
		for _, partial := range []bool{false, true} {
			if partial && length == 1<<10 {
				continue
			}
			bar.Describe(fmt.Sprintf("scale: lookup (%s), %d nodes: %dk-token prompts", mode, n, length>>10))
			var ps []scalePrompt
			for _, p := range prompts {
				if p.tokens == length {
					ps = append(ps, p)
				}
			}
			row, err := s.lookups(ctx, ds, ps, partial, lookups, rng)
			if err != nil {
				return err
			}
			row.Nodes, row.PromptTokens, row.Mode = n, length, mode
			s.rows = append(s.rows, row)
		}
	}

	if mode != "rounds" {
		return nil
	}
	// A leave with handoff, then a crash: what lookups still find.
	for _, event := range []string{"leave", "crash"} {
		victim := s.victim(ds, prompts, rng)
		handed := 0
		if event == "leave" {
			handed = len(victim.cluster.Handoff(ctx, 1<<30))
		}
		victim.gone.Store(true)
		ds.remove(victim.id)
		row := scaleChangeRow{Nodes: n, Event: event, Handed: handed, Prompts: len(prompts)}
		var whole, kept, total int
		for _, p := range prompts {
			from := ds.nodes[(p.producer+1+rng.IntN(n-1))%n]
			for from.gone.Load() || from == victim {
				from = ds.nodes[rng.IntN(n)]
			}
			got := from.cluster.LongestPrefix(ctx, p.chain, scaleBlockTokens)
			if got == len(p.chain) {
				whole++
			}
			kept += got
			total += len(p.chain)
		}
		row.Whole = float64(whole) / float64(len(prompts))
		row.TokensKept = float64(kept) / float64(total)
		s.changes = append(s.changes, row)
	}
	for _, d := range ds.nodes {
		push.PeersHeld = max(push.PeersHeld, ds.held(d.id))
	}
	s.pushes = append(s.pushes, push)
	return nil
}

// publish puts a new prompt of length tokens through a random node and
// returns it, with a variant that shares its first partialTokens tokens and
// nothing after.
func (s *scaleLookup) publish(ctx context.Context, ds *dataSim, ns prefixhash.Namespace, rng *rand.Rand, length int) (scalePrompt, error) {
	tokens := make([]uint32, length)
	for i := range tokens {
		tokens[i] = uint32(rng.IntN(DefaultVocab))
	}
	other := slices.Clone(tokens)
	for i := partialTokens; i < len(other); i++ {
		other[i] = uint32(rng.IntN(DefaultVocab))
	}
	return s.publishTokens(ctx, ds, ns, rng.IntN(len(ds.nodes)), tokens, other)
}

// publishTokens puts the blocks of tokens through node producer (its
// store.Cluster.Put: kept there, queued for their owners) and returns the
// prompt, with the chain of partial, a prompt that is not put.
func (s *scaleLookup) publishTokens(ctx context.Context, ds *dataSim, ns prefixhash.Namespace, producer int, tokens, partial []uint32) (scalePrompt, error) {
	p := scalePrompt{tokens: len(tokens), producer: producer}
	cb := prefixhash.ChunkBlocks(scaleBlockTokens, ds.opts.ChunkTokens)
	payload := make([]byte, ns.BlockBytes())
	blocks := make([][]byte, 0, len(tokens)/scaleBlockTokens)
	parent := ns.Root()
	for i := 0; i+scaleBlockTokens <= len(tokens); i += scaleBlockTokens {
		stampKey(payload, uint64(i))
		b, key, err := block.Encode(nil, ns, parent, tokens[i:i+scaleBlockTokens], payload)
		if err != nil {
			return p, fmt.Errorf("bench: scale: encode: %w", err)
		}
		blocks = append(blocks, b)
		p.chain = append(p.chain, key)
		parent = key
	}
	chunkKeys := make([]prefixhash.Key, len(p.chain))
	for i := range chunkKeys {
		chunkKeys[i] = prefixhash.ChunkKey(p.chain, i, cb)
	}
	if err := ds.nodes[producer].cluster.Put(ctx, blocks, chunkKeys); err != nil {
		return p, fmt.Errorf("bench: scale: put: %w", err)
	}
	p.partial = prefixhash.Keys(ns, partial)
	return p, nil
}

func flushAll(ctx context.Context, ds *dataSim) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, d := range ds.nodes {
		if err := d.cluster.Flush(ctx); err != nil {
			return fmt.Errorf("bench: scale: flush pushes: %w", err)
		}
	}
	return nil
}

// lookups times k lookups of ps (their partial variants when partial) from
// random nodes other than each prompt's producer.
func (s *scaleLookup) lookups(ctx context.Context, ds *dataSim, ps []scalePrompt, partial bool, k int, rng *rand.Rand) (scaleLookupRow, error) {
	row := scaleLookupRow{Case: "full", Lookups: k}
	if partial {
		row.Case = "1k cached"
	}
	var total, net, cpu, bound Latency
	var peers, rounds int
	n := len(ds.nodes)
	for i := range k {
		if ctx.Err() != nil {
			return row, ctx.Err()
		}
		p := ps[i%len(ps)]
		chain, want := p.chain, len(p.chain)
		if partial {
			chain, want = p.partial, partialTokens/scaleBlockTokens
		}
		row.CachedTokens = want * scaleBlockTokens
		from := ds.nodes[(p.producer+1+rng.IntN(n-1))%n]
		var defaults store.ClusterOptions
		defaults.EnsureDefaults()
		vctx, vc := withVClock(ctx, defaults.LookupTimeout)
		t := processCPU()
		got := from.cluster.LongestPrefix(vctx, chain, scaleBlockTokens)
		took := processCPU() - t
		vnet, calls, _, r := vc.result()
		if got != want {
			row.Wrong++
		}
		total.Record(vnet + took)
		net.Record(vnet)
		cpu.Record(took)
		bound.Record(ds.bound(from.id, chain, want))
		peers += calls
		rounds += r
		row.MaxPeers = max(row.MaxPeers, calls)
	}
	row.Peers = float64(peers) / float64(k)
	row.Rounds = float64(rounds) / float64(k)
	row.P50MS, row.P99MS = total.Quantile(0.5), total.Quantile(0.99)
	row.NetP50MS, row.NetP99MS = net.Quantile(0.5), net.Quantile(0.99)
	row.CPUP50MS, row.CPUP99MS = cpu.Quantile(0.5), cpu.Quantile(0.99)
	row.BoundP50MS, row.BoundP99MS = bound.Quantile(0.5), bound.Quantile(0.99)
	return row, nil
}

// bound returns the least time any lookup from node from of chain, whose
// first want blocks are cached, can take: one round trip to the slowest
// owner it must hear from (the nearest owner of each chunk up to and with
// the one that holds the first miss; none for chunks it owns itself).
func (ds *dataSim) bound(from string, chain []prefixhash.Key, want int) time.Duration {
	cb := prefixhash.ChunkBlocks(scaleBlockTokens, ds.opts.ChunkTokens)
	p := store.NewPlacement(ds.members.Load().members, ds.opts.Replicas)
	last := min(want, len(chain)-1)
	var worst time.Duration
	var owners []string
	for c := 0; c <= prefixhash.ChunkStart(last, cb); c += cb {
		best := time.Duration(1 << 62)
		for _, o := range p.Owners(owners[:0], chain[c]) {
			if o == from {
				best = 0
				break
			}
			best = min(best, ds.links.RTT(from, o))
		}
		worst = max(worst, best)
	}
	return worst
}

// victim picks a node that owns a chunk of some prompt and produced none.
func (s *scaleLookup) victim(ds *dataSim, prompts []scalePrompt, rng *rand.Rand) *dataNode {
	producers := map[int]bool{}
	for _, p := range prompts {
		producers[p.producer] = true
	}
	cb := prefixhash.ChunkBlocks(scaleBlockTokens, ds.opts.ChunkTokens)
	p := store.NewPlacement(ds.members.Load().members, ds.opts.Replicas)
	var owners []string
	for _, pr := range prompts[len(prompts)-1:] { // a 128k-token prompt
		for c := 0; c < len(pr.chain); c += cb {
			owners = append(owners, p.Owner(pr.chain[c]))
		}
	}
	rng.Shuffle(len(owners), func(i, j int) { owners[i], owners[j] = owners[j], owners[i] })
	for _, id := range owners {
		d := ds.byID[id]
		if !d.gone.Load() && !producers[slices.Index(ds.nodes, d)] {
			return d
		}
	}
	for {
		if d := ds.nodes[rng.IntN(len(ds.nodes))]; !d.gone.Load() {
			return d
		}
	}
}

// report adds the phase's tables, plots and checks to res.
func (s *scaleLookup) report(res *Result, env *Env) {
	if len(s.rows) == 0 {
		return
	}
	res.AddTable("scale_lookup", "longest-prefix lookup (store.Cluster.LongestPrefix) from a node that did not produce the prompt, "+
		"16-token blocks, 512-token chunks, R = 1: peers asked, rounds, latency (virtual network time plus this process's CPU time) "+
		"against the lower bound of one round trip to the slowest owner needed", s.rows)
	res.AddTable("scale_changes", "a leave (the node hands its blocks to their next owners first) and then a crash (no handoff): "+
		"share of the cached prompts a lookup still finds whole, and of their tokens", s.changes)
	res.AddTable("scale_pushes", "publishing: push RPCs per prompt put (batches to owners), push workers a node holds once done, "+
		"and the most peers one node called during the phase", s.pushes)
	for _, c := range []string{"full", "1k cached"} {
		var series, peers []Series
		for _, length := range []int{1 << 10, 16 << 10, 128 << 10} {
			for _, mode := range []string{"rounds", "one"} {
				var x, y, b, pe []float64
				for _, r := range s.rows {
					if r.PromptTokens == length && r.Case == c && r.Mode == mode {
						x, y, b, pe = append(x, float64(r.Nodes)), append(y, r.P99MS), append(b, r.BoundP99MS), append(pe, r.Peers)
					}
				}
				if len(x) == 0 {
					continue
				}
				name := fmt.Sprintf("%dk, %s", length>>10, mode)
				series = append(series, Series{Name: name, X: x, Y: y, Dashed: mode == "one"})
				peers = append(peers, Series{Name: name, X: x, Y: pe, Dashed: mode == "one"})
				if mode == "rounds" {
					series = append(series, Series{Name: fmt.Sprintf("%dk, bound", length>>10), X: x, Y: b, Dashed: true})
				}
			}
		}
		file := map[string]string{"full": "full", "1k cached": "partial"}[c]
		savePlot(res, env, "scale_lookup_p99_"+file+".png", LinePlot{Title: fmt.Sprintf("lookup p99 (%s), rounds vs one round, and the one-round-trip bound", c),
			XLabel: "nodes", YLabel: "ms", LogX: true, XTick: intTick, Series: series})
		savePlot(res, env, "scale_lookup_peers_"+file+".png", LinePlot{Title: fmt.Sprintf("peers asked per lookup (%s)", c), XLabel: "nodes",
			YLabel: "peers", LogX: true, XTick: intTick, Series: peers})
	}
	for _, r := range s.rows {
		if r.Wrong > 0 {
			res.Checks = append(res.Checks, NewCheck(fmt.Sprintf("scale: lookups answered right, %d nodes, %dk %s, %s", r.Nodes, r.PromptTokens>>10, r.Case, r.Mode),
				"wrong", float64(r.Wrong), "<=", 0, BackendKvmesh))
		}
	}
}
