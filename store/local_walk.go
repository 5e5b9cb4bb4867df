package store

import "github.com/kvmesh/kvmesh/prefixhash"

// Placed is a block with the key of its placement chunk.
type Placed struct {
	Key, ChunkKey prefixhash.Key
	Size          int // encoded bytes
}

// InMemory returns the blocks held in the memory tier, each with its
// placement-chunk key, for handing them to other owners (a graceful leave).
// chunkBlocks gives C for blocks of the given token count.
//
// A block does not record its position in its prompt, so the chunk is found
// from the prefix tree: a block with no cached parent is taken to start a
// chunk, and its descendants at depth d belong to the chunk started at depth
// d - d%C. That holds wherever blocks arrive chunk by chunk, as they do at
// owners and at producers; a block whose parent was evicted before it
// arrived may be assigned a wrong chunk, which costs one useless push.
// The walk holds the index lock: O(cached blocks). The records of a
// namespace with groups are placed by their block's chain key: the windows
// and states hanging from the anchor's record are at its depth.
func (l *Local) InMemory(chunkBlocks func(tokens int) int) []Placed {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return nil
	}
	x := &l.mu.x
	type item struct {
		i     uint32
		depth int
		chunk prefixhash.Key
	}
	var out []Placed
	var stack []item
	for i := uint32(1); i < x.next; i++ {
		e := x.at(i)
		if e.up != 0 || e.key.IsZero() || e.has(flagSentinel) || e.has(flagDropped) {
			continue // not a root, free, a list head, or gone
		}
		stack = append(stack[:0], item{i: i, chunk: l.chainKeyLocked(i)})
		for len(stack) > 0 {
			it := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			e := x.at(it.i)
			ns := l.mu.ns.get(e.ns)
			if ns.object {
				// An object's piece is its own chunk: placed by its key.
				if !e.persistent() {
					out = append(out, Placed{Key: e.key, ChunkKey: e.key, Size: ns.size})
				}
				continue
			}
			if ns.tokens == 0 {
				continue // unresolved after a restart: no tree below it either
			}
			c := max(chunkBlocks(ns.tokens), 1)
			chunk := it.chunk
			if it.depth%c == 0 {
				chunk = l.chainKeyLocked(it.i)
			}
			if !e.persistent() && !e.has(flagDropped) {
				out = append(out, Placed{Key: e.key, ChunkKey: chunk, Size: ns.size})
			}
			for ch := e.child; ch != 0; ch = x.at(ch).sib {
				d := it.depth + 1
				if x.at(ch).ns != e.ns {
					d = it.depth // another group's record of the same block
				}
				stack = append(stack, item{i: ch, depth: d, chunk: chunk})
			}
		}
	}
	return out
}

// chainKeyLocked returns the chain key of entry i's block: its key, or for
// a group's record the key GroupKey maps back.
func (l *Local) chainKeyLocked(i uint32) prefixhash.Key {
	e := l.mu.x.at(i)
	if g := l.mu.ns.get(e.ns).group; g > 0 {
		return prefixhash.GroupKey(e.key, int(g)-1)
	}
	return e.key
}
