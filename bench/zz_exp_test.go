package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

type xent struct {
	key        prefixhash.Key
	prev, next int32
	copy       bool
	parent     int32 // same-node parent entry, for store order, 0 none
}

type xcache struct {
	cap     int
	idx     map[prefixhash.Key]int32
	e       []xent
	free    []int32
	copies  bool // evict copies first
	cnt     int
}

func newX(c int, copies bool) *xcache {
	return &xcache{cap: c, idx: map[prefixhash.Key]int32{}, e: make([]xent, 1), copies: copies}
}
func (x *xcache) unlink(i int32) {
	e := &x.e[i]
	x.e[e.prev].next = e.next
	x.e[e.next].prev = e.prev
}
func (x *xcache) after(at, i int32) {
	e := &x.e[i]
	e.prev, e.next = at, x.e[at].next
	x.e[x.e[at].next].prev = i
	x.e[at].next = i
}
func (x *xcache) touch(k prefixhash.Key) {
	if i, ok := x.idx[k]; ok {
		x.unlink(i)
		x.after(0, i)
	}
}
func (x *xcache) victim() int32 {
	t := x.e[0].prev
	if x.copies {
		for j, w := t, 0; j != 0 && w < 4096; j, w = x.e[j].prev, w+1 {
			if x.e[j].copy {
				return j
			}
		}
	}
	return t
}
// insert k; behind: entry to insert after (0 = front)
func (x *xcache) insert(k prefixhash.Key, copy bool, parent prefixhash.Key, behind bool) {
	if i, ok := x.idx[k]; ok {
		if !copy {
			x.e[i].copy = false
		}
		x.unlink(i)
		at := int32(0)
		if behind {
			if p, ok := x.idx[parent]; ok && p != i {
				at = p
			}
		}
		x.after(at, i)
		return
	}
	for len(x.idx) >= x.cap {
		v := x.victim()
		x.unlink(v)
		delete(x.idx, x.e[v].key)
		x.free = append(x.free, v)
	}
	var i int32
	if n := len(x.free); n > 0 {
		i = x.free[n-1]
		x.free = x.free[:n-1]
	} else {
		x.e = append(x.e, xent{})
		i = int32(len(x.e) - 1)
	}
	x.e[i] = xent{key: k, copy: copy}
	x.idx[k] = i
	at := int32(0)
	if behind {
		if p, ok := x.idx[parent]; ok {
			at = p
		}
	}
	x.after(at, i)
}

type xsim struct {
	c      []*xcache
	order  string // sim | tail | store
	copies bool   // producer keeps copies
	cb     int
}

func (s *xsim) owner(chain []prefixhash.Key, i int) int {
	k := prefixhash.ChunkKey(chain, i, s.cb)
	return rendezvous(k.Hi()^k.Lo(), len(s.c))
}

type xnode struct {
	s  *xsim
	id int
}

func (n *xnode) LongestPrefix(_ context.Context, p Prompt) (int, error) {
	s, keys := n.s, p.Keys
	hit := 0
	for hit < len(keys) {
		o := s.owner(keys, hit)
		if _, ok := s.c[o].idx[keys[hit]]; ok {
			hit++
			continue
		}
		if s.copies {
			if _, ok := s.c[n.id].idx[keys[hit]]; ok {
				hit++
				continue
			}
		}
		break
	}
	for i := hit - 1; i >= 0; i-- {
		s.c[s.owner(keys, i)].touch(keys[i])
		if s.copies {
			s.c[n.id].touch(keys[i])
		}
	}
	return hit, nil
}

func (n *xnode) Put(_ context.Context, p Prompt, blocks []Block) error {
	s, chain := n.s, p.Keys
	put := func(c *xcache, b Block, copy bool, behind bool) {
		var parent prefixhash.Key
		if b.Index > 0 {
			parent = chain[b.Index-1]
		}
		c.insert(b.Key, copy, parent, behind)
	}
	switch s.order {
	case "sim", "tail":
		for k := len(blocks) - 1; k >= 0; k-- {
			o := s.owner(chain, blocks[k].Index)
			put(s.c[o], blocks[k], false, false)
			if s.copies && o != n.id {
				put(s.c[n.id], blocks[k], true, false)
			}
		}
		if s.order == "tail" && len(blocks) > 0 {
			for i := blocks[0].Index - 1; i >= 0; i-- {
				s.c[s.owner(chain, i)].touch(chain[i])
			}
		}
	case "store":
		// producer puts locally in order, then pushes to owners in order
		for k := range blocks {
			o := s.owner(chain, blocks[k].Index)
			if s.copies || o == n.id {
				put(s.c[n.id], blocks[k], o != n.id, true)
			}
		}
		for k := range blocks {
			o := s.owner(chain, blocks[k].Index)
			if o != n.id {
				put(s.c[o], blocks[k], false, true)
			}
		}
	}
	return nil
}

func TestZZExp(t *testing.T) {
	path := os.Getenv("XTRACE")
	if path == "" {
		t.Skip()
	}
	tr, err := LoadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(context.Background(), tr, TraceNamespace(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := w.Ideal()
	for _, f := range []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.3} {
		c := max(1, int(math.Round(f*float64(id.DistinctFullBlocks)/4)))
		line := fmt.Sprintf("%4.2f %6d", f, c)
		for _, v := range []struct {
			order          string
			copies, cfirst bool
		}{{"sim", false, false}, {"tail", false, false}, {"store", false, false}, {"store", true, false}, {"store", true, true}, {"tail", true, false}, {"tail", true, true}} {
			s := &xsim{order: v.order, copies: v.copies, cb: 1}
			var nodes []Node
			for i := range 4 {
				s.c = append(s.c, newX(c, v.cfirst))
				nodes = append(nodes, &xnode{s, i})
			}
			st, err := Replay(context.Background(), w, nodes, "x", ReplayOptions{})
			if err != nil {
				t.Fatal(err)
			}
			line += fmt.Sprintf("  %s/%v/%v %.3f", v.order, v.copies, v.cfirst, st.RatioVsIdeal)
		}
		fmt.Println(line)
	}
}
