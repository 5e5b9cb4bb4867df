package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// Parts (issue 23). A record whose header is a part (block.Header.Whole is
// false) is assembled into an incomplete block: a slot of the whole block's
// encoded size taken in the memory tier as Reserve takes one, the first
// part's header in front, and a coverage grid of layers × heads. Each part
// is verified as Put verifies a block, compared with the cells already
// covered (different bytes: ErrPartConflict, nothing stored; identical: a
// no-op) and copied into place under the incomplete block's own lock, not
// the store's. The part that covers the last cell seals the slot
// (block.Seal) and commits it as a reservation is committed: only then is
// the block in the index. Incomplete blocks are never served, are the
// first thing dropped when the memory tier needs room (oldest first), and
// expire after Options.PartialTTL (swept on access and by one ticker).

// MaxPartCells bounds layers × heads (heads: 1 for the latent layout) of a
// block assembled from parts: real models have a few thousand (61 × 1 for
// Kimi K2.5, 80 × 8 for Llama 3 70B); its whole block is still stored
// when put whole.
const MaxPartCells = 1 << 16

// ErrPartConflict: a part overlaps cells already stored with different bytes.
var ErrPartConflict = errors.New("store: part conflicts with the stored part it overlaps")

// maxClaims bounds the open claims a node remembers; past it Claim answers
// block.ClaimWrite without recording one (a duplicate write is a no-op,
// a lost claim only costs bandwidth).
const maxClaims = 1 << 16

// partial is an incomplete block.
type partial struct {
	// mu orders the parts copied into buf. Order: partial.mu, then Local.mu.
	mu struct {
		sync.Mutex
		// pending marks the cells being copied outside the lock; copying
		// counts those copies (the slot is freed only when none is).
		pending []bool
		copying int
	}
	cond sync.Cond // on mu: broadcast when a copy outside mu ends

	// Fixed at creation.
	key     prefixhash.Key
	ns      uint64
	tenant  uint64
	layout  block.Layout
	tokens  int
	hdrLen  int
	size    int // the whole block's encoded size
	class   int
	loc     tiers.Loc
	heap    bool // buf is not a tier slot (the memory tier takes no reservations)
	buf     []byte
	created time.Time

	// Under Local.mu (and, for cover and left, partial.mu too when
	// written, so that either lock reads them).
	state partialState
	cover []bool // layers × heads
	left  int    // cells not covered
	parts []block.Part
	owned bool // a part came through Put, not PutCopy
}

type partialState uint8

const (
	partialOpen    partialState = iota
	partialSealing              // complete: being sealed and committed
	partialGone                 // dropped or expired: its slot is freed
)

type claim struct {
	part    block.Part
	expires time.Time
}

// partsState is Local.mu's share of parts and claims.
type partsState struct {
	open      map[prefixhash.Key]*partial
	bytes     int64
	claims    map[prefixhash.Key][]claim
	nclaims   int
	nextSweep time.Time
}

type partCounters struct {
	stored, completed, conflicts, expired, dropped int64
	claims                                         [block.ClaimStatuses]int64
}

func (p *partial) covered(layer, head int) bool {
	_, heads := p.layout.Cells()
	return p.cover[layer*heads+head]
}

// cells counts the cells of part q that are covered.
func (p *partial) coveredCells(q block.Part) (covered, all int) {
	for layer := q.L0; layer < q.L1; layer++ {
		for h := q.H0; h < q.H1; h++ {
			all++
			if p.covered(layer, h) {
				covered++
			}
		}
	}
	return covered, all
}

func (l *Local) now() time.Time { return l.opts.Now() }

// putPart assembles the part record b (header h, already decoded, its
// length and tenant checked) into its incomplete block.
func (l *Local) putPart(ctx context.Context, b []byte, h *block.Header, asCopy bool) error {
	if err := verifyPayload(b, h); err != nil {
		return err
	}
	tokens := len(h.Tokens)
	wholeLen := h.Layout.PayloadLen(tokens)
	if wholeLen < 0 || wholeLen > l.opts.MaxBlockBytes {
		return fmt.Errorf("%w: the whole block of part %s has a payload of %d bytes, limit %d", block.ErrTooLarge, h.Part, wholeLen, l.opts.MaxBlockBytes)
	}
	size := h.Len + wholeLen
	// One operation from here to the commit: Close waits for it before it
	// frees the incomplete blocks and closes the tiers.
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return ErrClosed
	}
	l.mu.Unlock()
	defer l.exit()
	for round := 0; round < 4; round++ {
		p, done, err := l.partialFor(ctx, b, h, size)
		if err != nil || done {
			return err
		}
		stored, sealing, gone, err := l.placePart(p, b, h, asCopy)
		if gone {
			continue // dropped under us: start again
		}
		if err != nil || !stored || !sealing {
			return err
		}
		return l.completePartial(ctx, p)
	}
	return l.refused(tiers.ErrFull, size)
}

// partialFor returns the open incomplete block of h's key, creating it.
// done reports that there is nothing to do: the block is complete or being
// completed.
func (l *Local) partialFor(ctx context.Context, b []byte, h *block.Header, size int) (p *partial, done bool, err error) {
	l.mu.Lock()
	expired := l.sweepDueLocked()
	p, done, err = l.findPartialLocked(h)
	l.mu.Unlock()
	l.freePartials(expired)
	if p != nil || done || err != nil {
		return p, done, err
	}
	// A new incomplete block: its namespace's layout first, as Put checks it.
	wh := *h
	wh.Part, wh.PayloadLen = h.Layout.Whole(), size-h.Len
	l.mu.Lock()
	_, err = l.mu.ns.check(&wh, size)
	l.mu.Unlock()
	if err != nil {
		return nil, false, err
	}
	np := &partial{key: h.Key, ns: h.Namespace, tenant: h.Tenant, layout: h.Layout, tokens: len(h.Tokens),
		hdrLen: h.Len, size: size, class: l.classOf(size), created: l.now()}
	if np.class < 0 {
		return nil, false, l.refused(tiers.ErrTooLarge, size)
	}
	layers, heads := h.Layout.Cells()
	if layers*heads > MaxPartCells {
		// The grids cost a byte a cell: a tiny record of an absurd shape
		// must not make the node allocate for it.
		return nil, false, fmt.Errorf("%w: a block of %d layers × %d heads has more than %d cells to assemble from parts; put it whole",
			block.ErrBadPart, layers, heads, MaxPartCells)
	}
	np.cover, np.left = make([]bool, layers*heads), layers*heads
	np.mu.pending = make([]bool, layers*heads)
	np.cond.L = &np.mu.Mutex
	if rs, ok := l.mem.(tiers.Reserver); ok {
		np.loc, np.buf, err = l.reserveSlot(ctx, rs, h.Key, h.Parent, size, np.class)
		if err != nil {
			return nil, false, err
		}
	} else if err = l.heapRoom(size); err != nil {
		return nil, false, err
	} else {
		np.heap, np.buf = true, make([]byte, size)
	}
	copy(np.buf[:h.Len], b[:h.Len])
	l.mu.Lock()
	p, done, err = l.findPartialLocked(h)
	if p == nil && !done && err == nil {
		if l.mu.parts.open == nil {
			l.mu.parts.open = map[prefixhash.Key]*partial{}
		}
		l.mu.parts.open[h.Key] = np
		l.mu.parts.bytes += int64(size)
		l.partialsOpen.Add(1)
		l.mu.Unlock()
		return np, false, nil
	}
	l.mu.Unlock()
	l.freeSlot(np) // a concurrent part created it first, or completed it
	return p, done, err
}

// findPartialLocked finds the incomplete block of h's key; done when the
// block is cached (the part is a no-op, or ErrTenant) or being completed.
func (l *Local) findPartialLocked(h *block.Header) (*partial, bool, error) {
	if i := l.mu.x.find(h.Key); i != 0 {
		if n := l.mu.ns.get(l.mu.x.at(i).ns); n.resolved && n.tenant != h.Tenant {
			return nil, false, fmt.Errorf("%w: key %s is held for tenant %016x, the part is tagged %016x", ErrTenant, h.Key, n.tenant, h.Tenant)
		}
		l.releaseClaimsLocked(h.Key, nil)
		return nil, true, nil
	}
	p := l.mu.parts.open[h.Key]
	switch {
	case p == nil:
		return nil, false, nil
	case p.tenant != h.Tenant:
		return nil, false, fmt.Errorf("%w: block %s is being assembled for tenant %016x, the part is tagged %016x", ErrTenant, h.Key, p.tenant, h.Tenant)
	case p.ns != h.Namespace || p.layout != h.Layout || p.hdrLen != h.Len:
		return nil, false, fmt.Errorf("%w: part %s of %s: its namespace %016x or layout %+v differs from the parts already stored (%016x, %+v)", ErrLayout, h.Part, h.Key, h.Namespace, h.Layout, p.ns, p.layout)
	case p.state == partialSealing:
		return nil, true, nil
	}
	return p, false, nil
}

// placePart compares and copies part b into p. stored: the part was
// accepted (copied, or a no-op); sealing: p is now complete and the caller
// completes it; gone: p was dropped before the part got in.
//
// A part that overlaps no covered cell (the common case: ranks hold
// disjoint ranges) is copied outside p.mu, its cells marked pending so
// that no other part touches them meanwhile; one that overlaps covered
// cells is compared and copied under p.mu. A part waits while cells it
// covers are pending.
func (l *Local) placePart(p *partial, b []byte, h *block.Header, asCopy bool) (stored, sealing, gone bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		l.mu.Lock()
		state := p.state
		l.mu.Unlock()
		if state == partialGone {
			return false, false, true, nil
		}
		if state == partialSealing {
			return true, false, false, nil
		}
		if !p.pendingInLocked(h.Part) {
			break
		}
		p.cond.Wait()
	}
	payload, part := p.buf[p.hdrLen:], b[h.Len:]
	covered, all := p.coveredCells(h.Part)
	switch {
	case covered > 0 && !p.layout.ComparePart(payload, part, p.tokens, h.Part, p.covered):
		l.mu.Lock()
		l.mu.pc.conflicts++
		l.mu.Unlock()
		return false, false, false, fmt.Errorf("%w: part %s of block %s differs from the bytes already stored for the cells it overlaps", ErrPartConflict, h.Part, h.Key)
	case covered == 0:
		p.setPendingLocked(h.Part, true)
		p.mu.copying++
		p.mu.Unlock()
		p.layout.PlacePart(payload, part, p.tokens, h.Part)
		p.mu.Lock()
		p.setPendingLocked(h.Part, false)
		p.mu.copying--
		p.cond.Broadcast()
	case covered < all:
		// Rewrites the covered cells with the same bytes: under p.mu, where
		// other parts compare them.
		p.layout.PlacePart(payload, part, p.tokens, h.Part)
	}
	_, heads := p.layout.Cells()
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.state != partialOpen { // dropped while we copied: the slot is freed after us
		return false, false, p.state == partialGone, nil
	}
	if covered < all {
		for layer := h.Part.L0; layer < h.Part.L1; layer++ {
			for hd := h.Part.H0; hd < h.Part.H1; hd++ {
				if c := &p.cover[layer*heads+hd]; !*c {
					*c = true
					p.left--
				}
			}
		}
		p.parts = append(p.parts, h.Part)
		l.mu.pc.stored++
	}
	p.owned = p.owned || !asCopy
	l.releaseClaimsLocked(h.Key, &h.Part)
	if p.left == 0 {
		p.state = partialSealing
		return true, true, false, nil
	}
	return true, false, false, nil
}

// pendingInLocked reports whether a cell of q is being copied; p.mu is held.
func (p *partial) pendingInLocked(q block.Part) bool {
	if p.mu.copying == 0 {
		return false
	}
	_, heads := p.layout.Cells()
	for layer := q.L0; layer < q.L1; layer++ {
		for h := q.H0; h < q.H1; h++ {
			if p.mu.pending[layer*heads+h] {
				return true
			}
		}
	}
	return false
}

func (p *partial) setPendingLocked(q block.Part, v bool) {
	_, heads := p.layout.Cells()
	for layer := q.L0; layer < q.L1; layer++ {
		for h := q.H0; h < q.H1; h++ {
			p.mu.pending[layer*heads+h] = v
		}
	}
}

// completePartial seals complete p and commits it as a reservation is.
func (l *Local) completePartial(ctx context.Context, p *partial) error {
	err := block.Seal(p.buf)
	if err == nil {
		asCopy := !p.owned && l.opts.Eviction.keepsCopies()
		if p.heap {
			err = l.put(ctx, p.buf, asCopy, nil)
		} else {
			err = l.put(ctx, p.buf, asCopy, &Reservation{loc: p.loc, sealed: true}) // put takes the slot, or frees it
		}
	} else if !p.heap {
		l.freeAll([]freeLoc{{false, p.loc}})
	}
	l.mu.Lock()
	if l.mu.parts.open[p.key] == p {
		delete(l.mu.parts.open, p.key)
		l.partialsOpen.Add(-1)
	}
	l.mu.parts.bytes -= int64(p.size)
	p.state = partialGone
	if err == nil {
		l.mu.pc.completed++
	}
	l.releaseClaimsLocked(p.key, nil)
	l.mu.Unlock()
	return err
}

// freeSlot gives p's slot back; p is in no map.
func (l *Local) freeSlot(p *partial) {
	if !p.heap {
		l.freeAll([]freeLoc{{false, p.loc}})
	}
}

// takePartialLocked removes open p from the map and marks it gone; the
// caller then frees it with freePartials.
func (l *Local) takePartialLocked(p *partial) {
	delete(l.mu.parts.open, p.key)
	l.partialsOpen.Add(-1)
	l.mu.parts.bytes -= int64(p.size)
	p.state = partialGone
}

// dropSuperseded drops the incomplete block of key once a whole block of
// key is cached: its parts are superseded.
func (l *Local) dropSuperseded(key prefixhash.Key) {
	l.mu.Lock()
	p := l.mu.parts.open[key]
	if p == nil || p.state != partialOpen || l.mu.x.find(key) == 0 || !l.enterLocked() {
		l.mu.Unlock()
		return
	}
	defer l.exit()
	l.takePartialLocked(p)
	l.releaseClaimsLocked(key, nil)
	l.mu.Unlock()
	l.freePartials([]*partial{p})
}

// freePartials frees the slots of partials taken by takePartialLocked,
// once the parts being copied into them are done.
func (l *Local) freePartials(ps []*partial) {
	for _, p := range ps {
		p.mu.Lock()
		for p.mu.copying > 0 {
			p.cond.Wait()
		}
		p.mu.Unlock()
		l.freeSlot(p)
	}
}

// dropPartialForRoom drops the oldest open incomplete block whose slot
// frees room for class, reporting whether it did: incomplete blocks go
// before any complete block is demoted or evicted.
func (l *Local) dropPartialForRoom(class int) bool {
	return l.dropOldestPartial(func(p *partial) bool { return !p.heap && (l.classed == nil || p.class == class) })
}

// heapRoom bounds the incomplete blocks assembled in process memory (over
// a memory tier that takes no reservations) to the tier's capacity,
// dropping the oldest of them to make room for size more bytes.
func (l *Local) heapRoom(size int) error {
	limit := l.mem.Stats().Capacity
	for {
		l.mu.Lock()
		var used int64
		for _, p := range l.mu.parts.open {
			if p.heap {
				used += int64(p.size)
			}
		}
		l.mu.Unlock()
		if used+int64(size) <= limit {
			return nil
		}
		if !l.dropOldestPartial(func(p *partial) bool { return p.heap }) {
			return l.refused(tiers.ErrFull, size)
		}
	}
}

// dropOldestPartial drops the oldest open incomplete block that which
// accepts, reporting whether there was one.
func (l *Local) dropOldestPartial(which func(*partial) bool) bool {
	l.mu.Lock()
	var old *partial
	for _, p := range l.mu.parts.open {
		if p.state == partialOpen && which(p) && (old == nil || p.created.Before(old.created)) {
			old = p
		}
	}
	if old != nil {
		l.takePartialLocked(old)
		l.mu.pc.dropped++
	}
	l.mu.Unlock()
	if old == nil {
		return false
	}
	l.freePartials([]*partial{old})
	return true
}

// sweepDueLocked expires incomplete blocks and claims when a sweep is due;
// the caller frees the returned partials after unlocking.
func (l *Local) sweepDueLocked() []*partial {
	now := l.now()
	if now.Before(l.mu.parts.nextSweep) {
		return nil
	}
	l.mu.parts.nextSweep = now.Add(l.sweepEvery())
	return l.sweepLocked(now)
}

func (l *Local) sweepEvery() time.Duration {
	return max(min(l.opts.PartialTTL, l.opts.ClaimTTL)/4, time.Millisecond)
}

// sweepLocked expires the incomplete blocks older than PartialTTL and the
// claims past their time.
func (l *Local) sweepLocked(now time.Time) []*partial {
	var out []*partial
	for _, p := range l.mu.parts.open {
		if p.state == partialOpen && now.Sub(p.created) >= l.opts.PartialTTL {
			out = append(out, p)
		}
	}
	for _, p := range out {
		l.takePartialLocked(p)
		l.mu.pc.expired++
	}
	for k, cs := range l.mu.parts.claims {
		kept := cs[:0]
		for _, c := range cs {
			if now.Before(c.expires) {
				kept = append(kept, c)
			}
		}
		l.setClaimsLocked(k, cs, kept)
	}
	return out
}

// sweep is one round of expiry; the ticker calls it.
func (l *Local) sweep() {
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return
	}
	l.mu.parts.nextSweep = l.now().Add(l.sweepEvery())
	expired := l.sweepLocked(l.now())
	l.mu.Unlock()
	l.freePartials(expired)
	l.exit()
}

// sweepLoop runs sweep until stop is closed.
func (l *Local) sweepLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(l.sweepEvery())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			l.sweep()
		}
	}
}

// closePartialsLocked takes every incomplete block at Close; nothing is in
// flight.
func (l *Local) closePartialsLocked() []*partial {
	var out []*partial
	for _, p := range l.mu.parts.open {
		out = append(out, p)
	}
	for _, p := range out {
		l.takePartialLocked(p)
	}
	l.mu.parts.claims, l.mu.parts.nclaims = nil, 0
	return out
}

// setClaimsLocked replaces key's claims old by kept (a prefix of old).
func (l *Local) setClaimsLocked(key prefixhash.Key, old, kept []claim) {
	l.mu.parts.nclaims -= len(old) - len(kept)
	if len(kept) == 0 {
		delete(l.mu.parts.claims, key)
	} else {
		l.mu.parts.claims[key] = kept
	}
}

// releaseClaimsLocked ends the claims of key that part covers (every claim
// when part is nil).
func (l *Local) releaseClaimsLocked(key prefixhash.Key, part *block.Part) {
	cs, ok := l.mu.parts.claims[key]
	if !ok {
		return
	}
	kept := cs[:0]
	for _, c := range cs {
		if part != nil && !(part.L0 <= c.part.L0 && c.part.L1 <= part.L1 && part.H0 <= c.part.H0 && c.part.H1 <= part.H1) {
			kept = append(kept, c)
		}
	}
	l.setClaimsLocked(key, cs, kept)
}

func overlaps(a, b block.Part) bool {
	return a.L0 < b.L1 && b.L0 < a.L1 && a.H0 < b.H1 && b.H0 < a.H1
}

// Claim asks whether part p of key's block still needs to be sent (the
// answer is the data plane's, which carries it to the rank that asked):
// ClaimComplete (the block is cached), ClaimCovered (the parts stored
// cover p), ClaimClaimed (another writer's open claim overlaps p), or
// ClaimWrite, when the caller now holds a claim on p for Options.ClaimTTL
// (a put of a part covering p releases it). A range that is not a part
// of the block being assembled is block.ErrBadPart.
func (l *Local) Claim(ctx context.Context, key prefixhash.Key, p block.Part) (block.ClaimStatus, error) {
	if err := ctx.Err(); err != nil {
		return block.ClaimWrite, err
	}
	if p.L0 < 0 || p.L1 <= p.L0 || p.H0 < 0 || p.H1 <= p.H0 {
		return block.ClaimWrite, fmt.Errorf("%w: %s is empty or negative", block.ErrBadPart, p)
	}
	a := auth.AccessFrom(ctx)
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return block.ClaimWrite, ErrClosed
	}
	defer l.exit()
	expired := l.sweepDueLocked()
	st, err := l.claimLocked(a, key, p)
	if err == nil {
		l.mu.pc.claims[st]++
	}
	l.mu.Unlock()
	l.freePartials(expired)
	return st, err
}

func (l *Local) claimLocked(a auth.Access, key prefixhash.Key, p block.Part) (block.ClaimStatus, error) {
	if i := l.mu.x.find(key); i != 0 {
		if n := l.mu.ns.get(l.mu.x.at(i).ns); !n.resolved || a.Allows(n.tenant) {
			return block.ClaimComplete, nil
		}
	}
	if pa := l.mu.parts.open[key]; pa != nil && a.Allows(pa.tenant) {
		if pa.state == partialSealing {
			return block.ClaimComplete, nil
		}
		if err := pa.layout.CheckPart(p); err != nil {
			return block.ClaimWrite, err
		}
		if c, all := pa.coveredCells(p); c == all {
			return block.ClaimCovered, nil
		}
	}
	now := l.now()
	cs := l.mu.parts.claims[key]
	for _, c := range cs {
		if now.Before(c.expires) && overlaps(c.part, p) {
			return block.ClaimClaimed, nil
		}
	}
	if l.mu.parts.nclaims < maxClaims {
		if l.mu.parts.claims == nil {
			l.mu.parts.claims = map[prefixhash.Key][]claim{}
		}
		l.mu.parts.claims[key] = append(cs, claim{part: p, expires: now.Add(l.opts.ClaimTTL)})
		l.mu.parts.nclaims++
	}
	return block.ClaimWrite, nil
}

// PartialInfo describes an incomplete block.
type PartialInfo struct {
	Key       prefixhash.Key
	Namespace uint64
	Tokens    int
	Parts     []block.Part // the covered ranges, in the order they came
	Age       time.Duration
	Bytes     int // the slot it holds: the whole block's encoded size
	// Layers and Heads are the block's coverage grid (Heads is 1 with the
	// latent layout); Covered counts the cells covered.
	Layers, Heads, Covered int
	Tenant                 uint64 // the tag of the tenant whose parts these are
}

// Partials lists the incomplete blocks, oldest first.
func (l *Local) Partials() []PartialInfo {
	now := l.now()
	l.mu.Lock()
	out := make([]PartialInfo, 0, len(l.mu.parts.open))
	for _, p := range l.mu.parts.open {
		if p.state != partialOpen {
			continue
		}
		layers, heads := p.layout.Cells()
		out = append(out, PartialInfo{Key: p.key, Namespace: p.ns, Tokens: p.tokens,
			Parts: append([]block.Part(nil), p.parts...), Age: now.Sub(p.created), Bytes: p.size,
			Layers: layers, Heads: heads, Covered: layers*heads - p.left, Tenant: p.tenant})
	}
	l.mu.Unlock()
	sort.Slice(out, func(a, b int) bool {
		if out[a].Age != out[b].Age {
			return out[a].Age > out[b].Age
		}
		return string(out[a].Key[:]) < string(out[b].Key[:])
	})
	return out
}
