package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// RanksOptions configures the ranks suite. Zero fields take the defaults
// documented on each, for a full run or for --quick.
type RanksOptions struct {
	// Ranks lists the tensor-parallel sizes measured: that many ranks, each
	// a goroutine with a client of its own. Each must divide Model.KVHeads
	// or be a multiple of it (block.RankPart). Default 2, 4 and 8.
	Ranks []int
	// Model is the split-layout namespace the ranks write. Default: 32
	// layers, 8 KV heads, head_dim 128, bfloat16, 16-token blocks (2 MiB
	// blocks), for a full run and --quick alike.
	Model prefixhash.Namespace
	// Prompts is how many prompts each measurement writes and reads,
	// Blocks full blocks each. Default 8 × 16 (256 MiB of the default
	// blocks); quick 2 × 8 (32 MiB).
	Prompts, Blocks int
	// Runs is how many times each measurement is repeated. Default 5;
	// quick 1.
	Runs int
	// Latent is the latent-layout (MLA) namespace. Default: 61 layers,
	// latent_dim 576, bfloat16, 16-token blocks (1.07 MiB blocks), for a
	// full run and --quick alike.
	Latent prefixhash.Namespace
	// LatentRanks is the tensor-parallel size of the MLA instance. Default 8.
	LatentRanks int
	// LatentBlocks is the length of its prefix, in blocks. Default 64;
	// quick 8.
	LatentBlocks int
	// NodeDRAMBytes is the DRAM tier of the node the suite starts. It must
	// hold one measurement (the whole-block and the ranks' prompts).
	// Default 1 GiB; quick 256 MiB.
	NodeDRAMBytes int64
}

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *RanksOptions) EnsureDefaults(quick bool) {
	if len(o.Ranks) == 0 {
		o.Ranks = []int{2, 4, 8}
	}
	if o.Model.Model == "" {
		o.Model = prefixhash.Namespace{Model: "kvmesh/bench-ranks", DType: prefixhash.BFloat16, BlockTokens: 16,
			Layers: 32, KVHeads: 8, HeadDim: 128}
	}
	if o.Prompts == 0 {
		o.Prompts = pick(quick, 8, 2)
	}
	if o.Blocks == 0 {
		o.Blocks = pick(quick, 16, 8)
	}
	if o.Runs == 0 {
		o.Runs = pick(quick, 5, 1)
	}
	if o.Latent.Model == "" {
		o.Latent = prefixhash.Namespace{Model: "kvmesh/bench-ranks-mla", DType: prefixhash.BFloat16, BlockTokens: 16,
			Layers: 61, Layout: prefixhash.LatentKV, LatentDim: 576}
	}
	if o.LatentRanks == 0 {
		o.LatentRanks = 8
	}
	if o.LatentBlocks == 0 {
		o.LatentBlocks = pick(quick, 64, 8)
	}
	if o.NodeDRAMBytes == 0 {
		o.NodeDRAMBytes = pick[int64](quick, 1<<30, 256<<20)
	}
}

// Validate names the first field that is out of range.
func (o *RanksOptions) Validate() error {
	if o.Model.Layout != prefixhash.SplitKV {
		return errors.New("bench: ranks: Model must have the split layout (the latent one is Latent)")
	}
	if err := o.Model.Validate(); err != nil {
		return fmt.Errorf("bench: ranks: Model: %w", err)
	}
	for _, n := range o.Ranks {
		if n < 1 || n > 64 {
			return fmt.Errorf("bench: ranks: Ranks: %d is outside 1..64", n)
		}
		if _, err := block.RankPart(o.Model, 0, n, 0, 1); err != nil {
			return fmt.Errorf("bench: ranks: Ranks: %w", err)
		}
	}
	if o.Latent.Layout != prefixhash.LatentKV {
		return errors.New("bench: ranks: Latent must have the latent layout")
	}
	if err := o.Latent.Validate(); err != nil {
		return fmt.Errorf("bench: ranks: Latent: %w", err)
	}
	switch {
	case o.Prompts < 1 || o.Blocks < 1:
		return fmt.Errorf("bench: ranks: Prompts %d and Blocks %d must be positive", o.Prompts, o.Blocks)
	case o.Runs < 1:
		return fmt.Errorf("bench: ranks: Runs %d must be positive", o.Runs)
	case o.LatentRanks < 1 || o.LatentRanks > 64:
		return fmt.Errorf("bench: ranks: LatentRanks %d is outside 1..64", o.LatentRanks)
	case o.LatentBlocks < 1:
		return fmt.Errorf("bench: ranks: LatentBlocks %d must be positive", o.LatentBlocks)
	}
	// One measurement holds the whole-block prompts and the ranks' at once.
	need := 2*int64(o.Prompts*o.Blocks)*int64(o.Model.BlockBytes()) + 16<<20
	if o.NodeDRAMBytes < need {
		return fmt.Errorf("bench: ranks: NodeDRAMBytes %d is less than one measurement needs (%d)", o.NodeDRAMBytes, need)
	}
	return nil
}

// RanksSuite measures a tensor-parallel instance's ranks writing and
// reading their slices of blocks (client.Put, client.Get with a Prompt.Rank), N ranks
// at once, each a goroutine with a client of its own, against one writer
// and reader of the same bytes as whole blocks (client.Put, client.Get),
// on one node on the same host, over the TCP data plane and over shared
// memory; and, for a latent (MLA) model whose every rank holds the same
// bytes, what the node receives when all ranks put a prefix, against one
// copy of it.
type RanksSuite struct {
	Options RanksOptions
}

// Name returns "ranks".
func (s *RanksSuite) Name() string { return "ranks" }

// ranksRow is one path, rank count and operation, over the runs.
type ranksRow struct {
	Path       string `json:"path"`
	Ranks      int    `json:"ranks"`
	Op         string `json:"op"`
	BlockBytes int    `json:"block_bytes"`
	// Blocks is how many blocks each run moves, whole and by the ranks.
	Blocks int `json:"blocks"`
	Runs   int `json:"runs" table:"wide"`
	// WholeGBps and RanksGBps are the medians over the runs of the block
	// bytes moved per second: one client with whole blocks, and the N
	// ranks together (from the first rank's start to the last one's end).
	WholeGBps float64 `json:"whole_gbps"`
	RanksGBps float64 `json:"ranks_gbps"`
	// RatioVsWhole is the median of the runs' RanksGBps/WholeGBps, each run
	// against the whole-block peer measured beside it; RatioMin and
	// RatioMax are their spread.
	RatioVsWhole float64 `json:"ratio_vs_whole"`
	RatioMin     float64 `json:"ratio_min" table:"wide"`
	RatioMax     float64 `json:"ratio_max" table:"wide"`
	// PathShare is the share of the bytes the node moved in these runs
	// (data plane and gRPC) that went over the row's transport; nil when
	// the node's metrics could not be read.
	PathShare *float64  `json:"path_share,omitempty" table:"wide"`
	WholeRuns []float64 `json:"whole_gbps_runs" table:"-"`
	RanksRuns []float64 `json:"ranks_gbps_runs" table:"-"`
	// BytesVerified counts the payload bytes compared with what was put:
	// the blocks or parts this operation returned (get), or the whole
	// blocks read back after the puts (put).
	BytesVerified int64 `json:"bytes_verified" table:"wide"`
}

// Run measures.
func (s *RanksSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	paths, missing := storePaths()
	for _, name := range slices.Sorted(maps.Keys(missing)) {
		res.Skip(name, missing[name])
	}
	maxBlock := max(o.Model.BlockBytes(), o.Latent.BlockBytes())
	addrs, stop, err := nodeAddrs(ctx, env, DaemonOptions{DRAMBytes: o.NodeDRAMBytes, MaxBlockBytes: int64(max(16<<20, 2*maxBlock))})
	if err != nil {
		return res, err
	}
	defer stop()
	addr := addrs[0]

	bar := env.Progress.Bar(int64(len(paths)*(len(o.Ranks)*o.Runs+1)), "ranks")
	defer bar.Finish()

	httpAddr := ""
	if c, err := client.Dial(addr, client.Options{MaxRetries: -1}); err == nil {
		httpAddr, err = nodeHTTPAddr(ctx, c)
		c.Close()
		if err != nil {
			res.Skip("path_share and latent", fmt.Errorf("the bytes the node moved are read from its metrics: %w", err))
		}
	}

	m := &ranksMeasure{ns: o.Model, prompts: o.Prompts, blocks: o.Blocks}
	m.payloads = ranksPayloads(o.Model, o.Prompts*o.Blocks)
	var rows []ranksRow
	for _, p := range paths {
		for _, n := range o.Ranks {
			bar.Describe(fmt.Sprintf("ranks: %s, %d ranks", p.target, n))
			var share *float64
			put, get, err := withPathShare(ctx, httpAddr, p.transport, &share, func() (ranksRow, ranksRow, error) {
				return m.measure(ctx, addr, p.opts, n, o.Runs, bar)
			})
			if err != nil {
				return res, fmt.Errorf("bench: ranks: %s, %d ranks: %w", p.target, n, err)
			}
			put.Path, get.Path = p.target, p.target
			put.PathShare, get.PathShare = share, share
			rows = append(rows, put, get)
		}
	}
	m.payloads = nil
	res.AddTable("ranks", fmt.Sprintf("N tensor-parallel ranks (goroutines, a client each) put then get their slices of %d prompts × %d blocks of %s, "+
		"against one client's Put and Get of the same bytes as whole blocks; one node on this host", o.Prompts, o.Blocks, o.Model), rows)
	ranksChecks(res, rows)

	var latent []latentRow
	if httpAddr != "" {
		lm := &latentMeasure{ns: o.Latent, ranks: o.LatentRanks, blocks: o.LatentBlocks, addr: addr, httpAddr: httpAddr,
			payloads: ranksPayloads(o.Latent, o.LatentBlocks)}
		for _, p := range paths {
			bar.Describe(fmt.Sprintf("ranks: MLA, %s, %d ranks", p.target, o.LatentRanks))
			rs, err := lm.measure(ctx, p.opts)
			if err != nil {
				return res, fmt.Errorf("bench: ranks: MLA over %s: %w", p.target, err)
			}
			for i := range rs {
				rs[i].Path = p.target
			}
			latent = append(latent, rs...)
			bar.Add(1)
		}
		res.AddTable("latent", fmt.Sprintf("an MLA instance's %d ranks put the same %d blocks of %s at once: bytes the node received against one copy; then each rank's Get of its part",
			o.LatentRanks, o.LatentBlocks, o.Latent), latent)
		latentChecks(res, latent)
	}
	res.Note("Each run writes prompts never written before (new keys) and drops the namespace afterwards; the whole-block peer runs " +
		"beside the ranks in every run (both puts, then both gets), first in even runs and second in odd ones. After the ranks' puts every block must be complete " +
		"(Lookup), and a whole-block Get of it must equal the bytes put; every payload a get returns is compared with what was put, " +
		"after the timed phase.")
	return res, nil
}

// ranksPayloads returns n distinct block payloads of ns, the same bytes in
// every call.
func ranksPayloads(ns prefixhash.Namespace, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, ns.BlockBytes())
		fillRandom(out[i], uint64(i)+1)
	}
	return out
}

// fillRandom fills b with the bytes of a generator seeded by seed.
func fillRandom(b []byte, seed uint64) {
	r := rand.NewPCG(seed, 0x6b766d657368)
	for len(b) >= 8 {
		v := r.Uint64()
		b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(r.Uint64())
	}
}

// ranksTokens returns the tokens of prompts prompts of blocks blocks each
// for phase seq: other phases, other tokens, so other keys.
func ranksTokens(ns prefixhash.Namespace, seq uint64, prompts, blocks int) [][]uint32 {
	out := make([][]uint32, prompts)
	for p := range out {
		r := rand.NewPCG(seq, uint64(p))
		out[p] = make([]uint32, blocks*ns.BlockTokens)
		for i := range out[p] {
			out[p][i] = uint32(r.Uint64())
		}
	}
	return out
}

// timeRanks runs fn(rank) for each of n ranks, each in a goroutine of its
// own, released together, and returns the time from their release until
// the last one returned, and their errors.
func timeRanks(n int, fn func(rank int) error) (time.Duration, error) {
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[r] = fn(r)
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// dialRanks dials n clients of addr.
func dialRanks(addr string, opts client.Options, n int) ([]*client.Client, func(), error) {
	cs := make([]*client.Client, 0, n)
	closeAll := func() {
		for _, c := range cs {
			c.Close()
		}
	}
	for range n {
		c, err := client.Dial(addr, opts)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		cs = append(cs, c)
	}
	return cs, closeAll, nil
}

// tpRank is rank r of a tensor-parallel instance of size n, one pipeline
// stage.
func tpRank(r, n int) client.Rank { return client.Rank{TPRank: r, TPSize: n, PPRank: 0, PPSize: 1} }

// ranksMeasure is the split-layout measurement: prompts × blocks blocks of
// ns, block b of prompt p holding payloads[p*blocks+b].
type ranksMeasure struct {
	ns              prefixhash.Namespace
	prompts, blocks int
	payloads        [][]byte
	seq             uint64 // phases so far: the seed of the next phase's tokens
}

func (m *ranksMeasure) prompt(p int) [][]byte { return m.payloads[p*m.blocks : (p+1)*m.blocks] }

func (m *ranksMeasure) gbps(d time.Duration) float64 {
	return float64(m.prompts*m.blocks*m.ns.BlockBytes()) / d.Seconds() / 1e9
}

// parts returns each of n ranks' part of every block: [rank][block].
func (m *ranksMeasure) parts(n int) ([][][]byte, error) {
	l := block.LayoutOf(m.ns)
	out := make([][][]byte, n)
	for r := range n {
		part, err := block.RankPart(m.ns, r, n, 0, 1)
		if err != nil {
			return nil, err
		}
		out[r] = make([][]byte, len(m.payloads))
		for b, pl := range m.payloads {
			out[r][b] = l.ExtractPart(nil, pl, m.ns.BlockTokens, part)
		}
	}
	return out, nil
}

// measure runs runs rounds of n ranks and of the whole-block peer over one
// path and returns the put and get rows.
func (m *ranksMeasure) measure(ctx context.Context, addr string, opts client.Options, n, runs int, bar Bar) (put, get ranksRow, err error) {
	parts, err := m.parts(n)
	if err != nil {
		return put, get, err
	}
	ranks, closeRanks, err := dialRanks(addr, opts, n+1)
	if err != nil {
		return put, get, err
	}
	defer closeRanks()
	whole, ranks := ranks[n], ranks[:n]
	put = ranksRow{Ranks: n, Op: "put", BlockBytes: m.ns.BlockBytes(), Blocks: m.prompts * m.blocks, Runs: runs}
	get = put
	get.Op = "get"
	if _, err := whole.DropNamespace(ctx, m.ns); err != nil { // a running cluster's leftovers
		return put, get, err
	}
	for run := range runs {
		r, err := m.run(ctx, whole, ranks, parts, run%2 == 1)
		if err != nil {
			return put, get, fmt.Errorf("run %d: %w", run+1, err)
		}
		put.WholeRuns, put.RanksRuns = append(put.WholeRuns, r.wholePut), append(put.RanksRuns, r.ranksPut)
		get.WholeRuns, get.RanksRuns = append(get.WholeRuns, r.wholeGet), append(get.RanksRuns, r.ranksGet)
		put.BytesVerified += r.putVerified
		get.BytesVerified += r.getVerified
		if _, err := whole.DropNamespace(ctx, m.ns); err != nil {
			return put, get, err
		}
		bar.Add(1)
	}
	put.summarize()
	get.summarize()
	return put, get, nil
}

// summarize fills the medians and the spread from the runs.
func (r *ranksRow) summarize() {
	ratios := make([]float64, len(r.WholeRuns))
	for i := range ratios {
		ratios[i] = r.RanksRuns[i] / r.WholeRuns[i]
	}
	r.WholeGBps, r.RanksGBps, r.RatioVsWhole = medianOf(r.WholeRuns), medianOf(r.RanksRuns), medianOf(ratios)
	r.RatioMin, r.RatioMax = slices.Min(ratios), slices.Max(ratios)
}

// ranksRun is what one run measured, in GB/s, and the bytes it verified.
type ranksRun struct {
	wholePut, wholeGet, ranksPut, ranksGet float64
	putVerified, getVerified               int64
}

// run measures the whole-block peer and the ranks once, each on prompts
// of its own: both puts one after the other, then both gets, the ranks
// first when ranksFirst is set, so that each figure's peer is measured
// right beside it.
func (m *ranksMeasure) run(ctx context.Context, whole *client.Client, ranks []*client.Client, parts [][][]byte, ranksFirst bool) (ranksRun, error) {
	var r ranksRun
	n := len(ranks)
	m.seq += 2
	wholeTokens := ranksTokens(m.ns, m.seq-1, m.prompts, m.blocks)
	rankTokens := ranksTokens(m.ns, m.seq, m.prompts, m.blocks)
	var wholeGot [][]client.Block
	var rankGot [][][]client.Block
	type phase struct {
		ranks int
		fn    func(rank int) error
		gbps  *float64
	}
	puts := []phase{
		{1, func(int) error { return m.putWhole(ctx, whole, wholeTokens) }, &r.wholePut},
		{n, func(rank int) error { return m.putRank(ctx, ranks[rank], rankTokens, parts[rank], rank, n) }, &r.ranksPut},
	}
	gets := []phase{
		{1, func(int) (err error) { wholeGot, err = m.getWhole(ctx, whole, wholeTokens); return err }, &r.wholeGet},
		{n, func(rank int) (err error) {
			rankGot[rank], err = m.getRank(ctx, ranks[rank], rankTokens, rank, n)
			return err
		}, &r.ranksGet},
	}
	if ranksFirst {
		puts[0], puts[1] = puts[1], puts[0]
		gets[0], gets[1] = gets[1], gets[0]
	}
	for _, ph := range puts {
		d, err := timeRanks(ph.ranks, ph.fn)
		if err != nil {
			return r, err
		}
		*ph.gbps = m.gbps(d)
	}
	// The puts are verified by reading the blocks back whole (untimed):
	// the peer's by its own get below, the ranks' here, once they are
	// complete.
	v, err := m.verifyWhole(ctx, whole, rankTokens)
	if err != nil {
		return r, err
	}
	r.putVerified += v
	rankGot = make([][][]client.Block, n)
	for _, ph := range gets {
		d, err := timeRanks(ph.ranks, ph.fn)
		if err != nil {
			return r, err
		}
		*ph.gbps = m.gbps(d)
	}
	for p := range m.prompts {
		v, err := verifyBlocks("whole get", wholeGot[p], m.prompt(p))
		if err != nil {
			return r, fmt.Errorf("prompt %d: %w", p, err)
		}
		r.putVerified += v
		r.getVerified += v
	}
	for rank := range n {
		for p := range m.prompts {
			v, err := verifyBlocks(fmt.Sprintf("rank %d of %d: get", rank, n), rankGot[rank][p], parts[rank][p*m.blocks:(p+1)*m.blocks])
			if err != nil {
				return r, fmt.Errorf("prompt %d: %w", p, err)
			}
			r.getVerified += v
		}
	}
	return r, nil
}

// putWhole puts every prompt's blocks whole.
func (m *ranksMeasure) putWhole(ctx context.Context, c *client.Client, tokens [][]uint32) error {
	for p := range m.prompts {
		stored, err := c.Put(ctx, m.ns, client.Prompt{Tokens: tokens[p]}, m.prompt(p))
		if err != nil {
			return fmt.Errorf("whole put: %w", err)
		}
		if len(stored) != m.blocks {
			return fmt.Errorf("whole put stored %d of %d blocks", len(stored), m.blocks)
		}
	}
	return nil
}

// getWhole gets every prompt's blocks whole.
func (m *ranksMeasure) getWhole(ctx context.Context, c *client.Client, tokens [][]uint32) ([][]client.Block, error) {
	got := make([][]client.Block, m.prompts)
	for p := range m.prompts {
		var err error
		if got[p], err = c.Get(ctx, m.ns, client.Prompt{Tokens: tokens[p]}); err != nil {
			return nil, fmt.Errorf("whole get: %w", err)
		}
	}
	return got, nil
}

// putRank puts rank's part of every prompt's blocks.
func (m *ranksMeasure) putRank(ctx context.Context, c *client.Client, tokens [][]uint32, parts [][]byte, rank, n int) error {
	for p := range m.prompts {
		if _, err := c.Put(ctx, m.ns, client.Prompt{Tokens: tokens[p], Rank: tpRank(rank, n)}, parts[p*m.blocks:(p+1)*m.blocks]); err != nil {
			return fmt.Errorf("rank %d of %d: put: %w", rank, n, err)
		}
	}
	return nil
}

// getRank gets rank's part of every prompt's blocks.
func (m *ranksMeasure) getRank(ctx context.Context, c *client.Client, tokens [][]uint32, rank, n int) ([][]client.Block, error) {
	got := make([][]client.Block, m.prompts)
	for p := range m.prompts {
		var err error
		if got[p], err = c.Get(ctx, m.ns, client.Prompt{Tokens: tokens[p], Rank: tpRank(rank, n)}); err != nil {
			return nil, fmt.Errorf("rank %d of %d: get: %w", rank, n, err)
		}
	}
	return got, nil
}

// verifyWhole checks that every block of the prompts is complete (Lookup)
// and holds, read whole, the bytes put, and returns the bytes compared.
func (m *ranksMeasure) verifyWhole(ctx context.Context, c *client.Client, tokens [][]uint32) (int64, error) {
	var n int64
	for p := range m.prompts {
		l, err := c.Lookup(ctx, m.ns, client.Prompt{Tokens: tokens[p]})
		if err != nil {
			return n, err
		}
		if l.CachedBlocks != m.blocks {
			return n, fmt.Errorf("after every rank's put, prompt %d has %d of %d blocks complete", p, l.CachedBlocks, m.blocks)
		}
		bl, err := c.Get(ctx, m.ns, client.Prompt{Tokens: tokens[p]})
		if err != nil {
			return n, err
		}
		v, err := verifyBlocks("whole get of the ranks' blocks", bl, m.prompt(p))
		if err != nil {
			return n, fmt.Errorf("prompt %d: %w", p, err)
		}
		n += v
	}
	return n, nil
}

// verifyBlocks checks that got holds want, block by block, and returns the
// bytes compared.
func verifyBlocks(what string, got []client.Block, want [][]byte) (int64, error) {
	if len(got) != len(want) {
		return 0, fmt.Errorf("%s returned %d of %d blocks", what, len(got), len(want))
	}
	var n int64
	for i, b := range got {
		if !bytes.Equal(b.Payload, want[i]) {
			return n, fmt.Errorf("%s: block %d holds other bytes than were put (%d bytes, want %d)", what, i, len(b.Payload), len(want[i]))
		}
		n += int64(len(want[i]))
	}
	return n, nil
}

// ranksChecks adds the target: for N ≤ 4 ranks, the ranks' aggregate
// GB/s at least 0.9× one whole-block client's, for put and get, over every
// path (the worst median).
func ranksChecks(res *Result, rows []ranksRow) {
	for _, op := range []string{"put", "get"} {
		worst, found := 0.0, false
		for _, r := range rows {
			if r.Op == op && r.Ranks <= 4 && (!found || r.RatioVsWhole < worst) {
				worst, found = r.RatioVsWhole, true
			}
		}
		if found {
			res.Checks = append(res.Checks, NewCheck(fmt.Sprintf("ranks: %s of N ≤ 4 ranks' slices vs one client's whole blocks, same host, every path", op),
				"min ratio_vs_whole (N <= 4)", worst, ">=", 0.9, BackendKvmesh))
		}
	}
}

// withPathShare runs measure and sets *share to the share of the bytes the
// node at httpAddr moved meanwhile that went over transport; it stays nil
// when httpAddr is empty or the metrics cannot be read.
func withPathShare(ctx context.Context, httpAddr, transport string, share **float64, measure func() (put, get ranksRow, err error)) (put, get ranksRow, err error) {
	var before map[string]float64
	if httpAddr != "" {
		before, _ = movedBytes(ctx, httpAddr)
	}
	put, get, err = measure()
	if err != nil || before == nil {
		return put, get, err
	}
	after, err := movedBytes(ctx, httpAddr)
	if err != nil {
		return put, get, nil // the share stays unmeasured
	}
	total := 0.0
	for k, v := range after {
		total += v - before[k]
	}
	if total > 0 {
		x := (after[transport] - before[transport]) / total
		*share = &x
	}
	return put, get, nil
}

// movedBytes returns the bytes the node at httpAddr has moved, both
// directions, per data-plane transport ("tcp", "shm") and over its gRPC
// API ("grpc").
func movedBytes(ctx context.Context, httpAddr string) (map[string]float64, error) {
	mf, err := nodeMetrics(ctx, httpAddr)
	if err != nil {
		return nil, err
	}
	out := countersBy(mf, "kvmesh_transfer_bytes_total", "transport")
	for _, v := range countersBy(mf, "kvmesh_payload_bytes_total", "op") {
		out["grpc"] += v
	}
	return out, nil
}

// receivedBytes returns the put bytes the node at httpAddr has received,
// over its data plane (every transport) and its gRPC API.
func receivedBytes(ctx context.Context, httpAddr string) (float64, error) {
	mf, err := nodeMetrics(ctx, httpAddr)
	if err != nil {
		return 0, err
	}
	return countersBy(mf, "kvmesh_transfer_bytes_total", "op")["put"] + countersBy(mf, "kvmesh_payload_bytes_total", "op")["put"], nil
}
