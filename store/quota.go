package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Quotas. Each namespace may be given a byte quota per tier; see the package
// doc (Quotas) for the policy. The accounting lives in nsInfo: blocks per
// tier, and bytes reserved per tier by writes and moves in flight. A writer
// or mover reserves before it copies, under the lock and within the quota, so
// the bytes a namespace holds in a tier never exceed its quota, whatever runs
// concurrently; only lowering a quota below what pinned blocks hold leaves a
// namespace over it until they are released and it writes again.
//
// Making room within a namespace needs its coldest blocks, and the recency
// lists are shared by all namespaces. Each namespace keeps a cold cursor per
// tier: an entry of the tier's list such that none of the namespace's blocks
// in that list is colder. A search starts at the cursor instead of the cold
// end and leaves it on the coldest block of the namespace it saw, so the
// other namespaces' cold blocks it walks past are walked past once, not at
// every write. The cursor is kept true by the list operations:
//   - unlisting the cursor's entry moves the cursor to its hotter neighbour
//     (unlistLocked);
//   - a block is listed colder than an entry only when it is placed right
//     behind its parent, which is of its namespace (placeLocked); when the
//     parent carries the namespace's cursor, the cursor moves to the block;
//   - a recovered block joins a namespace when it is resolved: its disk
//     cursor goes back to the cold end.
// An entry carrying any cursor has flagCursor; Local.mu.cursors names them.

// ErrQuota refuses a write that would take its namespace past its quota in
// every tier it could go to, when the namespace cannot make room among its
// own blocks (they are pinned or moving). The node answers ResourceExhausted.
var ErrQuota = errors.New("store: namespace over its quota")

// Quota bounds what one namespace may cache on one node, per tier. Bytes are
// encoded block bytes (header and payload) as Stats reports them; a tier may
// spend a little more on a block (size-class rounding). Zero is unlimited.
//
// A quota set with Bound applies to the namespace only while its blocks carry
// the tag Tenant (0: node-wide blocks): a namespace's digest is known to
// whoever can compute it, so a tenant that wrote first under a node-wide
// digest and set a quota there must not limit the node-wide namespace once
// node-wide blocks take the digest back (see Put). An unbound quota applies
// whatever the blocks carry.
type Quota struct {
	DRAM   int64  // bytes in the memory tier; 0: unlimited
	NVMe   int64  // bytes in the persistent tier; 0: unlimited
	Tenant uint64 // with Bound, the tag of the blocks the quota applies to
	Bound  bool   // apply only to blocks tagged Tenant
}

// appliesTo reports whether q applies to a namespace whose blocks carry tag.
func (q Quota) appliesTo(tag uint64) bool { return !q.Bound || q.Tenant == tag }

func (q Quota) tiers() [2]int64 { return [2]int64{q.DRAM, q.NVMe} }

func (q Quota) validate(field string) error {
	switch {
	case q.DRAM < 0:
		return fmt.Errorf("store: %s.DRAM: %d bytes is negative", field, q.DRAM)
	case q.NVMe < 0:
		return fmt.Errorf("store: %s.NVMe: %d bytes is negative", field, q.NVMe)
	}
	return nil
}

// errNoNamespace: a block's namespace went away while room was made for it.
var errNoNamespace = errors.New("store: namespace gone")

// errOverQuota resolves a recovered block that its namespace's quota has no
// room for: it is evicted.
var errOverQuota = errors.New("store: recovered block over its namespace's quota")

type cursorRef struct {
	ns uint32
	t  int
}

// SetQuota sets the quota of the namespace with the given digest, in place
// of DefaultQuota, and trims the namespace to it at once: a namespace over
// its new quota in a tier has its coldest blocks demoted (memory) or evicted
// as its writes would. When pinned blocks keep it over the quota, the quota
// still holds for every later write and SetQuota returns an error wrapping
// ErrQuota.
func (l *Local) SetQuota(digest uint64, q Quota) error {
	if err := q.validate(fmt.Sprintf("SetQuota(%016x)", digest)); err != nil {
		return err
	}
	return l.changeQuotas(func(t *namespaces) {
		if t.quotas == nil {
			t.quotas = make(map[uint64]Quota)
		}
		t.quotas[digest] = q
	})
}

// ClearQuota removes the namespace's own quota: DefaultQuota applies to it
// again (and trims it, as SetQuota does).
func (l *Local) ClearQuota(digest uint64) error {
	return l.changeQuotas(func(t *namespaces) { delete(t.quotas, digest) })
}

// SetDefaultQuota sets the quota of every namespace without its own, and
// trims them as SetQuota does.
func (l *Local) SetDefaultQuota(q Quota) error {
	if err := q.validate("SetDefaultQuota"); err != nil {
		return err
	}
	return l.changeQuotas(func(t *namespaces) { t.defQuota = q })
}

// Quotas returns a copy of the namespaces' own quotas, by digest, and the
// default quota.
func (l *Local) Quotas() (map[uint64]Quota, Quota) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.mu.ns.quotas), l.mu.ns.defQuota
}

// changeQuotas applies change to the quota configuration, updates the
// namespaces held, and trims those whose quota went down.
func (l *Local) changeQuotas(change func(*namespaces)) error {
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return ErrClosed
	}
	t := &l.mu.ns
	change(t)
	var trim []nsKey
	for id := range t.list {
		n := &t.list[id]
		if !n.resolved {
			continue
		}
		n.quota = t.quotaOf(n.digest, n.tenant).tiers()
		if n.excess(tierMem, 0) > 0 || n.excess(tierDisk, 0) > 0 {
			k := n.key()
			if n.shared() {
				k = nsKey{digest: n.digest} // its digest's blocks and objects together
			}
			if !slices.Contains(trim, k) {
				trim = append(trim, k)
			}
		}
	}
	l.mu.Unlock()
	defer l.exit()
	var errs []error
	for _, d := range trim {
		if err := l.trim(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// trim brings a namespace within its quota: demotes (or drops) its coldest
// idle memory blocks and drops its coldest idle persistent blocks.
func (l *Local) trim(k nsKey) error {
	for round := 0; ; round++ {
		var fr []freeLoc
		var vs []moved
		l.mu.Lock()
		ids := l.mu.ns.sharing(k)
		if len(ids) == 0 {
			l.mu.Unlock()
			return nil
		}
		n := l.mu.ns.get(ids[0])
		exMem, exDisk := n.excess(tierMem, 0), n.excess(tierDisk, 0)
		if exMem <= 0 && exDisk <= 0 {
			l.mu.Unlock()
			return nil
		}
		t := tierMem
		if exMem > 0 && round < maxRoomRounds {
			for _, id := range ids {
				if len(vs) == 0 {
					for _, i := range l.coldNSLocked(id, tierMem, exMem, 0, nil) {
						vs = append(vs, l.markVictimLocked(i))
					}
				}
			}
			l.reserveDemotionsLocked(vs, &fr)
		}
		progress := len(vs) > 0
		if !progress && exDisk > 0 && round < maxRoomRounds {
			t = tierDisk
			for _, id := range ids {
				if !progress {
					dropped, _ := l.dropColdLocked(id, exDisk, 0, &fr)
					progress = dropped > 0
				}
			}
		}
		var err error
		if !progress {
			err = fmt.Errorf("%w: namespace %016x holds %d bytes in %s over its quota of %d in blocks that are pinned or moving",
				ErrQuota, k.digest, max(exMem, exDisk), l.tierName(t), n.quota[t])
		}
		l.mu.Unlock()
		l.freeAll(fr)
		if err != nil {
			return err
		}
		l.demote(vs)
	}
}

// room reserves size bytes in tier t for one block of a namespace. When the
// block would take the namespace past its quota there, room first makes
// room among the namespace's own blocks, coldest first: in memory they are
// demoted (or dropped, see reserveDemotionsLocked), in the persistent tier
// dropped. Blocks of other namespaces are never touched.
//
// h is the header of a new block, whose namespace is created if need be; nil
// for a block already cached, whose namespace (or group, or object group)
// is found by k. When the block's own entry of the table has no idle block
// to make room with, the other entries that share its quota (its digest's
// blocks and object groups; a group's is its own) are tried. parent is
// a new block's parent (zero for a promotion): when the namespace's coldest
// idle memory block is the parent, the block is colder than anything it
// could displace, and room returns errColdest, as makeMemRoom does. Other
// failures wrap ErrQuota. On success the caller holds the reservation and
// hands it to insertLocked or unreserveLocked.
func (l *Local) room(ctx context.Context, h *block.Header, k nsKey, size, class, t int, parent prefixhash.Key) (uint32, error) {
	for round := 0; ; round++ {
		l.mu.Lock()
		var id uint32
		if h != nil {
			var err error
			if id, err = l.mu.ns.ensure(h, size, class); err != nil {
				l.mu.Unlock()
				return 0, err
			}
		} else if id = l.mu.ns.byKey[k]; id == 0 {
			l.mu.Unlock()
			return 0, errNoNamespace
		}
		n := l.mu.ns.get(id)
		excess := n.excess(t, size)
		if excess <= 0 {
			n.addPending(t, int64(size))
			l.mu.Unlock()
			return id, nil
		}
		var err error
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case int64(size) > n.quota[t] || round == maxRoomRounds:
			err = l.quotaErrLocked(n, t, size)
		}
		var fr []freeLoc
		var vs []moved
		if err == nil {
			stopMem, stopDisk, gone := l.quotaStopsLocked(id, parent)
			coldest, progress := gone, false
			if !gone && t == tierDisk {
				var dropped int
				dropped, coldest = l.dropColdLocked(id, excess, stopDisk, &fr)
				for _, o := range l.mu.ns.sharing(n.key()) {
					if dropped > 0 || coldest {
						break
					}
					if o != id {
						dropped, _ = l.dropColdLocked(o, excess, 0, &fr)
					}
				}
				progress = dropped > 0
			} else if stopDisk != 0 {
				// The parent is in the persistent tier: the block is
				// colder than all of the namespace's memory blocks.
				coldest = true
			} else if !gone {
				want := excess
				if l.disk != nil { // batch the writes, within a sixteenth of the quota
					want = max(excess, int64(demoteBatch(l.opts.DemoteBatchBytes, n.quota[t])))
				}
				for _, i := range l.coldNSLocked(id, tierMem, want, stopMem, &coldest) {
					vs = append(vs, l.markVictimLocked(i))
				}
				for _, o := range l.mu.ns.sharing(n.key()) {
					if len(vs) > 0 || coldest {
						break
					}
					if o != id {
						for _, i := range l.coldNSLocked(o, tierMem, want, 0, nil) {
							vs = append(vs, l.markVictimLocked(i))
						}
					}
				}
				l.reserveDemotionsLocked(vs, &fr)
				progress = len(vs) > 0
			}
			switch {
			case progress:
			case coldest:
				err = errColdest
			default:
				err = l.quotaErrLocked(n, t, size)
			}
		}
		if err != nil {
			l.forgetIfEmptyLocked(id)
		}
		l.mu.Unlock()
		l.freeAll(fr)
		if err != nil {
			return 0, err
		}
		l.demote(vs)
	}
}

// tryReserveLocked reserves size bytes in tier t for a new block of h's
// namespace when they fit its quota, without making room. h must have
// passed namespaces.check under this lock.
func (l *Local) tryReserveLocked(h *block.Header, size, class, t int) (uint32, bool) {
	id, err := l.mu.ns.ensure(h, size, class)
	if err != nil {
		panic(fmt.Sprintf("store: a checked block fails its namespace: %v", err))
	}
	n := l.mu.ns.get(id)
	if n.excess(t, size) > 0 {
		l.forgetIfEmptyLocked(id)
		return 0, false
	}
	n.addPending(t, int64(size))
	return id, true
}

func (l *Local) quotaErrLocked(n *nsInfo, t, size int) error {
	if int64(size) > n.quota[t] {
		return fmt.Errorf("%w: namespace %016x: a block of %d bytes is larger than its %s quota of %d bytes",
			ErrQuota, n.digest, size, l.tierName(t), n.quota[t])
	}
	return fmt.Errorf("%w: namespace %016x holds %d bytes of its %s quota of %d, in blocks that are pinned or moving, and a block needs %d",
		ErrQuota, n.digest, n.used(t), l.tierName(t), n.quota[t], size)
}

func (l *Local) tierName(t int) string {
	if t == tierDisk && l.disk != nil {
		return l.disk.Name()
	}
	return l.mem.Name()
}

// quotaStopsLocked returns where a search for a new block's room among its
// namespace's blocks must stop: at its parent, in the parent's tier. What
// lies beyond is warmer than the new block, and dropping the parent would
// orphan it. gone reports that the parent was evicted as soon as it was put
// (so the block goes the same way).
func (l *Local) quotaStopsLocked(id uint32, parent prefixhash.Key) (mem, disk uint32, gone bool) {
	if parent.IsZero() {
		return 0, 0, false
	}
	p := l.mu.x.find(parent)
	if p == 0 {
		return 0, 0, slices.Contains(l.mu.evicted[:], parent)
	}
	switch pe := l.mu.x.at(p); {
	case pe.ns != id:
	case pe.persistent():
		disk = p
	default:
		mem = p
	}
	return mem, disk, false
}

// coldNSLocked returns namespace id's coldest idle blocks in tier t, coldest
// first, worth at least want bytes (or all it has). It stops at stop, and
// then sets *reachedStop. It leaves the namespace's cursor on the coldest of
// its blocks it saw.
func (l *Local) coldNSLocked(id uint32, t int, want int64, stop uint32, reachedStop *bool) []uint32 {
	x := &l.mu.x
	n := l.mu.ns.get(id)
	list := l.mu.diskList
	if t == tierMem {
		list = l.memListLocked(n.class)
	}
	j := n.cursor[t]
	if j == 0 {
		j = x.at(list).prev
	}
	var is []uint32
	first := uint32(0)
	got, seen := int64(0), int64(0)
	for ; j != list && j != 0 && got < want && seen < n.inTier[t]; j = x.at(j).prev {
		e := x.at(j)
		if e.ns != id {
			continue
		}
		seen++
		if first == 0 {
			first = j
		}
		if j == stop && stop != 0 {
			*reachedStop = true
			break
		}
		if e.busy() || l.keepTreeLocked(j, false) {
			continue
		}
		is = append(is, j)
		got += int64(n.size)
	}
	if (j == list || j == 0) && seen < n.inTier[t] {
		panic(fmt.Sprintf("store: namespace %016x has %d blocks in tier %d, %d of them at or above its cursor", n.digest, n.inTier[t], t, seen))
	}
	l.setCursorLocked(id, t, first)
	return is
}

// dropColdLocked drops namespace id's coldest idle persistent blocks (and
// their descendants) until it has dropped need bytes there, or all it can
// short of stop. It returns how many blocks it dropped, and whether it
// reached stop.
func (l *Local) dropColdLocked(id uint32, need int64, stop uint32, fr *[]freeLoc) (int, bool) {
	x := &l.mu.x
	reached := false
	is := l.coldNSLocked(id, tierDisk, need, stop, &reached)
	keys := make([]prefixhash.Key, len(is))
	for k, i := range is {
		keys[k] = x.at(i).key
	}
	dropped := 0
	for k, i := range is {
		// An earlier drop may have taken it with an ancestor (and freed the
		// entry).
		if e := x.at(i); e.key == keys[k] && !e.has(flagDropped) {
			dropped += l.dropLocked(i, reasonEvict, fr)
		}
	}
	return dropped, reached
}

// reserveDemotionsLocked reserves room in the persistent tier, within each
// victim's namespace quota, for memory victims about to be demoted. A
// namespace over its persistent quota drops its own coldest persistent
// blocks first; a victim that still does not fit is marked skipDisk, and
// demote drops it instead.
func (l *Local) reserveDemotionsLocked(vs []moved, fr *[]freeLoc) {
	if l.disk == nil {
		return
	}
	x := &l.mu.x
	for k := range vs {
		m := &vs[k]
		if m.skipDisk || x.at(m.i).has(flagDropped) {
			continue
		}
		if e := x.at(m.i); e.copy() || e.retired() {
			m.skipDisk = true // its owner holds it, or its chain moved past it: not worth a write
			continue
		}
		n := l.mu.ns.get(m.ns)
		if ex := n.excess(tierDisk, m.size); ex > 0 && int64(m.size) <= n.quota[tierDisk] {
			l.dropColdLocked(m.ns, ex, 0, fr)
			if x.at(m.i).has(flagDropped) { // a descendant of what went
				continue
			}
		}
		if n.excess(tierDisk, m.size) > 0 {
			m.skipDisk = true
			continue
		}
		n.addPending(tierDisk, int64(m.size))
		m.reserved = true
	}
}

// unreserveLocked returns a reservation made by room or
// reserveDemotionsLocked.
func (l *Local) unreserveLocked(id uint32, t, size int) {
	n := l.mu.ns.get(id)
	if n.addPending(t, -int64(size)); n.pending[t] < 0 {
		panic(fmt.Sprintf("store: namespace %016x has %d bytes reserved in tier %d", n.digest, n.pending[t], t))
	}
	l.forgetIfEmptyLocked(id)
}

// releaseNSLocked counts one block fewer in namespace id, in tier t.
func (l *Local) releaseNSLocked(id uint32, t int) {
	if l.mu.ns.release(id, t) {
		l.forgetNSLocked(id)
	}
}

// forgetIfEmptyLocked forgets namespace id if it holds nothing. A forgotten
// id (size 0) is left alone.
func (l *Local) forgetIfEmptyLocked(id uint32) {
	if l.mu.ns.get(id).size != 0 && l.mu.ns.empty(id) {
		l.forgetNSLocked(id)
	}
}

func (l *Local) forgetNSLocked(id uint32) {
	for t := range 2 {
		l.setCursorLocked(id, t, 0)
	}
	l.mu.ns.forget(id)
}

// Cold cursors.

// setCursorLocked puts namespace id's cursor for tier t on entry c (0: the
// cold end).
func (l *Local) setCursorLocked(id uint32, t int, c uint32) {
	n := l.mu.ns.get(id)
	old := n.cursor[t]
	if old == c {
		return
	}
	if old != 0 {
		refs := l.mu.cursors[old]
		k := slices.Index(refs, cursorRef{id, t})
		if k < 0 {
			panic(fmt.Sprintf("store: cursor of namespace %016x on entry %d is not registered", n.digest, old))
		}
		if refs = slices.Delete(refs, k, k+1); len(refs) == 0 {
			delete(l.mu.cursors, old)
			l.mu.x.at(old).clear(flagCursor)
		} else {
			l.mu.cursors[old] = refs
		}
	}
	n.cursor[t] = c
	if c != 0 {
		if l.mu.cursors == nil {
			l.mu.cursors = make(map[uint32][]cursorRef)
		}
		l.mu.cursors[c] = append(l.mu.cursors[c], cursorRef{id, t})
		l.mu.x.at(c).set(flagCursor)
	}
}

// uncursorLocked moves the cursors on listed entry i to its hotter
// neighbour.
func (l *Local) uncursorLocked(i uint32) {
	x := &l.mu.x
	to := x.at(i).prev
	if to == 0 || x.at(to).has(flagSentinel) {
		to = 0
	}
	for _, r := range slices.Clone(l.mu.cursors[i]) {
		l.setCursorLocked(r.ns, r.t, to)
	}
}
