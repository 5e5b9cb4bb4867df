package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Retention (issue 33): what keeps a cached value (an object's piece, or a
// block of a pinned prefix) from eviction.
//
//   - A lease (block.PinNone with a TTL) keeps the value until the TTL
//     lapses.
//   - A soft pin is evicted only when nothing unpinned is left: a victim
//     search passes soft-pinned values over, and takes them only when it
//     found nothing else. With a TTL, the pin lapses then.
//   - A hard pin is never evicted (with a TTL: until it lapses).
//
// Leases and hard pins are bounded, so that no namespace pins a node full:
// the bytes they hold on a node are at most Options.MaxPinnedFraction of the
// node's tiers together, and a namespace with a quota holds at most its
// quota (DRAM and NVMe together) under them. A retention past either limit
// is refused with ErrQuota; a TTL over Options.MaxRetentionTTL with
// ErrRetentionTTL.
//
// Retained values are never chosen by pressure: not demoted, not evicted, not
// taken for a namespace's quota room; a persistent-tier segment reclaim
// rewrites them as it rewrites hit blocks. Nor are their cached ancestors
// dropped for room (keepTreeLocked), which would drop them with them: a
// retained block keeps its prefix on this node (not counted against the
// pin limits; retaining a prompt retains its whole chain anyway). A
// block a reader holds keeps its prefix the same way. When the TTL lapses
// the value is ordinary again; evicted before anyone reads it, it counts as
// expired (TierEvictions.Expired). A victim search that meets one
// moves it to the hot end of its list, so that the next search does not
// walk past it again. Explicit removals (Remove, DropNamespace) ignore
// retention. Retention lives in memory: a restart recovers the values, not
// their retention (the object record's own retention is applied once, when
// it is stored).
//
// An entry under retention carries hitsRetained; Local.mu.retain holds the
// details by entry.

// ErrRetentionTTL refuses a retention whose TTL is negative or over
// Options.MaxRetentionTTL (gRPC InvalidArgument).
var ErrRetentionTTL = errors.New("store: retention TTL out of range")

type retention struct {
	pin   block.Pin
	until time.Time // zero: no TTL
	size  int       // the entry's encoded bytes, when it was retained
}

// counted reports whether r holds bytes against the pin limits: a hard pin
// or a lease.
func (r retention) counted() bool { return r.pin != block.PinSoft }

type retainState struct {
	by     map[uint32]retention
	pinned int64     // bytes of counted retentions
	next   time.Time // the earliest TTL among them (zero: none)
}

// Retained reports how many values are under retention on this node and
// the bytes of those under a hard pin or a lease.
func (l *Local) Retained() (values int, pinnedBytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expireRetentionsLocked(l.now())
	return len(l.mu.retain.by), l.mu.retain.pinned
}

// Retain sets the retention of the cached values of keys that ctx's access
// may see, replacing what they had (block.Retention{} clears it), and
// reports per key whether it was applied (false: not cached here, or not
// visible to the caller). It refuses the whole call, changing nothing, when
// the retention is over a limit (ErrQuota, ErrRetentionTTL).
func (l *Local) Retain(ctx context.Context, keys []prefixhash.Key, r block.Retention) ([]bool, error) {
	if err := l.checkRetention(r); err != nil {
		return nil, err
	}
	a := auth.AccessFrom(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return nil, ErrClosed
	}
	now := l.now()
	l.expireRetentionsLocked(now)
	applied := make([]bool, len(keys))
	is := make([]uint32, len(keys))
	// Check the limits over the whole call first: all or nothing.
	delta := map[*nsAcct]int64{}
	var total int64
	for k, key := range keys {
		i := l.mu.x.find(key)
		if i == 0 || !l.mu.ns.allows(a, l.mu.x.at(i).ns) {
			continue
		}
		is[k] = i
		n := l.mu.ns.get(l.mu.x.at(i).ns)
		d := -l.countedLocked(i)
		if r.Pin != block.PinSoft && (r.Pin == block.PinHard || r.TTL > 0) {
			d += int64(n.size)
		}
		total += d
		if n.acct != nil {
			delta[n.acct] += d
		}
	}
	for acct, d := range delta {
		if err := l.pinRoomLocked(acct, total, d); err != nil {
			return nil, err
		}
	}
	for k, i := range is {
		if i == 0 {
			continue
		}
		l.setRetentionLocked(i, r, now)
		applied[k] = true
	}
	return applied, nil
}

// pinRoomForLocked refuses retention r for a new value of table entry id
// when it would pass a limit.
func (l *Local) pinRoomForLocked(id uint32, r block.Retention) error {
	if r.Pin == block.PinSoft || r.Pin == block.PinNone && r.TTL == 0 {
		return nil
	}
	l.expireRetentionsLocked(l.now())
	n := l.mu.ns.get(id)
	return l.pinRoomLocked(n.acct, int64(n.size), int64(n.size))
}

// checkRetention refuses a retention the options do not allow.
func (l *Local) checkRetention(r block.Retention) error {
	switch {
	case r.Pin > block.PinHard:
		return fmt.Errorf("store: unknown pin %d", r.Pin)
	case r.TTL < 0 || r.TTL > l.opts.MaxRetentionTTL:
		return fmt.Errorf("%w: %v is outside 0..%v (MaxRetentionTTL)", ErrRetentionTTL, r.TTL, l.opts.MaxRetentionTTL)
	}
	return nil
}

// countedLocked returns the bytes entry i holds against the pin limits.
func (l *Local) countedLocked(i uint32) int64 {
	if !l.mu.x.at(i).retained() {
		return 0
	}
	if r := l.mu.retain.by[i]; r.counted() {
		return int64(r.size)
	}
	return 0
}

// pinRoomLocked refuses d more pinned bytes of the namespace of acct (and
// total more on the node) when they would pass a limit.
func (l *Local) pinRoomLocked(acct *nsAcct, total, d int64) error {
	if total > 0 {
		if limit := l.pinLimit(); l.mu.retain.pinned+total > limit {
			return fmt.Errorf("%w: %d bytes are pinned or leased on this node and %d more would pass its limit of %d (MaxPinnedFraction of its tiers)",
				ErrQuota, l.mu.retain.pinned, total, limit)
		}
	}
	if d <= 0 {
		return nil
	}
	q := l.mu.ns.quotaOf(acct.digest, acct.tenant)
	var limit int64
	switch {
	case q.DRAM == 0:
		return nil // unlimited in memory: the node's limit bounds it
	case l.disk == nil:
		limit = q.DRAM
	case q.NVMe == 0:
		return nil
	default:
		limit = q.DRAM + q.NVMe
	}
	if acct.pinned+d > limit {
		return fmt.Errorf("%w: namespace %016x pins or leases %d bytes and %d more would pass its quota of %d",
			ErrQuota, acct.digest, acct.pinned, d, limit)
	}
	return nil
}

// pinLimit is the most bytes leases and hard pins may hold on the node.
func (l *Local) pinLimit() int64 {
	c := l.mem.Stats().Capacity
	if l.disk != nil {
		c += l.disk.Stats().Capacity
	}
	return int64(float64(c) * l.opts.MaxPinnedFraction)
}

// setRetentionLocked gives entry i retention r from now (the zero r clears
// it). The caller checked the limits.
func (l *Local) setRetentionLocked(i uint32, r block.Retention, now time.Time) {
	l.clearRetentionLocked(i)
	if r == (block.Retention{}) {
		return
	}
	e := l.mu.x.at(i)
	e.hits &^= hitsLapsed
	n := l.mu.ns.get(e.ns)
	rt := retention{pin: r.Pin, size: n.size}
	if r.TTL > 0 {
		rt.until = now.Add(r.TTL)
		if l.mu.retain.next.IsZero() || rt.until.Before(l.mu.retain.next) {
			l.mu.retain.next = rt.until
		}
	}
	if l.mu.retain.by == nil {
		l.mu.retain.by = make(map[uint32]retention)
	}
	l.mu.retain.by[i] = rt
	e.hits |= hitsRetained
	if rt.counted() {
		l.mu.retain.pinned += int64(rt.size)
		if n.acct != nil {
			n.acct.pinned += int64(rt.size)
		}
	}
}

// clearRetentionLocked takes entry i's retention away, if it has one.
func (l *Local) clearRetentionLocked(i uint32) {
	e := l.mu.x.at(i)
	if !e.retained() {
		return
	}
	r := l.mu.retain.by[i]
	delete(l.mu.retain.by, i)
	e.hits &^= hitsRetained
	if r.counted() {
		l.mu.retain.pinned -= int64(r.size)
		if n := l.mu.ns.get(e.ns); n.acct != nil {
			n.acct.pinned -= int64(r.size)
		}
	}
}

// lapseRetentionLocked clears entry i's retention, whose TTL lapsed, and
// marks it: evicted before anyone reads it, it counts as expired
// (TierEvictions.Expired).
func (l *Local) lapseRetentionLocked(i uint32) {
	l.clearRetentionLocked(i)
	l.mu.x.at(i).hits |= hitsLapsed
}

// expireRetentionsLocked clears the retentions whose TTL has lapsed; it
// walks them only when one may have.
func (l *Local) expireRetentionsLocked(now time.Time) {
	if l.mu.retain.next.IsZero() || now.Before(l.mu.retain.next) {
		return
	}
	next := time.Time{}
	for i, r := range l.mu.retain.by {
		switch {
		case r.until.IsZero():
		case !now.Before(r.until):
			l.lapseRetentionLocked(i)
		case next.IsZero() || r.until.Before(next):
			next = r.until
		}
	}
	l.mu.retain.next = next
}

// keepLocked reports whether entry i must stay put under pressure: it is
// retained, and (soft) its pin is not a soft one that a search that found
// nothing else may take. A lapsed retention is cleared on the way.
func (l *Local) keepLocked(i uint32, takeSoft bool) bool {
	e := l.mu.x.at(i)
	if !e.retained() {
		return false
	}
	r := l.mu.retain.by[i]
	if !r.until.IsZero() && !l.now().Before(r.until) {
		l.lapseRetentionLocked(i)
		return false
	}
	return r.pin != block.PinSoft || !takeSoft
}

// keepTreeLocked is keepLocked for a victim whose drop would take its
// cached descendants with it: it also keeps a block any of whose
// descendants must stay, retained (keepLocked) or held by a reader (a
// Ref pins it). So a retained or held block keeps its prefix on this node,
// and is never dropped with an ancestor. The walk runs only while
// something is retained or held, and only below a block with children
// (rare at the cold end: a put places a child behind its parent); past
// maxVictimWalk descendants it keeps the block.
func (l *Local) keepTreeLocked(i uint32, takeSoft bool) bool {
	if l.keepLocked(i, takeSoft) {
		return true
	}
	x := &l.mu.x
	first := x.at(i).child
	if first == 0 || len(l.mu.retain.by) == 0 && l.mu.refs == 0 {
		return false
	}
	// A victim walk asks this of every candidate while anything is
	// retained or held (readers hold blocks through every GetMany), so the
	// stack starts on this frame's array rather than the heap.
	var buf [32]uint32
	stack := append(buf[:0], first)
	for walked := 0; len(stack) > 0; {
		c := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for ; c != 0; c = x.at(c).sib {
			if walked++; walked > maxVictimWalk {
				return true
			}
			if x.at(c).pins > 0 || l.keepLocked(c, takeSoft) {
				return true
			}
			if ch := x.at(c).child; ch != 0 {
				stack = append(stack, ch)
			}
		}
	}
	return false
}

// retentionOf returns entry i's retention as callers see it: the pin and
// the TTL left.
func (l *Local) retentionOf(i uint32) block.Retention {
	if !l.mu.x.at(i).retained() {
		return block.Retention{}
	}
	r := l.mu.retain.by[i]
	out := block.Retention{Pin: r.pin}
	if !r.until.IsZero() {
		out.TTL = max(r.until.Sub(l.now()), time.Millisecond)
	}
	return out
}
