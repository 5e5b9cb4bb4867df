package store

import (
	"fmt"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
)

// namespaces is Local's table of the namespaces it holds blocks of, addressed
// by the uint32 id in each entry. A namespace digest commits to the block
// size and layout, so every block of one namespace has the same encoded
// length: the table keeps it once and entries keep none.
//
// Blocks recovered from the persistent tier whose header has not been read
// yet are grouped into unresolved pseudo-namespaces, one per block length
// (digest 0), until a read resolves them.
//
// The table also holds the quota configuration (quota.go). A namespace is
// forgotten when it holds no block and no reservation.
type namespaces struct {
	list       []nsInfo // by id; id 0 is unused
	free       []uint32
	byDigest   map[uint64]uint32
	unresolved map[int]uint32 // block length → pseudo-namespace id

	quotas   map[uint64]Quota // explicit quotas by digest
	defQuota Quota            // quota of resolved namespaces not in quotas
}

type nsInfo struct {
	digest   uint64
	tenant   uint64 // tag of the tenant whose blocks these are (Header.Tenant)
	size     int    // encoded block length
	tokens   int    // tokens per block (0 when unresolved)
	layout   block.Layout
	class    int // memory-tier size class of size (0 when the tier is not Classed)
	resolved bool
	blocks   int64

	inTier  [2]int64  // blocks per tier (tierMem, tierDisk)
	pending [2]int64  // bytes reserved per tier by writers and movers in flight
	quota   [2]int64  // bytes per tier; 0 is unlimited
	cursor  [2]uint32 // cold cursor per tier (quota.go); 0: the cold end
}

// used returns the bytes the namespace holds or has reserved in tier t.
func (n *nsInfo) used(t int) int64 { return n.inTier[t]*int64(n.size) + n.pending[t] }

// excess returns how many bytes past its quota in tier t the namespace would
// be with size more bytes there; 0 or less when they fit.
func (n *nsInfo) excess(t, size int) int64 {
	if n.quota[t] == 0 {
		return 0
	}
	return n.used(t) + int64(size) - n.quota[t]
}

func (t *namespaces) get(id uint32) *nsInfo { return &t.list[id] }

func (t *namespaces) add(n nsInfo) uint32 {
	var id uint32
	if k := len(t.free); k > 0 {
		id, t.free = t.free[k-1], t.free[:k-1]
		t.list[id] = n
	} else {
		if len(t.list) == 0 {
			t.list = append(t.list, nsInfo{})
		}
		id = uint32(len(t.list))
		t.list = append(t.list, n)
	}
	if n.resolved {
		if t.byDigest == nil {
			t.byDigest = make(map[uint64]uint32)
		}
		t.byDigest[n.digest] = id
		t.list[id].quota = t.quotaOf(n.digest, n.tenant).tiers()
	} else {
		if t.unresolved == nil {
			t.unresolved = make(map[int]uint32)
		}
		t.unresolved[n.size] = id
	}
	return id
}

// quotaOf returns the quota in force for a resolved namespace whose blocks
// carry tag.
func (t *namespaces) quotaOf(digest, tag uint64) Quota {
	if q, ok := t.quotas[digest]; ok && q.appliesTo(tag) {
		return q
	}
	return t.defQuota
}

// fits reports whether size more bytes in tier t keep the namespace with the
// given digest, whose blocks carry tag, within its quota.
func (t *namespaces) fits(digest, tag uint64, tier, size int) bool {
	if id := t.byDigest[digest]; id != 0 {
		return t.list[id].excess(tier, size) <= 0
	}
	q := t.quotaOf(digest, tag).tiers()[tier]
	return q == 0 || int64(size) <= q
}

// check returns the id of h's namespace (0 if unknown) after checking that h
// agrees with the blocks of it already held.
func (t *namespaces) check(h *block.Header, size int) (uint32, error) {
	id := t.byDigest[h.Namespace]
	if id == 0 {
		return 0, nil
	}
	n := &t.list[id]
	if n.tenant != h.Tenant {
		return 0, fmt.Errorf("%w: block %s of namespace %016x is tagged for tenant %016x; the namespace's cached blocks are another tenant's",
			ErrTenant, h.Key, h.Namespace, h.Tenant)
	}
	if n.size != size || n.tokens != len(h.Tokens) || n.layout != h.Layout {
		return 0, fmt.Errorf("%w: block %s of namespace %016x has %d tokens, layout %+v, %d bytes; the namespace's cached blocks have %d tokens, layout %+v, %d bytes",
			ErrLayout, h.Key, h.Namespace, len(h.Tokens), h.Layout, size, n.tokens, n.layout, n.size)
	}
	return id, nil
}

// ensure returns the id of h's namespace, creating it (holding nothing yet)
// with the given size class. A namespace created here must be given a block
// or a reservation, or be forgotten, before the lock is released.
func (t *namespaces) ensure(h *block.Header, size, class int) (uint32, error) {
	id, err := t.check(h, size)
	if err != nil {
		return 0, err
	}
	if id == 0 {
		id = t.add(nsInfo{digest: h.Namespace, tenant: h.Tenant, size: size, tokens: len(h.Tokens), layout: h.Layout, class: class, resolved: true})
	}
	return id, nil
}

// acquire returns the id of h's namespace, creating it with the given size
// class, and counts one more block in it, in tier.
func (t *namespaces) acquire(h *block.Header, size, class, tier int) (uint32, error) {
	id, err := t.ensure(h, size, class)
	if err != nil {
		return 0, err
	}
	t.list[id].blocks++
	t.list[id].inTier[tier]++
	return id, nil
}

// acquireUnresolved counts one more recovered block of length size.
func (t *namespaces) acquireUnresolved(size int) uint32 {
	id := t.unresolved[size]
	if id == 0 {
		id = t.add(nsInfo{size: size})
	}
	t.list[id].blocks++
	t.list[id].inTier[tierDisk]++
	return id
}

// release counts one block fewer in id, in tier, and reports whether the
// namespace now holds nothing (then the caller forgets it).
func (t *namespaces) release(id uint32, tier int) bool {
	n := &t.list[id]
	n.blocks--
	n.inTier[tier]--
	if n.blocks < 0 || n.inTier[tier] < 0 {
		panic(fmt.Sprintf("store: namespace %016x holds %d blocks, %d in tier %d", n.digest, n.blocks, n.inTier[tier], tier))
	}
	return t.empty(id)
}

// empty reports whether id holds no block and no reservation.
func (t *namespaces) empty(id uint32) bool {
	n := &t.list[id]
	return n.blocks == 0 && n.pending == [2]int64{}
}

// forget removes an empty namespace; its id may be reused.
func (t *namespaces) forget(id uint32) {
	n := &t.list[id]
	if !t.empty(id) {
		panic(fmt.Sprintf("store: forgetting namespace %016x, which holds %d blocks and %v reserved bytes", n.digest, n.blocks, n.pending))
	}
	if n.resolved {
		delete(t.byDigest, n.digest)
	} else {
		delete(t.unresolved, n.size)
	}
	*n = nsInfo{}
	t.free = append(t.free, id)
}

// allows reports whether a request with access a may see the blocks of
// namespace id. A recovered block whose header is not read yet is seen
// only by unscoped requests: its tenant is not known.
func (t *namespaces) allows(a auth.Access, id uint32) bool {
	if !a.Scoped {
		return true
	}
	n := &t.list[id]
	return n.resolved && n.tenant == a.Tag
}
