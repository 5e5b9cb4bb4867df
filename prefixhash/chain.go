package prefixhash

import "fmt"

// AppendKeys appends to dst the keys of the full blocks of tokens, chained
// from parent (a namespace root, or the key of the block before tokens[0]).
// A tail shorter than blockTokens is not keyed: partial blocks are never
// cached. It allocates nothing but dst's growth: one pooled SHA-256 state
// serves every block.
func AppendKeys(dst []Key, parent Key, blockTokens int, tokens []uint32) []Key {
	if blockTokens < 1 {
		panic(fmt.Sprintf("prefixhash: AppendKeys with blockTokens %d", blockTokens))
	}
	s := getHasher()
	if blockTokens <= blockBufTokens && prePadOK {
		dst = s.appendPrePadded(dst, parent, blockTokens, tokens)
	} else {
		for len(tokens) >= blockTokens {
			parent = s.key(parent, tokens[:blockTokens])
			dst = append(dst, parent)
			tokens = tokens[blockTokens:]
		}
	}
	putHasher(s)
	return dst
}

// Keys returns the block keys of a prompt under ns, with no extra keys (see
// KeysExtra). ns must be valid.
func Keys(ns Namespace, tokens []uint32) []Key {
	dst := make([]Key, 0, len(tokens)/max(ns.BlockTokens, 1))
	if ns.Scheme != SchemeKVMesh {
		dst, _ = appendLinks(dst, ns, ns.RootLink(), 0, tokens)
		return dst
	}
	return AppendKeys(dst, ns.Root(), ns.BlockTokens, tokens)
}

// appendLinks appends the keys of the full blocks of tokens with no extra
// keys but the namespace's, chained from parent, the link of block first-1
// (the root for first 0), and returns the last link.
func appendLinks(dst []Key, ns Namespace, parent Link, first int, tokens []uint32) ([]Key, Link) {
	b := ns.BlockTokens
	for i := 0; (i+1)*b <= len(tokens); i++ {
		parent = BlockLink(ns.Scheme, parent, tokens[i*b:(i+1)*b], ns.BlockExtra(first+i == 0, nil))
		dst = append(dst, parent.Key())
	}
	return dst, parent
}

// Chain is the key chain of one growing token sequence, such as a
// conversation: Extend hashes only the tokens it has not seen, so a turn costs
// the new tokens, not the whole prefix again. A Chain is not safe for
// concurrent use.
type Chain struct {
	ns          Namespace
	root        Key
	last        Link // the link of the last full block (the root's before any), for SchemeVLLM
	blockTokens int
	keys        []Key
	tail        []uint32 // tokens after the last full block
	tokens      int
}

// NewChain returns an empty chain for ns. ns must be valid (see
// Namespace.Validate); an invalid namespace is a caller bug and panics.
func NewChain(ns Namespace) *Chain {
	if err := ns.Validate(); err != nil {
		panic(fmt.Sprintf("prefixhash: NewChain: %v", err))
	}
	return &Chain{ns: ns, root: ns.Root(), last: ns.RootLink(), blockTokens: ns.BlockTokens}
}

// Extend appends tokens to the sequence and returns how many blocks it
// completed.
func (c *Chain) Extend(tokens []uint32) int {
	before := len(c.keys)
	c.tokens += len(tokens)
	if len(c.tail) > 0 {
		need := c.blockTokens - len(c.tail)
		if len(tokens) < need {
			c.tail = append(c.tail, tokens...)
			return 0
		}
		c.tail = append(c.tail, tokens[:need]...)
		tokens = tokens[need:]
		if c.ns.Scheme != SchemeKVMesh {
			c.keys, c.last = appendLinks(c.keys, c.ns, c.last, len(c.keys), c.tail)
		} else {
			c.keys = append(c.keys, BlockKey(c.Parent(len(c.keys)), c.tail))
		}
		c.tail = c.tail[:0]
	}
	full := len(tokens) - len(tokens)%c.blockTokens
	if c.ns.Scheme != SchemeKVMesh {
		c.keys, c.last = appendLinks(c.keys, c.ns, c.last, len(c.keys), tokens[:full])
	} else {
		c.keys = AppendKeys(c.keys, c.Parent(len(c.keys)), c.blockTokens, tokens[:full])
	}
	c.tail = append(c.tail, tokens[full:]...)
	return len(c.keys) - before
}

// Keys returns the keys of the full blocks so far, in order. The slice is
// owned by the chain: read it, do not modify it; it stays valid until the
// next Extend.
func (c *Chain) Keys() []Key { return c.keys }

// Len returns the number of full blocks.
func (c *Chain) Len() int { return len(c.keys) }

// Tokens returns the number of tokens seen, including the partial tail.
func (c *Chain) Tokens() int { return c.tokens }

// BlockTokens returns B, the tokens per block.
func (c *Chain) BlockTokens() int { return c.blockTokens }

// Root returns k_0, the namespace root the chain starts from.
func (c *Chain) Root() Key { return c.root }

// Parent returns the key block i is chained from: the root for block 0,
// otherwise the key of block i-1. i may equal Len (the next block's parent).
// Under SchemeVLLM a key is half of the link a child is chained from; see
// Last.
func (c *Chain) Parent(i int) Key {
	if i == 0 {
		return c.root
	}
	return c.keys[i-1]
}

// Last returns the link the next block is chained from (under SchemeVLLM,
// the whole 32-byte hash of the last full block; KeyLink of its key under
// SchemeKVMesh).
func (c *Chain) Last() Link {
	if c.ns.Scheme == SchemeKVMesh {
		return KeyLink(c.Parent(len(c.keys)))
	}
	return c.last
}

// DefaultChunkTokens is the default size of a placement chunk in tokens.
const DefaultChunkTokens = 512

// ChunkBlocks returns C, the number of blocks per placement chunk, for blocks
// of blockTokens tokens and chunks of about chunkTokens tokens (at least one
// block; 0 chunkTokens means DefaultChunkTokens).
func ChunkBlocks(blockTokens, chunkTokens int) int {
	if chunkTokens <= 0 {
		chunkTokens = DefaultChunkTokens
	}
	return max(1, chunkTokens/max(blockTokens, 1))
}

// ChunkStart returns the index of the first block of the chunk holding block i.
func ChunkStart(i, chunkBlocks int) int { return i - i%chunkBlocks }

// ChunkKey returns the placement key of block i: the key of the first block
// of its chunk. Every block of a chunk is placed by it, so a chunk lives on
// one owner and a shared prefix always lands on the same owners.
func ChunkKey(keys []Key, i, chunkBlocks int) Key { return keys[ChunkStart(i, chunkBlocks)] }

// Chunk is a run of consecutive blocks placed together.
type Chunk struct {
	Key        Key // placement key: the key of block Start
	Start, End int // block indexes [Start, End)
}

// Chunks cuts keys into placement chunks of chunkBlocks blocks (the last may
// be shorter).
func Chunks(keys []Key, chunkBlocks int) []Chunk {
	if chunkBlocks < 1 {
		panic(fmt.Sprintf("prefixhash: Chunks with chunkBlocks %d", chunkBlocks))
	}
	out := make([]Chunk, 0, (len(keys)+chunkBlocks-1)/chunkBlocks)
	for s := 0; s < len(keys); s += chunkBlocks {
		out = append(out, Chunk{Key: keys[s], Start: s, End: min(s+chunkBlocks, len(keys))})
	}
	return out
}
