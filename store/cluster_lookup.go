package store

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// LongestPrefix returns how many leading blocks of chain are cached anywhere
// in the cluster. chain holds the keys of a prompt's blocks from block 0, of
// blockTokens tokens each. The local tiers answer first; the rest is asked
// of the chunks' owners, in one round when they are few and in up to three
// otherwise (see rounds), all within LookupTimeout. A peer that fails or is
// late counts as a miss.
func (c *Cluster) LongestPrefix(ctx context.Context, chain []prefixhash.Key, blockTokens int) int {
	n, _ := c.lookup(ctx, chain, chain, blockTokens, false, nil)
	return n
}

// Span is a run of consecutive blocks of a located prefix that one member
// holds.
type Span struct {
	// Node is the id of the member that holds the blocks: this node's own
	// id for blocks it holds.
	Node string
	// Tier names the local tier of blocks held here (from the same index
	// probe that found them); "" for blocks held elsewhere.
	Tier   string
	Blocks int
}

// Locate is LongestPrefix that also says where the prefix is: spans cover
// its n blocks in order, a new span wherever the member or the local tier
// changes. It allocates per span, not per block: a span ends only where a
// chunk or a local tier does (a 128k-token prompt is 8192 blocks, 256
// chunks of the default 512 tokens).
func (c *Cluster) Locate(ctx context.Context, chain []prefixhash.Key, blockTokens int) (n int, spans []Span) {
	return c.lookup(ctx, chain, chain, blockTokens, true, nil)
}

// appendSpan appends k blocks held by node (in tier, here) to spans,
// extending the last span when it is the same place.
func appendSpan(spans []Span, node, tier string, k int) []Span {
	if last := len(spans) - 1; last >= 0 && spans[last].Node == node && spans[last].Tier == tier {
		spans[last].Blocks += k
		return spans
	}
	return append(spans, Span{Node: node, Tier: tier, Blocks: k})
}

// tierBufs holds the per-block tier scratch of Locate: the names of the
// local tiers are constants, so a reused buffer keeps nothing alive.
var tierBufs = sync.Pool{New: func() any { return new([]string) }}

// maxPooledTiers bounds the scratch kept in tierBufs (1 MiB of strings).
const maxPooledTiers = 1 << 16

// extraProbes are single records a lookup asks about in its own round
// (Resume's states and windows, beside the full group's prefix): whether
// keys[j], placed by chunks[j], is held anywhere goes into held[j].
type extraProbes struct {
	keys, chunks []prefixhash.Key
	held         []bool
}

// ask adds the probes not held here to asks, owner → indexes, as base+j
// for keys[j].
func (ex *extraProbes) ask(p *Placement, self string, base int, asks map[string][]int) {
	var owners []string
	var last prefixhash.Key
	for j, held := range ex.held {
		if held {
			continue
		}
		if owners == nil || ex.chunks[j] != last { // probes of one chunk run together
			owners, last = p.Owners(owners[:0], ex.chunks[j]), ex.chunks[j]
		}
		for _, o := range owners {
			if o != self {
				asks[o] = append(asks[o], base+j)
			}
		}
	}
}

// lookup is LongestPrefix (Locate with locate) of keys, placed by chain:
// keys[i] is the key of block i of chain (a group's record, or the block
// itself when keys is chain). With extra, it also finds extra's records, in
// the same round (one message per member).
func (c *Cluster) lookup(ctx context.Context, chain, keys []prefixhash.Key, blockTokens int, locate bool, extra *extraProbes) (int, []Span) {
	c.fg.begin() // serving: pushes wait for it
	defer c.fg.end()
	a := auth.AccessFrom(ctx)
	// tiers[i] is the tier of block i when a probe found it here; other
	// entries are stale scratch, never read.
	var tiers []string
	if locate {
		buf := tierBufs.Get().(*[]string)
		tiers = slices.Grow((*buf)[:0], len(keys))[:len(keys)]
		defer func() {
			if cap(tiers) <= maxPooledTiers {
				*buf = tiers[:0]
				tierBufs.Put(buf)
			}
		}()
	}
	// probe counts the leading blocks of keys[start:end] held here, one
	// index probe each; locating, it writes their tiers into tiers[start:].
	probe := func(start, end int) int {
		if !locate {
			return c.local.LongestPrefix(a, keys[start:end])
		}
		k, _ := c.local.LongestPrefixTiers(a, keys[start:end], tiers[start:start:end])
		return k
	}
	n := probe(0, len(keys))
	extraMissing := false
	if extra != nil {
		c.local.ContainsMany(a, extra.keys, extra.held)
		extraMissing = slices.Contains(extra.held, false)
	}
	if n == len(keys) && !extraMissing {
		if !locate {
			return n, nil
		}
		var spans []Span
		for _, t := range tiers[:n] {
			spans = appendSpan(spans, c.self, t, 1)
		}
		return n, spans
	}
	cb := c.ChunkBlocks(blockTokens)

	// The runs from block n on, one per chunk, placed by the chain's key.
	var runs []lookupRun
	for s := prefixhash.ChunkStart(n, cb); s < len(keys); s += cb {
		r := lookupRun{start: max(s, n), end: min(s+cb, len(keys)), key: chain[s]}
		if r.start > n {
			// Blocks beyond the local prefix may still be here (a
			// producer keeps what it computed).
			r.local = probe(r.start, r.end)
			r.have = r.local
		}
		runs = append(runs, r)
	}
	runsOf := func(idx []int) [][]prefixhash.Key {
		runsOf := make([][]prefixhash.Key, len(idx))
		for k, ri := range idx {
			if ri >= len(runs) {
				runsOf[k] = extra.keys[ri-len(runs) : ri-len(runs)+1]
				continue
			}
			runsOf[k] = keys[runs[ri].start:runs[ri].end]
		}
		return runsOf
	}
	// Ask the owners round by round (lookupRounds, lookupAsks), and stop
	// where the prefix ends. extra's probes ride in the first round (their
	// indexes follow the runs').
	deadline, cancel := context.WithTimeout(ctx, c.opts.LookupTimeout)
	defer cancel()
	la := lookupAsks{c: c, ctx: deadline, runs: runs, rounds: c.lookupRounds(runs), runsOf: runsOf, answers: make(chan lookupAnswer)}
	la.wait = make([]int, len(runs))
	if extraMissing {
		la.extra, la.extraRuns = extra, len(runs)
	}
	la.run()
	total := len(keys)
	for _, r := range runs {
		if r.have < r.end-r.start {
			total = r.start + r.have
			break
		}
	}
	if !locate {
		return total, nil
	}
	var spans []Span
	for i := range n {
		spans = appendSpan(spans, c.self, tiers[i], 1)
	}
	for _, r := range runs {
		end := min(r.start+r.have, total)
		local := min(r.start+r.local, end)
		for i := r.start; i < local; i++ {
			spans = appendSpan(spans, c.self, tiers[i], 1)
		}
		if end > local {
			spans = appendSpan(spans, r.by, "", end-local)
		}
	}
	return total, spans
}

// lookupRun is the part of one chunk a lookup asks about: blocks
// start..end-1 of the chain, placed by key.
type lookupRun struct {
	start, end int
	key        prefixhash.Key
	local      int    // leading blocks held here
	have       int    // best count so far
	by         string // the member that answered have, when more than local
}

// lookupAnswer is one owner's answer to a lookup's call: counts[k] for
// idx[k], nil when the call failed or was late.
type lookupAnswer struct {
	o           string
	idx, counts []int
}

// lookupAsks runs a lookup's rounds of calls (see rounds for what each asks)
// and applies their answers to runs as they come, in the lookup's goroutine.
// A run is decided whole as soon as one owner says so (its other replicas
// are not waited for), and short once every owner asked answered less. The
// next round goes out once every run asked so far is decided whole, or,
// past the first round, speculatively: once no run is decided short and at
// least three quarters of the last round's runs are decided whole. A round
// then waits for its slowest owner while the next one runs, not before it
// starts. A run decided short stops speculation, so a prompt cached only in
// its first chunks still asks their owners alone; and the first round is
// never passed speculatively, so a lookup whose first chunk misses asks no
// other owner. Answers decide everything, never a timer: which owners a
// lookup asks depends on the answers and the order they come in, not on how
// long they took. The lookup returns once its prefix is known and every
// call sent has answered, or at its deadline (late owners count as misses,
// their calls canceled); either way no call reads the keys after it
// returns.
type lookupAsks struct {
	c      *Cluster
	ctx    context.Context // the lookup's deadline
	runs   []lookupRun
	rounds *rounds
	runsOf func(idx []int) [][]prefixhash.Key
	// extra, when not nil, has probes asked in the first round at indexes
	// extraRuns and up.
	extra     *extraProbes
	extraRuns int

	answers chan lookupAnswer
	calls   sync.WaitGroup       // the calls' goroutines
	cancels []context.CancelFunc // the rounds' contexts
	wait    []int                // per run: its calls not answered yet
	out     int                  // calls not answered yet
	next    int                  // the first run not asked yet
	from    int                  // the first run of the last round
	asked   int                  // rounds asked
	front   int                  // runs[:front] are decided whole
}

// speculateNum/speculateDen is the share of the last round's runs that
// must be decided whole (and none short) for the next round to go out
// before the last round's slowest answers.
const speculateNum, speculateDen = 3, 4

func (la *lookupAsks) whole(i int) bool {
	r := la.runs[i]
	return r.have >= r.end-r.start
}

// run asks and applies until the prefix is known and every call has
// answered, or the deadline passes. It returns once every call's goroutine
// has (a late one is canceled), so none reads the keys after it.
func (la *lookupAsks) run() {
	defer func() {
		for _, cancel := range la.cancels {
			cancel()
		}
		la.calls.Wait()
	}()
	la.ask()
	for {
		for la.front < la.next && la.whole(la.front) {
			la.front++
		}
		known := la.front == len(la.runs) || (la.front < la.next && la.wait[la.front] == 0)
		if !known && (la.front == la.next || la.speculate()) {
			la.ask() // every run asked is whole, or the next round may go early
			continue
		}
		if la.out == 0 {
			return // known; or nothing more will come (a run with nobody to ask is short)
		}
		select {
		case a := <-la.answers:
			la.apply(a)
		case <-la.ctx.Done():
			return
		}
	}
}

// speculate reports whether the next round may go out before the last
// one's answers are all in.
func (la *lookupAsks) speculate() bool {
	if la.asked < 2 || la.next >= len(la.runs) {
		return false
	}
	for i := la.front; i < la.next; i++ {
		if !la.whole(i) && la.wait[i] == 0 {
			return false // decided short: the prefix ends before the next round
		}
	}
	decided := 0
	for i := la.from; i < la.next; i++ {
		if la.whole(i) {
			decided++
		}
	}
	return speculateDen*decided >= speculateNum*(la.next-la.from)
}

// ask sends the next round: the runs from la.next on that rounds cuts, and
// in the first round extra's probes.
func (la *lookupAsks) ask() {
	asks, end := map[string][]int{}, la.next
	if la.next < len(la.runs) {
		asks, end = la.rounds.next(la.next)
	}
	if la.asked == 0 && la.extra != nil {
		la.extra.ask(la.rounds.p, la.c.self, la.extraRuns, asks)
	}
	la.asked++
	la.from, la.next = la.next, end
	if len(asks) == 0 {
		return
	}
	// Each round has a context of its own (within the lookup's deadline),
	// which its calls share and no other round's do.
	ctx, cancel := context.WithCancel(la.ctx)
	la.cancels = append(la.cancels, cancel)
	for o, idx := range asks {
		la.out++
		for _, ri := range idx {
			if ri < len(la.runs) {
				la.wait[ri]++
			}
		}
		la.calls.Add(1)
		go func() {
			defer la.calls.Done()
			a := lookupAnswer{o: o, idx: idx}
			if counts, ok := la.c.askLookup(ctx, o, la.runsOf(idx)); ok {
				a.counts = counts
			}
			select {
			case la.answers <- a:
			case <-la.ctx.Done():
			}
		}()
	}
}

// apply records one answer.
func (la *lookupAsks) apply(a lookupAnswer) {
	la.out--
	for k, ri := range a.idx {
		if ri >= len(la.runs) {
			if a.counts != nil {
				held := &la.extra.held[ri-la.extraRuns]
				*held = *held || a.counts[k] > 0
			}
			continue
		}
		la.wait[ri]--
		if a.counts == nil {
			continue
		}
		r := &la.runs[ri]
		if got := min(a.counts[k], r.end-r.start); got > r.have {
			r.have, r.by = got, a.o
		}
	}
}

// rounds cuts a lookup's runs into rounds of asks. A lookup whose runs have
// at most LookupRoundPeers owners besides this node (a prompt of a few
// chunks, or any prompt on a small cluster) asks them all in one round.
// Otherwise it asks, in order: the owners of the first run; then the
// owners of the runs after it, as many as LookupRoundPeers more peers
// reach; then every other owner. Each round costs a round trip, but a
// prefix that ends early (a shared system prompt, then a new conversation)
// is answered by a few peers instead of one per chunk, and a lookup of a
// long cached prompt asks its many owners only once the first chunks
// proved cached. A run this node holds whole is asked of nobody.
type rounds struct {
	c      *Cluster
	p      *Placement
	runs   []lookupRun
	owners [][]string // per run: its owners but this node; computed on demand
	placed []bool
	k      int // rounds cut so far
	single bool
}

func (c *Cluster) lookupRounds(runs []lookupRun) *rounds {
	rs := &rounds{c: c, p: c.placement(), runs: runs, owners: make([][]string, len(runs)), placed: make([]bool, len(runs))}
	limit := c.opts.LookupRoundPeers
	if limit < 0 {
		rs.single = true
		return rs
	}
	// One round if every owner fits in the limit.
	seen := map[string]bool{}
	rs.single = true
	for i := range runs {
		for _, o := range rs.of(i) {
			seen[o] = true
		}
		if len(seen) > limit {
			rs.single = false
			break
		}
	}
	return rs
}

// of returns run i's owners other than this node (none when it is held
// here whole).
func (rs *rounds) of(i int) []string {
	if !rs.placed[i] {
		rs.placed[i] = true
		r := rs.runs[i]
		if r.local < r.end-r.start {
			for _, o := range rs.p.Owners(nil, r.key) {
				if o != rs.c.self {
					rs.owners[i] = append(rs.owners[i], o)
				}
			}
		}
	}
	return rs.owners[i]
}

// next returns the asks of the round that starts at run from (owner →
// indexes into runs), and the index of the run after its last.
func (rs *rounds) next(from int) (map[string][]int, int) {
	budget := len(rs.runs) * 8 // every owner
	if !rs.single {
		switch rs.k {
		case 0:
			budget = 0 // the first run's owners, and runs no other owner holds
		case 1:
			budget = rs.c.opts.LookupRoundPeers
		}
	}
	rs.k++
	asks := map[string][]int{}
	end := from
	for ; end < len(rs.runs); end++ {
		owners := rs.of(end)
		fresh := 0
		for _, o := range owners {
			if _, ok := asks[o]; !ok {
				fresh++
			}
		}
		if end > from && fresh > 0 && len(asks)+fresh > budget {
			break
		}
		for _, o := range owners {
			asks[o] = append(asks[o], end)
		}
	}
	return asks, end
}

// lookupRound asks every member of asks at once, in one round bounded by
// LookupTimeout: member o gets the runs runsOf(asks[o]) builds, and apply
// records its answer (serialized; a member that fails or is late is not
// applied: a miss for each of its runs).
func (c *Cluster) lookupRound(ctx context.Context, asks map[string][]int, runsOf func(idx []int) [][]prefixhash.Key, apply func(o string, idx, counts []int)) {
	if len(asks) == 0 {
		return
	}
	// Each round gets a context of its own (within the caller's
	// deadline): its peer calls share it and no other.
	ctx, cancel := context.WithTimeout(ctx, c.opts.LookupTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for o, idx := range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts, ok := c.askLookup(ctx, o, runsOf(idx))
			if !ok {
				return
			}
			mu.Lock()
			apply(o, idx, counts)
			mu.Unlock()
		}()
	}
	wg.Wait()
}

// keyRuns returns keys[k:k+1] for each k of idx: one run per key.
func keyRuns(keys []prefixhash.Key, idx []int) [][]prefixhash.Key {
	runs := make([][]prefixhash.Key, len(idx))
	for j, k := range idx {
		runs[j] = keys[k : k+1]
	}
	return runs
}

// askLookup sends one lookup RPC and counts it; ok is false when it failed
// (a miss for every run).
func (c *Cluster) askLookup(ctx context.Context, id string, runs [][]prefixhash.Key) ([]int, bool) {
	c.c.remoteLookups.Add(1)
	counts, err := c.peers.Lookup(ctx, id, runs)
	if err != nil || len(counts) != len(runs) {
		c.c.remoteLookupFails.Add(1)
		return nil, false
	}
	return counts, true
}

// whoHas asks every other member, in one parallel round bounded by
// LookupTimeout, which of keys[idx] it holds, and returns for each the id of
// a member that does ("" when none answered yes). Members are preferred in id
// order, so the answer does not depend on which replied first.
func (c *Cluster) whoHas(ctx context.Context, keys []prefixhash.Key, idx []int) []string {
	asks := map[string][]int{}
	var others []string
	for _, m := range c.placement().Members() {
		if m.ID != c.self {
			others = append(others, m.ID)
			asks[m.ID] = idx
		}
	}
	answers := map[string][]int{}
	c.lookupRound(ctx, asks, func(idx []int) [][]prefixhash.Key { return keyRuns(keys, idx) },
		func(o string, _, counts []int) { answers[o] = counts })
	out := make([]string, len(idx))
	for j := range idx {
		for _, o := range others {
			if a := answers[o]; a != nil && a[j] > 0 {
				out[j] = o
				break
			}
		}
	}
	return out
}

// Exists reports which keys are cached anywhere in the cluster: here, or on
// an owner of chunkKeys[i] (with chunkKeys nil, on any member). The remote
// part is one parallel round bounded by LookupTimeout; a peer that fails or
// is late counts as not holding its keys.
func (c *Cluster) Exists(ctx context.Context, keys, chunkKeys []prefixhash.Key) ([]bool, error) {
	c.fg.begin() // serving: pushes wait for it
	defer c.fg.end()
	if chunkKeys != nil && len(chunkKeys) != len(keys) {
		return nil, fmt.Errorf("store: cluster exists: %d keys but %d chunk keys", len(keys), len(chunkKeys))
	}
	present := make([]bool, len(keys))
	c.local.ContainsMany(auth.AccessFrom(ctx), keys, present)
	var missing []int
	for k := range keys {
		if !present[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return present, nil
	}
	if chunkKeys == nil {
		for j, h := range c.whoHas(ctx, keys, missing) {
			present[missing[j]] = h != ""
		}
		return present, ctx.Err()
	}
	placed := chunkOwners{p: c.placement()}
	asks := map[string][]int{} // owner → indexes into keys
	for _, k := range missing {
		for _, o := range placed.of(chunkKeys[k]) {
			if o != c.self {
				asks[o] = append(asks[o], k)
			}
		}
	}
	c.lookupRound(ctx, asks, func(idx []int) [][]prefixhash.Key { return keyRuns(keys, idx) },
		func(_ string, idx, counts []int) {
			for j, k := range idx {
				present[k] = present[k] || counts[j] > 0
			}
		})
	return present, ctx.Err()
}
