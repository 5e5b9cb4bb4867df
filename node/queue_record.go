package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// queueRecord is one queued prefill request as the queue stores it: the
// request, its progress, and its outcome once it finished.
type queueRecord struct {
	ID    string
	Seq   uint64 // the order of enqueueing; requests run in this order
	State kvmeshv1.PrefillState
	// When it was enqueued, (last) started and finished; zero when not yet.
	Enqueued, Started, Finished time.Time
	Runs                        uint32 // times it was started; more than one after a restart
	Session                     string
	WantLogits                  bool
	// Owner is the tenant whose request it is (zero: none); the request
	// runs, and its result is readable, as that tenant's.
	Owner queueOwner
	// Tokens is the prompt while the request is queued or running; it is
	// dropped when the request finishes.
	Tokens []uint32

	// The outcome, once DONE (or Err, once FAILED).
	PromptTokens, CachedTokens uint32
	TTFT                       time.Duration
	TopTokens                  []uint32
	Logits                     []float32 // only when WantLogits
	Err                        string
}

// queueOwner is the tenant a queued request belongs to.
type queueOwner struct {
	Tenant string // name; empty: none
	Salt   string // its namespace salt (auth.Principal.Salt)
	Tag    uint64 // its blocks' tag
}

// The encoding: a version byte, the state, then the fields in the order of
// encodeQueueRecord as uvarints (times as varints of Unix nanoseconds, 0 for
// none), strings and lists prefixed by their length, logits as
// little-endian float32. Version 2 appended the owner; version 1 records
// (no owner) are still read.
const (
	queueRecordV1 = 1
	queueRecordV2 = 2
)

var errQueueRecord = errors.New("node: corrupt queue record")

func encodeQueueRecord(dst []byte, r *queueRecord) []byte {
	putTime := func(t time.Time) {
		var ns int64
		if !t.IsZero() {
			ns = t.UnixNano()
		}
		dst = binary.AppendVarint(dst, ns)
	}
	putString := func(s string) {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	putUints := func(v []uint32) {
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		for _, x := range v {
			dst = binary.AppendUvarint(dst, uint64(x))
		}
	}
	dst = append(dst, queueRecordV2, byte(r.State))
	dst = binary.AppendUvarint(dst, r.Seq)
	putTime(r.Enqueued)
	putTime(r.Started)
	putTime(r.Finished)
	dst = binary.AppendUvarint(dst, uint64(r.Runs))
	putString(r.ID)
	putString(r.Session)
	var flags byte
	if r.WantLogits {
		flags |= 1
	}
	dst = append(dst, flags)
	putUints(r.Tokens)
	dst = binary.AppendUvarint(dst, uint64(r.PromptTokens))
	dst = binary.AppendUvarint(dst, uint64(r.CachedTokens))
	dst = binary.AppendUvarint(dst, uint64(max(r.TTFT, 0)))
	putUints(r.TopTokens)
	dst = binary.AppendUvarint(dst, uint64(len(r.Logits)))
	for _, f := range r.Logits {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
	}
	putString(r.Err)
	putString(r.Owner.Tenant)
	putString(r.Owner.Salt)
	dst = binary.AppendUvarint(dst, r.Owner.Tag)
	return dst
}

// decodeQueueRecord parses a record; it never panics and never allocates
// more than the input's size justifies. The record does not alias b.
func decodeQueueRecord(b []byte) (*queueRecord, error) {
	d := recordDecoder{b: b}
	v := d.byte()
	if v != queueRecordV1 && v != queueRecordV2 {
		return nil, fmt.Errorf("%w: version %d, want %d or %d", errQueueRecord, v, queueRecordV1, queueRecordV2)
	}
	r := &queueRecord{State: kvmeshv1.PrefillState(d.byte())}
	r.Seq = d.uvarint()
	r.Enqueued, r.Started, r.Finished = d.time(), d.time(), d.time()
	r.Runs = d.uint32()
	r.ID = d.string()
	r.Session = d.string()
	r.WantLogits = d.byte()&1 != 0
	r.Tokens = d.uints()
	r.PromptTokens, r.CachedTokens = d.uint32(), d.uint32()
	ttft := d.uvarint()
	if ttft > math.MaxInt64 {
		d.fail("ttft")
	}
	r.TTFT = time.Duration(ttft)
	r.TopTokens = d.uints()
	if n := d.count(4); n > 0 {
		r.Logits = make([]float32, n)
		for i := range r.Logits {
			r.Logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.take(4)))
		}
	}
	r.Err = d.string()
	if v >= queueRecordV2 {
		r.Owner.Tenant, r.Owner.Salt, r.Owner.Tag = d.string(), d.string(), d.uvarint()
	}
	switch {
	case d.err != nil:
		return nil, d.err
	case len(d.b) != 0:
		return nil, fmt.Errorf("%w: %d trailing bytes", errQueueRecord, len(d.b))
	case r.State < kvmeshv1.PrefillState_PREFILL_STATE_QUEUED || r.State > kvmeshv1.PrefillState_PREFILL_STATE_FAILED:
		return nil, fmt.Errorf("%w: state %d", errQueueRecord, r.State)
	}
	return r, nil
}

// recordDecoder reads fields off b; after the first failure every read
// returns zero values and err says what failed.
type recordDecoder struct {
	b   []byte
	err error
}

func (d *recordDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s", errQueueRecord, what)
	}
	d.b = nil
}

func (d *recordDecoder) take(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		d.fail("length")
		return make([]byte, max(n, 0)) // zeros; the record is refused anyway
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *recordDecoder) byte() byte { return d.take(1)[0] }

func (d *recordDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *recordDecoder) uint32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail("uint32")
		return 0
	}
	return uint32(v)
}

func (d *recordDecoder) time() time.Time {
	if d.err != nil {
		return time.Time{}
	}
	ns, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("time")
		return time.Time{}
	}
	d.b = d.b[n:]
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// count reads a length of items of at least minSize bytes each, refusing
// one the remaining bytes cannot hold.
func (d *recordDecoder) count(minSize int) int {
	n := d.uvarint()
	if n > uint64(len(d.b)/minSize) {
		d.fail("count")
		return 0
	}
	return int(n)
}

func (d *recordDecoder) string() string { return string(d.take(d.count(1))) }

func (d *recordDecoder) uints() []uint32 {
	n := d.count(1)
	if n == 0 {
		return nil
	}
	v := make([]uint32, n)
	for i := range v {
		v[i] = d.uint32()
	}
	return v
}
