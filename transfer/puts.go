package transfer

import (
	"context"
	"fmt"
	"net"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// puts is what put and publish requests carry: value i is heads[i] (when
// heads is not nil) followed by vals[i]. chunkKeys is nil for a put.
type puts struct {
	keys, chunkKeys []prefixhash.Key
	heads, vals     [][]byte
}

// valueLen returns the length of value i.
func (p *puts) valueLen(i int) int {
	if p.heads != nil {
		return len(p.heads[i]) + len(p.vals[i])
	}
	return len(p.vals[i])
}

// sub returns items [lo, hi).
func (p *puts) sub(lo, hi int) puts {
	q := puts{keys: p.keys[lo:hi], vals: p.vals[lo:hi]}
	if p.chunkKeys != nil {
		q.chunkKeys = p.chunkKeys[lo:hi]
	}
	if p.heads != nil {
		q.heads = p.heads[lo:hi]
	}
	return q
}

// pick returns the items idx.
func (p *puts) pick(idx []int) puts {
	q := puts{keys: make([]prefixhash.Key, len(idx)), vals: make([][]byte, len(idx))}
	if p.chunkKeys != nil {
		q.chunkKeys = make([]prefixhash.Key, len(idx))
	}
	if p.heads != nil {
		q.heads = make([][]byte, len(idx))
	}
	for j, i := range idx {
		q.keys[j], q.vals[j] = p.keys[i], p.vals[i]
		if q.chunkKeys != nil {
			q.chunkKeys[j] = p.chunkKeys[i]
		}
		if q.heads != nil {
			q.heads[j] = p.heads[i]
		}
	}
	return q
}

// checkPublish checks what a publish request needs beyond a put's.
func (p *puts) checkPublish() error {
	if len(p.chunkKeys) != len(p.keys) || p.heads != nil && len(p.heads) != len(p.keys) {
		return fmt.Errorf("transfer: publish of %d keys, %d chunk keys and %d heads", len(p.keys), len(p.chunkKeys), len(p.heads))
	}
	return nil
}

// putFrames checks a put and cuts it into frames within lim; send sends
// items [lo, hi) (bytes of padded values) and fills their statuses st.
func putFrames(p *puts, lim *Limits, send func(lo, hi, bytes int, st []Status) error) ([]Status, error) {
	if err := checkPut(p, lim); err != nil {
		return nil, err
	}
	st := make([]Status, len(p.keys))
	for lo := 0; lo < len(p.keys); {
		hi, bytes := putChunk(p, lo, lim)
		if err := send(lo, hi, bytes, st[lo:hi]); err != nil {
			return nil, err
		}
		lo = hi
	}
	return st, nil
}

func checkPut(p *puts, lim *Limits) error {
	if len(p.keys) != len(p.vals) {
		return fmt.Errorf("transfer: put of %d keys and %d values", len(p.keys), len(p.vals))
	}
	for i := range p.vals {
		if n := p.valueLen(i); n > lim.MaxValueSize {
			return fmt.Errorf("%w: value %d (key %s) is %d bytes, MaxValueSize is %d", ErrLimit, i, p.keys[i], n, lim.MaxValueSize)
		}
	}
	return nil
}

// putChunk returns the end of the put frame that starts at item lo and its
// payload length.
func putChunk(p *puts, lo int, lim *Limits) (hi, bytes int) {
	hi = lo
	for hi < len(p.vals) && hi-lo < lim.MaxItems {
		n := alignUp(p.valueLen(hi))
		if hi > lo && bytes+n > lim.MaxBatchBytes {
			break
		}
		bytes += n
		hi++
	}
	return hi, bytes
}

// appendPut appends to bufs a put frame, or a publish frame when
// p.chunkKeys is not nil: its header and table (built in enc) followed by
// the values, each padded to 64 bytes.
func appendPut(ctx context.Context, enc *encoder, bufs net.Buffers, id uint64, p *puts, bytes int) net.Buffers {
	typ := typePutReq
	if p.chunkKeys != nil {
		typ = typePublishReq
	}
	t := enc.begin(typ, len(p.keys))
	for i, k := range p.keys {
		if p.chunkKeys != nil {
			putPublishEntry(t, i, k, p.chunkKeys[i], p.valueLen(i))
		} else {
			putPutEntry(t, i, k, p.valueLen(i))
		}
	}
	bufs = append(bufs, enc.finish(scoped(ctx, header{typ: typ, id: id, count: len(p.keys), timeout: timeoutMillis(ctx), payload: bytes})))
	if p.heads == nil {
		return appendValues(bufs, p.vals)
	}
	for i, v := range p.vals {
		n := p.valueLen(i)
		for _, part := range [2][]byte{p.heads[i], v} {
			if len(part) > 0 {
				bufs = append(bufs, part)
			}
		}
		if pad := alignUp(n) - n; pad > 0 {
			bufs = append(bufs, zeros[:pad])
		}
	}
	return bufs
}

// appendValues appends the non-empty values, each followed by its padding.
func appendValues(bufs net.Buffers, vals [][]byte) net.Buffers {
	for _, v := range vals {
		if len(v) == 0 {
			continue
		}
		bufs = append(bufs, v)
		if pad := alignUp(len(v)) - len(v); pad > 0 {
			bufs = append(bufs, zeros[:pad])
		}
	}
	return bufs
}
