package store

import "fmt"

// namespaces is Local's table of the namespaces it holds blocks of, addressed
// by the uint32 id in each entry. A namespace digest commits to the block
// size and layout, so every block of one namespace has the same encoded
// length: the table keeps it once and entries keep none.
//
// Blocks recovered from the persistent tier whose header has not been read
// yet are grouped into unresolved pseudo-namespaces, one per block length
// (digest 0), until a read resolves them.
type namespaces struct {
	list       []nsInfo // by id; id 0 is unused
	free       []uint32
	byDigest   map[uint64]uint32
	unresolved map[int]uint32 // block length → pseudo-namespace id
}

type nsInfo struct {
	digest   uint64
	size     int // encoded block length
	tokens   int // tokens per block (0 when unresolved)
	layout   Layout
	class    int // memory-tier size class of size (0 when the tier is not Classed)
	resolved bool
	blocks   int64
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
	} else {
		if t.unresolved == nil {
			t.unresolved = make(map[int]uint32)
		}
		t.unresolved[n.size] = id
	}
	return id
}

// check returns the id of h's namespace (0 if unknown) after checking that h
// agrees with the blocks of it already held.
func (t *namespaces) check(h *Header, size int) (uint32, error) {
	id := t.byDigest[h.Namespace]
	if id == 0 {
		return 0, nil
	}
	n := &t.list[id]
	if n.size != size || n.tokens != len(h.Tokens) || n.layout != h.Layout {
		return 0, fmt.Errorf("%w: block %s of namespace %016x has %d tokens, layout %+v, %d bytes; the namespace's cached blocks have %d tokens, layout %+v, %d bytes",
			ErrLayout, h.Key, h.Namespace, len(h.Tokens), h.Layout, size, n.tokens, n.layout, n.size)
	}
	return id, nil
}

// acquire returns the id of h's namespace, creating it with the given size
// class, and counts one more block in it.
func (t *namespaces) acquire(h *Header, size, class int) (uint32, error) {
	id, err := t.check(h, size)
	if err != nil {
		return 0, err
	}
	if id == 0 {
		id = t.add(nsInfo{digest: h.Namespace, size: size, tokens: len(h.Tokens), layout: h.Layout, class: class, resolved: true})
	}
	t.list[id].blocks++
	return id, nil
}

// acquireUnresolved counts one more recovered block of length size.
func (t *namespaces) acquireUnresolved(size int) uint32 {
	id := t.unresolved[size]
	if id == 0 {
		id = t.add(nsInfo{size: size})
	}
	t.list[id].blocks++
	return id
}

// release counts one block fewer in id and forgets the namespace when it
// holds none.
func (t *namespaces) release(id uint32) {
	n := &t.list[id]
	n.blocks--
	if n.blocks > 0 {
		return
	}
	if n.blocks < 0 {
		panic(fmt.Sprintf("store: namespace %016x holds %d blocks", n.digest, n.blocks))
	}
	if n.resolved {
		delete(t.byDigest, n.digest)
	} else {
		delete(t.unresolved, n.size)
	}
	*n = nsInfo{}
	t.free = append(t.free, id)
}
