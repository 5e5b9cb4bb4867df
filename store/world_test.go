package store

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// The tests' world: random chains of blocks of one namespace (world), a
// map-based model of the store (refModel), and a Local closed at cleanup.

// world is a forest of random blocks with shared prefixes: each new block
// extends the root or an existing block, so chains share ancestors.
type world struct {
	t      testing.TB
	rng    *rand.Rand
	ns     prefixhash.Namespace
	blocks []wblock
	byKey  map[prefixhash.Key]int
}

type wblock struct {
	key    prefixhash.Key
	parent int // -1: the namespace root
	enc    []byte
}

func newWorld(t testing.TB, seed uint64, ns prefixhash.Namespace) *world {
	return &world{t: t, rng: rand.New(rand.NewPCG(seed, seed)), ns: ns, byKey: map[prefixhash.Key]int{}}
}

// grow adds a block under a random existing block (or the root) and returns
// its index.
func (w *world) grow() int {
	parent := -1
	if n := len(w.blocks); n > 0 && w.rng.IntN(8) > 0 {
		// Prefer recent blocks, so chains get long.
		parent = n - 1 - min(n-1, int(w.rng.ExpFloat64()*8))
	}
	return w.extend(parent)
}

func (w *world) extend(parent int) int {
	pk := w.ns.Root()
	if parent >= 0 {
		pk = w.blocks[parent].key
	}
	enc, key, _, _ := blocktest.Random(w.t, w.rng, w.ns, pk)
	w.blocks = append(w.blocks, wblock{key: key, parent: parent, enc: enc})
	w.byKey[key] = len(w.blocks) - 1
	return len(w.blocks) - 1
}

// putChain puts a new chain of n blocks from the root into l and returns the
// index of its last block.
func (w *world) putChain(t testing.TB, l *Local, n int) int {
	t.Helper()
	last := -1
	for range n {
		last = w.extend(last)
		if err := l.Put(context.Background(), w.blocks[last].enc); err != nil {
			t.Fatal(err)
		}
	}
	return last
}

// putGrown grows n random blocks and puts them into l.
func (w *world) putGrown(t testing.TB, l *Local, n int) {
	t.Helper()
	for range n {
		if err := l.Put(context.Background(), w.blocks[w.grow()].enc); err != nil {
			t.Fatal(err)
		}
	}
}

// putGet puts b into l and returns a Ref to it.
func putGet(t testing.TB, l *Local, b wblock) *Ref {
	t.Helper()
	if err := l.Put(context.Background(), b.enc); err != nil {
		t.Fatal(err)
	}
	r, err := l.Get(context.Background(), b.key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// chain returns the keys from the root down to block i.
func (w *world) chain(i int) []prefixhash.Key {
	var ks []prefixhash.Key
	for ; i >= 0; i = w.blocks[i].parent {
		ks = append(ks, w.blocks[i].key)
	}
	for a, b := 0, len(ks)-1; a < b; a, b = a+1, b-1 {
		ks[a], ks[b] = ks[b], ks[a]
	}
	return ks
}

func (w *world) randomBlock() int { return w.rng.IntN(len(w.blocks)) }

// refModel is the reference the store must agree with when nothing is
// evicted: a map.
type refModel map[prefixhash.Key][]byte

func (m refModel) put(key prefixhash.Key, b []byte) {
	if _, ok := m[key]; !ok {
		m[key] = b
	}
}

func (m refModel) get(key prefixhash.Key) ([]byte, bool) { b, ok := m[key]; return b, ok }

func (m refModel) longestPrefix(keys []prefixhash.Key) int {
	for n, k := range keys {
		if _, ok := m[k]; !ok {
			return n
		}
	}
	return len(keys)
}

func openLocal(t testing.TB, opts Options) *Local {
	t.Helper()
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
