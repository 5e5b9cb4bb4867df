package store

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/kvmesh/kvmesh/prefixhash"
)

func TestEntrySize(t *testing.T) {
	if s := unsafe.Sizeof(entry{}); s != 52 {
		t.Fatalf("entry is %d bytes; the index budget is 64 bytes per block with the table, keep it at 52", s)
	}
}

func randKey(rng *rand.Rand) prefixhash.Key {
	var k prefixhash.Key
	binary.LittleEndian.PutUint64(k[:8], rng.Uint64())
	binary.LittleEndian.PutUint64(k[8:], rng.Uint64())
	return k
}

// TestIndexTable checks the table against a map through inserts, lookups and
// backward-shift deletions, with keys crowded into few home slots so that
// probe runs wrap and interleave.
func TestIndexTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var x index
	ref := map[prefixhash.Key]uint32{}
	var keys []prefixhash.Key
	for step := range 100000 {
		switch {
		case rng.IntN(3) > 0 || len(keys) == 0:
			k := randKey(rng)
			if step%16 == 0 {
				// Crowd some keys into few home slots near the table's
				// end, with random tags, so that runs wrap around.
				binary.LittleEndian.PutUint64(k[:8], uint64(len(x.table))-uint64(rng.IntN(64)))
			}
			i := x.alloc(k)
			x.insert(i)
			ref[k] = i
			keys = append(keys, k)
		default:
			j := rng.IntN(len(keys))
			k := keys[j]
			keys[j] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			i := ref[k]
			if !x.remove(k) {
				t.Fatalf("step %d: remove of a present key failed", step)
			}
			x.release(i)
			delete(ref, k)
			if x.find(k) != 0 {
				t.Fatalf("step %d: removed key still found", step)
			}
		}
		if step%5000 == 0 {
			for k, i := range ref {
				if got := x.find(k); got != i {
					t.Fatalf("step %d: find = %d, want %d", step, got, i)
				}
			}
			if x.find(randKey(rng)) != 0 {
				t.Fatal("absent key found")
			}
		}
	}
	if x.keys != len(ref) || x.used != len(ref) {
		t.Fatalf("table holds %d keys and %d entries, want %d", x.keys, x.used, len(ref))
	}
}

// TestIndexTreeAndLists checks sibling lists (with the parent stored only in
// the first child) and recency lists against a simple model.
func TestIndexTreeAndLists(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var x index
	list := x.newList()
	parentOf := map[uint32]uint32{}
	var nodes []uint32
	for range 300 {
		i := x.alloc(randKey(rng))
		x.insert(i) // a block in the table: only those are linked
		x.insertAfter(list, i)
		if len(nodes) > 0 && rng.IntN(4) > 0 {
			p := nodes[rng.IntN(min(len(nodes), 5))] // few parents, many siblings
			x.link(i, p)
			parentOf[i] = p
		}
		nodes = append(nodes, i)
	}
	for range 2000 {
		i := nodes[rng.IntN(len(nodes))]
		switch rng.IntN(3) {
		case 0:
			x.unlink(i)
			delete(parentOf, i)
		case 1:
			if _, ok := parentOf[i]; !ok {
				p := nodes[rng.IntN(len(nodes))]
				if p != i {
					x.link(i, p)
					parentOf[i] = p
				}
			}
		case 2:
			x.moveFront(list, i)
		}
	}
	for _, i := range nodes {
		if got := x.parent(i); got != parentOf[i] {
			t.Fatalf("parent(%d) = %d, want %d", i, got, parentOf[i])
		}
		n := 0
		for c := x.at(i).child; c != 0; c = x.at(c).sib {
			if parentOf[c] != i {
				t.Fatalf("%d listed under %d, its parent is %d", c, i, parentOf[c])
			}
			n++
		}
		want := 0
		for _, p := range parentOf {
			if p == i {
				want++
			}
		}
		if n != want {
			t.Fatalf("%d has %d children listed, want %d", i, n, want)
		}
	}
	seen := 0
	for j := x.at(list).next; j != list; j = x.at(j).next {
		if x.at(x.at(j).next).prev != j {
			t.Fatal("recency list prev/next disagree")
		}
		seen++
	}
	if seen != len(nodes) {
		t.Fatalf("recency list holds %d entries, want %d", seen, len(nodes))
	}
}

// BenchmarkIndexBytesPerBlock measures the index's RAM per cached block: Go
// heap growth over many blocks, each linked to a parent and in a recency
// list. "1M" is 2^20 blocks; "worst" is just past a table growth, where the
// table is emptiest (3/8 full). Target: at most 64 B/block (DESIGN.md).
func BenchmarkIndexBytesPerBlock(b *testing.B) {
	for _, bc := range []struct {
		name string
		n    int
	}{{"1M", 1 << 20}, {"worst", 3<<18 + 1}} {
		b.Run(bc.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(5, 6))
			keys := make([]prefixhash.Key, bc.n)
			for k := range keys {
				keys[k] = randKey(rng)
			}
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				x := new(index)
				list := x.newList()
				prev := uint32(0)
				for k := range keys {
					i := x.alloc(keys[k])
					x.insert(i)
					x.insertAfter(list, i)
					if prev != 0 && k%256 != 0 { // chains of 256 blocks
						x.link(i, prev)
					}
					prev = i
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(bc.n), "B/block")
				runtime.KeepAlive(x)
			}
		})
	}
}

// TestEntryHitMarks: the marks that share an entry's hit counter (a copy,
// reused, retired, retained, lapsed: five features' state in one uint16) are
// distinct bits, and neither saturating hits nor clearing one touches the
// others.
func TestEntryHitMarks(t *testing.T) {
	marks := []uint16{hitsCopy, hitsReused, hitsRetired, hitsRetained, hitsLapsed}
	all := uint16(0)
	for _, m := range marks {
		if all&m != 0 || m&maxHits != 0 {
			t.Fatalf("mark %#x overlaps %#x or the count", m, all)
		}
		all |= m
	}
	if all != hitsMarks {
		t.Fatalf("hitsMarks %#x, the marks %#x", hitsMarks, all)
	}
	var e entry
	e.hits = all
	for range int(maxHits) + 10 {
		e.setHitsSaturating()
	}
	if !e.copy() || !e.reused() || !e.retired() || !e.retained() || !e.lapsed() || e.hitCount() != int(maxHits) {
		t.Fatalf("after saturating: hits %#x", e.hits)
	}
	e.hits &^= hitsRetained
	if !e.copy() || !e.reused() || !e.retired() || e.retained() || e.hitCount() != int(maxHits) {
		t.Fatalf("after clearing retained: hits %#x", e.hits)
	}
}
