package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// DefaultVocab is the vocabulary trace tokens are drawn from (Llama 3's).
const DefaultVocab = 128256

// TraceNamespace is the namespace trace replays key their blocks under:
// 512-token blocks (the trace's), and a small float16 payload (2 KiB; with
// the header, which carries the block's tokens, a block is about 4 KiB) so
// that a replay on kvmesh nodes moves and holds little data per block: hit
// ratios do not depend on it.
func TraceNamespace() prefixhash.Namespace {
	return prefixhash.Namespace{Model: "kvmesh/bench-trace", DType: prefixhash.Float16, BlockTokens: TraceBlockTokens,
		Layers: 1, KVHeads: 1, HeadDim: 1}
}

// HashIDTokens writes the first len(dst) tokens (at most 512) of the block a
// trace names by id, drawn from [0, vocab). The same id yields the same
// tokens in every process and on every machine, so requests that share hash
// ids share token prefixes, and hence block keys; a partial last block is
// the first input_length mod 512 tokens of its id's block. The generator is
// splitmix64, written out here so that no library change can move it.
func HashIDTokens(dst []uint32, id uint64, vocab int) {
	if len(dst) > TraceBlockTokens || vocab < 1 {
		panic(fmt.Sprintf("bench: HashIDTokens with %d tokens, vocab %d", len(dst), vocab))
	}
	s := id ^ 0x6b766d6573682f74 // "kvmesh/t": ids 0, 1, ... do not start from splitmix's own seeds
	for i := range dst {
		s += 0x9e3779b97f4a7c15
		dst[i] = uint32((mix64(s) >> 32) * uint64(vocab) >> 32)
	}
}

// Workload is a trace turned into what a cache sees: every request's prompt
// tokens and the keys of its full blocks under a namespace. Keys are
// computed once, since they do not depend on routing or capacity.
// A Workload is immutable and safe for concurrent use.
type Workload struct {
	trace *Trace
	ns    prefixhash.Namespace
	vocab int
	keys  []prefixhash.Key // all requests' full-block keys, back to back
	start []int            // request i's keys are keys[start[i]:start[i+1]]
	ideal Ideal
}

// NewWorkload keys every request of t under ns, whose blocks must hold
// TraceBlockTokens tokens, with tokens drawn from [0, vocab) (0 means
// DefaultVocab). bar, if not nil, advances by one per request.
func NewWorkload(ctx context.Context, t *Trace, ns prefixhash.Namespace, vocab int, bar Bar) (*Workload, error) {
	if err := ns.Validate(); err != nil {
		return nil, fmt.Errorf("bench: workload: %w", err)
	}
	if ns.BlockTokens != TraceBlockTokens {
		return nil, fmt.Errorf("bench: workload: namespace block_tokens is %d, traces name blocks of %d tokens",
			ns.BlockTokens, TraceBlockTokens)
	}
	if vocab == 0 {
		vocab = DefaultVocab
	}
	if vocab < 1 {
		return nil, fmt.Errorf("bench: workload: vocab %d must be positive", vocab)
	}
	if bar == nil {
		bar = nopBar{}
	}
	w := &Workload{trace: t, ns: ns, vocab: vocab, start: make([]int, len(t.Requests)+1), ideal: t.Ideal()}
	for i := range t.Requests {
		w.start[i+1] = w.start[i] + t.Requests[i].FullBlocks()
	}
	w.keys = make([]prefixhash.Key, w.start[len(t.Requests)])
	// Requests are independent: key them on every core.
	workers := min(runtime.GOMAXPROCS(0), len(t.Requests))
	var wg sync.WaitGroup
	next := make(chan int, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tokens := make([]uint32, TraceBlockTokens)
			for i := range next {
				parent := ns.Root()
				r := &t.Requests[i]
				for j := range r.FullBlocks() {
					HashIDTokens(tokens, r.HashIDs[j], vocab)
					parent = prefixhash.BlockKey(parent, tokens)
					w.keys[w.start[i]+j] = parent
				}
				bar.Add(1)
			}
		}()
	}
	var err error
	for i := range t.Requests {
		if err = ctx.Err(); err != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Trace returns the trace the workload was built from.
func (w *Workload) Trace() *Trace { return w.trace }

// Ideal returns the trace's ideal hit ratios (Trace.Ideal).
func (w *Workload) Ideal() Ideal { return w.ideal }

// Namespace returns the namespace the keys are under.
func (w *Workload) Namespace() prefixhash.Namespace { return w.ns }

// Keys returns the keys of request i's full blocks. The slice is owned by
// the workload: read it, never modify it.
func (w *Workload) Keys(i int) []prefixhash.Key { return w.keys[w.start[i]:w.start[i+1]:w.start[i+1]] }

// Tokens appends request i's prompt tokens to dst and returns it.
func (w *Workload) Tokens(dst []uint32, i int) []uint32 {
	r := &w.trace.Requests[i]
	for j, id := range r.HashIDs {
		n := min(TraceBlockTokens, r.InputLength-j*TraceBlockTokens)
		dst = append(dst, make([]uint32, n)...)
		HashIDTokens(dst[len(dst)-n:], id, w.vocab)
	}
	return dst
}

// Blocks returns blocks [from, FullBlocks) of request i, to publish after a
// lookup found the first from cached. With encode, each block also carries
// its tokens, its payload (filled from the key) and its bytes from
// block.Encode (header and payload), appended to buf; the returned blocks alias buf's new
// backing array. The caller owns both. Without encode only keys are set:
// what the simulation needs, at no cost.
func (w *Workload) Blocks(i, from int, encode bool, buf []byte) ([]Block, []byte, error) {
	keys := w.Keys(i)
	r := &w.trace.Requests[i]
	blocks := make([]Block, 0, len(keys)-from)
	var payload []byte
	if encode {
		payload = make([]byte, w.ns.BlockBytes())
		buf = buf[:0]
	}
	offsets := make([]int, 0, len(keys)-from)
	for j := from; j < len(keys); j++ {
		b := Block{Index: j, Key: keys[j]}
		if j > 0 {
			b.Parent = keys[j-1]
		} else {
			b.Parent = w.ns.Root()
		}
		if encode {
			b.Tokens = make([]uint32, TraceBlockTokens)
			HashIDTokens(b.Tokens, r.HashIDs[j], w.vocab)
			fillPayload(payload, b.Key)
			offsets = append(offsets, len(buf))
			var err error
			var key prefixhash.Key
			buf, key, err = block.Encode(buf, w.ns, b.Parent, b.Tokens, payload)
			if err != nil {
				return nil, buf, fmt.Errorf("bench: encode block %d of request %d: %w", j, i, err)
			}
			if key != b.Key {
				panic(fmt.Sprintf("bench: block %d of request %d: block.Encode keyed it %s, the workload %s", j, i, key, b.Key))
			}
		}
		blocks = append(blocks, b)
	}
	if encode {
		for k := range blocks {
			end := len(buf)
			if k+1 < len(offsets) {
				end = offsets[k+1]
			}
			blocks[k].Encoded = buf[offsets[k]:end:end]
			blocks[k].Payload = blocks[k].Encoded[block.HeaderLen(TraceBlockTokens):]
		}
	}
	return blocks, buf, nil
}

// fillPayload fills p with copies of the key: cheap, deterministic, and
// different for every block.
func fillPayload(p []byte, k prefixhash.Key) {
	if len(p) == 0 {
		return
	}
	n := copy(p, k[:])
	for n < len(p) {
		n += copy(p[n:], p[:n])
	}
}
