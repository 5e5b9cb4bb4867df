package store

import (
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
)

// namespaces is Local's table of the namespaces it holds blocks of, addressed
// by the uint32 id in each entry. A namespace digest commits to the block
// size and layout, so every block of one namespace has the same encoded
// length: the table keeps it once and entries keep none. A namespace with
// groups (hybrid models) has one record size per group: each group is an
// entry of its own (nsKey), and what is asked by digest (a drop, a
// tenant, stats) covers all of them; a quota holds each group to it.
//
// Objects (block.KindObject records) have a size of their own each. A
// namespace's objects are grouped by encoded size into object groups, one
// entry of the table each (nsKey.obj), so that a group, like a namespace's
// blocks, has one size, one size class and one cold cursor per tier. What
// a digest's blocks (outside groups) and objects hold against its quota is
// counted in one account (nsAcct), which also knows every entry of the
// digest and its tenant.
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
	byKey      map[nsKey]uint32
	accts      map[uint64]*nsAcct // by digest, while any entry of it is held
	unresolved map[int]uint32     // block length → pseudo-namespace id

	quotas   map[uint64]Quota // explicit quotas by digest
	defQuota Quota            // quota of resolved namespaces not in quotas
}

// nsKey names an entry of the table: a namespace digest, and for a
// namespace with groups the group (its index + 1; 0 without groups), or
// for an object group the encoded size of its objects (0 for blocks).
type nsKey struct {
	digest uint64
	group  uint8
	obj    int
}

// keyOf returns the table key of h's namespace (and group, or object
// group).
func keyOf(h *block.Header) nsKey {
	k := nsKey{digest: h.Namespace}
	switch {
	case h.Kind == block.KindObject:
		k.obj = h.Len + h.PayloadLen
	case h.Group.Set:
		k.group = uint8(h.Group.Index + 1)
	}
	return k
}

// nsAcct is what the entries of one digest hold together: the bytes of its
// blocks outside groups and of its object groups (what its quota bounds;
// each group of a hybrid namespace is held to the quota on its own), the
// tenant they belong to, and which entries there are.
type nsAcct struct {
	digest uint64
	tenant uint64
	used   [2]int64 // bytes held or reserved per tier
	ids    []uint32 // table entries of the digest
	// pinned is the bytes of the digest's values under a hard pin or an
	// unexpired lease (retain.go), which its quota bounds too.
	pinned int64
}

type nsInfo struct {
	digest   uint64
	group    uint8  // nsKey.group
	tenant   uint64 // tag of the tenant whose blocks these are (Header.Tenant)
	size     int    // encoded block length
	tokens   int    // tokens per block (0 when unresolved, and for objects)
	layout   block.Layout
	class    int // memory-tier size class of size (0 when the tier is not Classed)
	resolved bool
	object   bool    // an object group: objects of digest of this size
	acct     *nsAcct // the digest's account; nil while unresolved
	blocks   int64

	inTier  [2]int64  // blocks per tier (tierMem, tierDisk)
	pending [2]int64  // bytes reserved per tier by writers and movers in flight
	quota   [2]int64  // bytes per tier; 0 is unlimited
	cursor  [2]uint32 // cold cursor per tier (quota.go); 0: the cold end
}

// used returns the bytes this entry of the table holds or has reserved in
// tier t.
func (n *nsInfo) used(t int) int64 { return n.inTier[t]*int64(n.size) + n.pending[t] }

// shared reports whether n's bytes count in its digest's account (blocks
// outside groups, and objects) rather than on their own (a group's).
func (n *nsInfo) shared() bool { return n.acct != nil && n.group == 0 }

// held returns the bytes the namespace holds or has reserved in tier t:
// what its quota bounds (every entry of its digest but its groups', or
// the group's own).
func (n *nsInfo) held(t int) int64 {
	if n.shared() {
		return n.acct.used[t]
	}
	return n.used(t)
}

// addBlocks counts k more blocks in tier t (k may be negative).
func (n *nsInfo) addBlocks(t int, k int64) {
	n.inTier[t] += k
	if n.shared() {
		n.acct.used[t] += k * int64(n.size)
	}
}

// addPending counts b more bytes reserved in tier t (b may be negative).
func (n *nsInfo) addPending(t int, b int64) {
	n.pending[t] += b
	if n.shared() {
		n.acct.used[t] += b
	}
}

// excess returns how many bytes past its quota in tier t the namespace would
// be with size more bytes there; 0 or less when they fit.
func (n *nsInfo) excess(t, size int) int64 {
	if n.quota[t] == 0 {
		return 0
	}
	return n.held(t) + int64(size) - n.quota[t]
}

// key returns n's table key.
func (n *nsInfo) key() nsKey {
	k := nsKey{digest: n.digest, group: n.group}
	if n.object {
		k.obj = n.size
	}
	return k
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
		if t.byKey == nil {
			t.byKey = make(map[nsKey]uint32)
		}
		t.byKey[n.key()] = id
		a := t.accts[n.digest]
		if a == nil {
			if t.accts == nil {
				t.accts = make(map[uint64]*nsAcct)
			}
			a = &nsAcct{digest: n.digest, tenant: n.tenant}
			t.accts[n.digest] = a
		}
		a.ids = append(a.ids, id)
		t.list[id].acct = a
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

// same reports whether entries a and b are of one namespace: the same
// entry, or two groups of one resolved namespace.
func (t *namespaces) same(a, b uint32) bool {
	return a == b || t.list[a].resolved && t.list[b].resolved && t.list[a].digest == t.list[b].digest
}

// idsOf returns the ids of every entry of the namespace with the given
// digest: its blocks (one entry, or one per group held) and its object
// groups.
func (t *namespaces) idsOf(digest uint64) []uint32 {
	if a := t.accts[digest]; a != nil {
		return slices.Clone(a.ids)
	}
	return nil
}

// sharing returns the entries whose bytes count against k's quota: for
// blocks outside groups and objects, every such entry of the digest; for
// a group, its own entry.
func (t *namespaces) sharing(k nsKey) []uint32 {
	if a := t.accts[k.digest]; a != nil && k.group == 0 {
		return slices.DeleteFunc(slices.Clone(a.ids), func(id uint32) bool { return t.list[id].group != 0 })
	}
	if id := t.byKey[k]; id != 0 {
		return []uint32{id}
	}
	return nil
}

// fits reports whether size more bytes in tier t keep the namespace (or
// group) k, whose blocks carry tag, within its quota.
func (t *namespaces) fits(k nsKey, tag uint64, tier, size int) bool {
	if a := t.accts[k.digest]; a != nil && k.group == 0 {
		q := t.quotaOf(k.digest, a.tenant).tiers()[tier]
		return q == 0 || a.used[tier]+int64(size) <= q
	}
	if id := t.byKey[k]; id != 0 {
		return t.list[id].excess(tier, size) <= 0
	}
	q := t.quotaOf(k.digest, tag).tiers()[tier]
	return q == 0 || int64(size) <= q
}

// check returns the id of h's entry of the table (its namespace's blocks,
// a group's, or its object group; 0 if unknown) after checking that h
// agrees with what the namespace holds already.
func (t *namespaces) check(h *block.Header, size int) (uint32, error) {
	if a := t.accts[h.Namespace]; a != nil && a.tenant != h.Tenant {
		return 0, fmt.Errorf("%w: block %s of namespace %016x is tagged for tenant %016x; the namespace's cached blocks are another tenant's",
			ErrTenant, h.Key, h.Namespace, h.Tenant)
	}
	id := t.byKey[keyOf(h)]
	if id == 0 || h.Kind == block.KindObject {
		return id, nil
	}
	n := &t.list[id]
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
		n := nsInfo{digest: h.Namespace, group: keyOf(h).group, tenant: h.Tenant, size: size, tokens: len(h.Tokens), layout: h.Layout, class: class, resolved: true}
		if h.Kind == block.KindObject {
			n.tokens, n.layout, n.object = 0, block.Layout{}, true
		}
		id = t.add(n)
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
	t.list[id].addBlocks(tier, 1)
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
	n.addBlocks(tier, -1)
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
		delete(t.byKey, n.key())
	} else {
		delete(t.unresolved, n.size)
	}
	if a := n.acct; a != nil {
		a.ids = slices.DeleteFunc(a.ids, func(o uint32) bool { return o == id })
		if len(a.ids) == 0 {
			if a.used != [2]int64{} || a.pinned != 0 {
				panic(fmt.Sprintf("store: namespace %016x forgotten with %v bytes held and %d pinned", n.digest, a.used, a.pinned))
			}
			delete(t.accts, n.digest)
		}
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
