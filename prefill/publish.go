package prefill

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// publishJob is one prefill's new blocks, waiting for the publisher: blocks
// from..len(keys)-1 of the prompt, whose K/V are in kv. The job owns kv and
// returns it to the pool, or, when release is set, shares it and calls
// release instead once it no longer reads it. A job with flushed set is a
// Flush marker.
type publishJob struct {
	sc      scope // whose blocks these are
	kv      *KV
	release func()
	tokens  []uint32         // the tokens of blocks from..len(keys)-1 (a copy owned by the job)
	keys    []prefixhash.Key // the prompt's whole chain
	from    int
	flushed chan struct{}
}

func (j publishJob) blocks() int { return len(j.keys) - j.from }

// publish queues blocks [from, len(keys)) of a prefill for the publisher and
// takes ownership of kv. It never waits: with the queue full or the engine
// closing, the blocks are dropped and counted.
func (e *Engine) publish(sc scope, kv *KV, tokens []uint32, keys []prefixhash.Key, from int) {
	e.publishShared(sc, kv, nil, tokens, keys, from)
}

// publishShared is publish of a KV that someone else goes on using: the
// publisher only reads the K/V of blocks [from, len(keys)) and calls release
// (instead of pooling kv) when it is done with them. A nil release is
// publish's ownership.
func (e *Engine) publishShared(sc scope, kv *KV, release func(), tokens []uint32, keys []prefixhash.Key, from int) {
	if e.cache == nil || from >= len(keys) {
		e.free(kv, release)
		return
	}
	b := e.cfg.BlockTokens
	job := publishJob{sc: sc, kv: kv, release: release, tokens: append([]uint32(nil), tokens[from*b:len(keys)*b]...), keys: keys, from: from}
	e.mu.RLock()
	queued := false
	if !e.mu.closed {
		select {
		case e.mu.queue <- job:
			queued = true
		default:
		}
	}
	e.mu.RUnlock()
	if !queued {
		e.drop(job)
	}
}

func (e *Engine) drop(job publishJob) {
	e.stats.dropped.Add(int64(job.blocks()))
	e.free(job.kv, job.release)
}

// free hands kv back: to the pool, or to its sharer's release.
func (e *Engine) free(kv *KV, release func()) {
	if release != nil {
		release()
		return
	}
	e.kvPool.Put(kv)
}

// Flush waits until every block queued for publication before the call has
// been handed to Cache.Put (or dropped), the draft model's too. Tests and
// benchmarks use it to wait for publication without sleeping.
func (e *Engine) Flush(ctx context.Context) error {
	if e.draft != nil {
		if err := e.draft.Flush(ctx); err != nil {
			return err
		}
	}
	return e.flush(ctx)
}

func (e *Engine) flush(ctx context.Context) error {
	done := make(chan struct{})
	e.mu.RLock()
	if e.mu.closed {
		e.mu.RUnlock()
		return ErrClosed
	}
	select {
	case e.mu.queue <- publishJob{flushed: done}:
	case <-ctx.Done():
		e.mu.RUnlock()
		return fmt.Errorf("prefill: flush: %w", ctx.Err())
	}
	e.mu.RUnlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("prefill: flush: %w", ctx.Err())
	}
}

// publishLoop is the publisher: it encodes each job's blocks and hands them
// to Cache.Put, one job at a time, until Close closes the queue. Its buffers
// are reused from job to job (Put copies what it keeps).
func (e *Engine) publishLoop(queue <-chan publishJob) {
	defer e.pubWG.Done()
	var (
		buf     []byte
		blocks  [][]byte
		payload = make([]byte, e.ns.BlockBytes())
	)
	for job := range queue {
		if job.flushed != nil {
			close(job.flushed)
			continue
		}
		if e.ctx.Err() != nil {
			e.drop(job)
			continue
		}
		buf, blocks = e.encode(job.sc, buf, blocks, payload, job.kv, job.keys, job.tokens, job.from, len(job.keys))
		e.free(job.kv, job.release)
		e.put(job.keys, job.from, blocks)
	}
}

// encode appends to buf the encoded blocks [from, to) of chain, whose K/V
// are in kv and whose tokens start tokens (tokens[0] is block from's first),
// and returns buf and the blocks, which alias buf. payload is scratch of one
// block's payload length.
func (e *Engine) encode(sc scope, buf []byte, blocks [][]byte, payload []byte, kv *KV, chain []prefixhash.Key, tokens []uint32, from, to int) ([]byte, [][]byte) {
	b := e.cfg.BlockTokens
	encLen := block.EncodedLen(b, len(payload))
	if need := (to - from) * encLen; cap(buf) < need {
		buf = make([]byte, 0, need)
	}
	buf, blocks = buf[:0], blocks[:0]
	root := sc.root
	for i := from; i < to; i++ {
		parent := root
		if i > 0 {
			parent = chain[i-1]
		}
		kv.writeBlock(payload, i*b, b)
		var key prefixhash.Key
		var err error
		j := i - from
		buf, key, err = block.EncodeTenant(buf, sc.tag, sc.ns, parent, tokens[j*b:(j+1)*b], payload)
		if err != nil || key != chain[i] {
			panic(fmt.Sprintf("prefill: encoding block %d: key %s, want %s: %v", i, key, chain[i], err))
		}
		blocks = append(blocks, buf[len(buf)-encLen:])
	}
	return buf, blocks
}

// put hands blocks, the blocks of chain from from on, to Cache.Put under
// PublishTimeout and counts the outcome.
func (e *Engine) put(chain []prefixhash.Key, from int, blocks [][]byte) {
	ctx, cancel := context.WithTimeout(e.ctx, e.opts.PublishTimeout)
	err := e.cache.Put(ctx, chain, from, blocks)
	cancel()
	if err != nil {
		e.stats.publishErrors.Add(1)
		e.stats.dropped.Add(int64(len(blocks)))
		e.opts.Logger.Debug("prefill: publishing blocks failed", "blocks", len(blocks), "err", err)
		return
	}
	e.stats.published.Add(int64(len(blocks)))
}
