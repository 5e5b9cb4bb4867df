package block

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// ErrBadPart marks a part range that is not one kvmesh stores or serves: out
// of the block, empty, or a head range that is not an aligned slice of the
// KV heads. Its message names the valid ranges. It is the caller's mistake
// (InvalidArgument), not corruption.
var ErrBadPart = errors.New("block: invalid part")

// A Part is the piece of a block that one parallel rank of a model instance
// holds: the layers [L0,L1) (a pipeline stage) and the KV heads [H0,H1) (a
// tensor-parallel rank) of every token of the block. The latent layout has
// no heads to split: every rank holds the whole latent, and its head range
// is always [0,1). The whole block is Layout.Whole().
//
// A state record (prefixhash.StateKV) splits as the split layout does:
// its cells are a layer's heads' states.
//
// A part's payload is, in order: for each layer of [L0,L1), the KV bytes of
// heads [H0,H1) of that layer (one contiguous run of the block payload,
// because the split layout is [layer][kv_head][K|V][token][head_dim]); then
// the scales of those layers: a layer's per-block scales, or heads
// [H0,H1) of its per-head scales. For the whole block it is exactly the
// block payload.
type Part struct{ L0, L1, H0, H1 int }

func (p Part) String() string {
	return fmt.Sprintf("layers [%d,%d) heads [%d,%d)", p.L0, p.L1, p.H0, p.H1)
}

// Cells returns the grid a block's parts cover: layers × heads (heads is 1
// with the latent layout).
func (l Layout) Cells() (layers, heads int) {
	if l.KV == prefixhash.LatentKV {
		return l.Layers, 1
	}
	return l.Layers, l.KVHeads
}

// Whole returns the part that is the whole block.
func (l Layout) Whole() Part {
	layers, heads := l.Cells()
	return Part{0, layers, 0, heads}
}

// WholePart returns the part that is the whole block of ns.
func WholePart(ns prefixhash.Namespace) Part { return LayoutOf(ns).Whole() }

// CheckPart reports whether p is a part kvmesh stores and serves: a
// non-empty layer range inside the block (pipeline stages may be uneven),
// and a head range that is an aligned slice of the KV heads (its width w
// divides the heads and it starts at a multiple of w), [0,1) with the
// latent layout. With per-block scales a split block's heads are not
// split: its scales cover every head. The error wraps ErrBadPart and names
// the valid ranges.
func (l Layout) CheckPart(p Part) error {
	layers, heads := l.Cells()
	if p.L0 < 0 || p.L1 <= p.L0 || p.L1 > layers {
		return fmt.Errorf("%w: layers [%d,%d): want a non-empty range inside [0,%d)", ErrBadPart, p.L0, p.L1, layers)
	}
	w := p.H1 - p.H0
	switch {
	case l.KV == prefixhash.LatentKV && (p.H0 != 0 || p.H1 != 1):
		return fmt.Errorf("%w: heads [%d,%d) of a latent block: the latent has no heads to split, every rank holds it whole (heads [0,1))", ErrBadPart, p.H0, p.H1)
	case p.H0 < 0 || w < 1 || p.H1 > heads || heads%w != 0 || p.H0%w != 0:
		return fmt.Errorf("%w: heads [%d,%d) of %d: a head range is one of the equal slices of the %d KV heads (%s)", ErrBadPart, p.H0, p.H1, heads, heads, headSlices(heads))
	case l.Scales == prefixhash.ScalesPerBlock && w != heads:
		return fmt.Errorf("%w: heads [%d,%d) of %d with per-block scales: a layer's scale covers every head, so its heads are not split (use per-head scales)", ErrBadPart, p.H0, p.H1, heads)
	}
	return nil
}

// headSlices names the valid head ranges of heads: every aligned slice of
// each width that divides heads.
func headSlices(heads int) string {
	var ws []string
	for w := heads; w >= 1; w-- {
		switch {
		case heads%w != 0:
		case w == heads:
			ws = append(ws, fmt.Sprintf("width %d: [0,%d)", w, w))
		case 2*w == heads:
			ws = append(ws, fmt.Sprintf("width %d: [0,%d), [%d,%d)", w, w, w, heads))
		default:
			ws = append(ws, fmt.Sprintf("width %d: [0,%d), [%d,%d), …", w, w, w, 2*w))
		}
		if len(ws) == 6 {
			ws = append(ws, "…")
			break
		}
	}
	return strings.Join(ws, "; ")
}

// cellBytes returns the KV bytes of one cell (one layer of one head; one
// layer with the latent layout; one head's state with the state layout) of a block of tokens tokens and the scale
// bytes of one layer (per block) and of one cell (per head), or -1 when the
// sizes overflow.
func (l Layout) cellBytes(tokens int) (kv, layerScales, cellScales int) {
	var shape [4]uint64
	parts := uint64(2)
	switch l.KV {
	case prefixhash.StateKV:
		return l.StateBytes, 0, 0 // a head's state, whatever the tokens
	case prefixhash.LatentKV:
		shape = [4]uint64{uint64(tokens), uint64(l.LatentDim), uint64(l.DType.Size()), 1}
		parts = 1
	default:
		shape = [4]uint64{2, uint64(tokens), uint64(l.HeadDim), uint64(l.DType.Size())}
	}
	n := uint64(1)
	for _, f := range shape {
		hi, lo := bits.Mul64(n, f)
		if hi != 0 || lo > 1<<40 {
			return -1, 0, 0
		}
		n = lo
	}
	switch l.Scales {
	case prefixhash.ScalesPerBlock:
		layerScales = 4 * int(parts)
	case prefixhash.ScalesPerHead:
		cellScales = 4 * int(parts)
	}
	return int(n), layerScales, cellScales
}

// PartLen returns the payload bytes of part p of a block of tokens tokens,
// or -1 when the layout or the part is not valid.
func (l Layout) PartLen(tokens int, p Part) int {
	if !l.valid() || tokens < 1 || l.CheckPart(p) != nil {
		return -1
	}
	kv, ls, cs := l.cellBytes(tokens)
	if kv < 0 {
		return -1
	}
	cells := uint64(p.L1-p.L0) * uint64(p.H1-p.H0)
	hi, lo := bits.Mul64(cells, uint64(kv+cs))
	if hi != 0 || lo > 1<<40 {
		return -1 // absurd layouts must not wrap into plausible sizes
	}
	return int(lo) + (p.L1-p.L0)*ls
}

// runs calls fn, in part payload order, with the offset in the whole
// payload and the length of each contiguous run of part p: one KV run per
// layer, then the scales. p must be valid (CheckPart).
func (l Layout) runs(tokens int, p Part, fn func(off, n int)) {
	_, heads := l.Cells()
	kv, ls, cs := l.cellBytes(tokens)
	layerKV := heads * kv
	for layer := p.L0; layer < p.L1; layer++ {
		fn(layer*layerKV+p.H0*kv, (p.H1-p.H0)*kv)
	}
	scales := l.Layers * layerKV
	for layer := p.L0; layer < p.L1; layer++ {
		switch {
		case ls > 0:
			fn(scales+layer*ls, ls)
		case cs > 0:
			fn(scales+(layer*heads+p.H0)*cs, (p.H1-p.H0)*cs)
		}
	}
}

// ExtractPart appends to dst part p of the whole block payload of a block
// of tokens tokens, in part payload order. p must be valid (CheckPart) and
// payload a whole block's.
func (l Layout) ExtractPart(dst, payload []byte, tokens int, p Part) []byte {
	l.runs(tokens, p, func(off, n int) { dst = append(dst, payload[off:off+n]...) })
	return dst
}

// PlacePart copies part, the payload of part p, to its place in payload,
// the whole block payload of a block of tokens tokens. p must be valid and
// len(part) its PartLen.
func (l Layout) PlacePart(payload, part []byte, tokens int, p Part) {
	l.runs(tokens, p, func(off, n int) {
		copy(payload[off:off+n], part[:n])
		part = part[n:]
	})
}

// ComparePart reports whether part, the payload of part p, equals payload
// (a whole block payload being assembled) in every cell covered says is
// already there: the overlap check of a part that arrives after others. A
// layer's per-block scales are compared when its first head of p is
// covered.
func (l Layout) ComparePart(payload, part []byte, tokens int, p Part, covered func(layer, head int) bool) bool {
	_, heads := l.Cells()
	kv, ls, cs := l.cellBytes(tokens)
	pos := 0
	for layer := p.L0; layer < p.L1; layer++ {
		for h := p.H0; h < p.H1; h++ {
			off := (layer*heads + h) * kv
			if covered(layer, h) && !bytes.Equal(payload[off:off+kv], part[pos:pos+kv]) {
				return false
			}
			pos += kv
		}
	}
	scales := l.Layers * heads * kv
	for layer := p.L0; layer < p.L1; layer++ {
		if ls > 0 {
			off := scales + layer*ls
			if covered(layer, p.H0) && !bytes.Equal(payload[off:off+ls], part[pos:pos+ls]) {
				return false
			}
			pos += ls
		}
		for h := p.H0; cs > 0 && h < p.H1; h++ {
			off := scales + (layer*heads+h)*cs
			if covered(layer, h) && !bytes.Equal(payload[off:off+cs], part[pos:pos+cs]) {
				return false
			}
			pos += cs
		}
	}
	return true
}

// Seal turns record, a part's header followed by the whole block's
// assembled payload, into the encoded whole block: its part range becomes
// the whole block, its payload length and checksum the whole payload's,
// and its header checksum is recomputed. The header must decode (any part
// of the same block) and the payload must be the whole block's length.
func Seal(record []byte) error {
	h, err := DecodeHeader(record, 0)
	if err != nil {
		return err
	}
	whole := h.Layout.Whole()
	want := h.Layout.PartLen(len(h.Tokens), whole)
	if len(record) != h.Len+want {
		return corrupt("sealing %d bytes: a header of %d and a whole payload of %d", len(record), h.Len, want)
	}
	rewriteHeader(record, len(h.Tokens), whole, want, xxhash.Sum64(record[h.Len:]))
	return nil
}

// rewriteHeader sets, in rec, a record whose header (of a block of n
// tokens) is valid, the part range p, the payload length and checksum,
// and recomputes the header checksum: what turns one block's header into
// that of another part of it (Seal, AppendPartRecord).
func rewriteHeader(rec []byte, n int, p Part, payloadLen int, sum uint64) {
	putPart(rec, p)
	binary.LittleEndian.PutUint64(rec[80:], uint64(payloadLen))
	binary.LittleEndian.PutUint64(rec[88:], sum)
	ext := int(binary.LittleEndian.Uint32(rec[FixedHeaderLen+4*n:]))
	binary.LittleEndian.PutUint64(rec[headerSumOff:], headerSum(rec, n, ext))
}

// RankPart returns the part of a block of ns that the rank (tpRank of
// tpSize tensor-parallel ranks, ppRank of ppSize pipeline stages) of a
// model instance holds.
//
// Heads: with the split layout and H KV heads, when tpSize divides H rank
// r holds heads [r·H/tpSize, (r+1)·H/tpSize); when H divides tpSize (more
// ranks than KV heads: the heads are replicated) it holds the one head
// r/(tpSize/H); any other size is ErrBadPart, naming the valid ones. With
// the latent layout every rank holds the whole latent (heads [0,1)).
//
// Layers: each stage gets layers/ppSize of them, and the layers%ppSize
// left over go one each to the stages just before the last (the split
// vLLM makes by default); stage r holds the layers after those of the
// stages before it.
func RankPart(ns prefixhash.Namespace, tpRank, tpSize, ppRank, ppSize int) (Part, error) {
	if err := ns.Validate(); err != nil {
		return Part{}, err
	}
	if !ns.Groups.IsZero() {
		return Part{}, fmt.Errorf("%w: namespace %s has groups: a rank's part is per group (RankGroupPart)", ErrBadPart, ns)
	}
	l0, l1, err := stageLayers(ns.Layers, ppRank, ppSize)
	if err != nil {
		return Part{}, err
	}
	return rankPart(LayoutOf(ns), tpRank, tpSize, l0, l1)
}

// RankGroupPart is RankPart for group g's records of ns, a namespace with
// groups: the pipeline stage's layers are the model's (ns.Layers split as
// RankPart splits them) that belong to the group, as a range of the
// group's layers, and the rank's heads are the group's (a state group's
// heads split as KV heads do; a latent group's are [0,1)). A stage that
// holds none of the group's layers gets an empty part (Part.Empty): it has
// nothing of the group to write or read.
func RankGroupPart(ns prefixhash.Namespace, g, tpRank, tpSize, ppRank, ppSize int) (Part, error) {
	if err := ns.Validate(); err != nil {
		return Part{}, err
	}
	if ns.Groups.IsZero() || g < 0 || g >= ns.Groups.Len() {
		return Part{}, fmt.Errorf("%w: group %d: namespace %s has %d groups", ErrBadPart, g, ns, ns.Groups.Len())
	}
	m0, m1, err := stageLayers(ns.Layers, ppRank, ppSize)
	if err != nil {
		return Part{}, err
	}
	var l0, l1 int
	for _, l := range ns.Groups.At(g).Layers {
		if l < m0 {
			l0++
		}
		if l < m1 {
			l1++
		}
	}
	if l0 == l1 {
		return Part{L0: l0, L1: l1}, validTP(tpRank, tpSize)
	}
	return rankPart(GroupLayout(ns, g), tpRank, tpSize, l0, l1)
}

// Empty reports whether p holds nothing: a pipeline stage that holds none
// of a group's layers (RankGroupPart).
func (p Part) Empty() bool { return p.L1 <= p.L0 }

func validTP(tpRank, tpSize int) error {
	if tpSize < 1 || tpRank < 0 || tpRank >= tpSize {
		return fmt.Errorf("%w: tensor-parallel rank %d of size %d: want 0 <= rank < size", ErrBadPart, tpRank, tpSize)
	}
	return nil
}

// stageLayers returns the layers [l0,l1) of layers that pipeline stage
// ppRank of ppSize holds (see RankPart).
func stageLayers(layers, ppRank, ppSize int) (l0, l1 int, err error) {
	if ppSize < 1 || ppRank < 0 || ppRank >= ppSize {
		return 0, 0, fmt.Errorf("%w: pipeline rank %d of size %d: want 0 <= rank < size", ErrBadPart, ppRank, ppSize)
	}
	if ppSize > layers {
		return 0, 0, fmt.Errorf("%w: %d pipeline stages for %d layers: a stage holds at least one layer", ErrBadPart, ppSize, layers)
	}
	base, extra := layers/ppSize, layers%ppSize
	size := func(r int) int {
		// the extra layers go to stages ppSize-2, ppSize-3, …
		if r < ppSize-1 && r >= ppSize-1-extra {
			return base + 1
		}
		return base
	}
	for r := range ppRank {
		l0 += size(r)
	}
	return l0, l0 + size(ppRank), nil
}

// rankPart returns the part of a record of layout lay that tensor-parallel
// rank tpRank of tpSize holds within layers [l0,l1).
func rankPart(lay Layout, tpRank, tpSize, l0, l1 int) (Part, error) {
	if err := validTP(tpRank, tpSize); err != nil {
		return Part{}, err
	}
	p := Part{L0: l0, L1: l1}
	if lay.KV == prefixhash.LatentKV {
		p.H0, p.H1 = 0, 1
	} else {
		h := lay.KVHeads
		switch {
		case h%tpSize == 0:
			w := h / tpSize
			p.H0, p.H1 = tpRank*w, (tpRank+1)*w
		case tpSize%h == 0:
			p.H0 = tpRank / (tpSize / h)
			p.H1 = p.H0 + 1
		default:
			return Part{}, fmt.Errorf("%w: tensor-parallel size %d for %d KV heads: it must divide the heads or be a multiple of them (%s)", ErrBadPart, tpSize, h, tpSizes(h))
		}
	}
	if err := lay.CheckPart(p); err != nil {
		return Part{}, err
	}
	return p, nil
}

// tpSizes names the tensor-parallel sizes RankPart takes for h KV heads.
func tpSizes(h int) string {
	var s []string
	for d := 1; d <= h; d++ {
		if h%d == 0 {
			s = append(s, fmt.Sprint(d))
		}
	}
	return "valid: " + strings.Join(s, ", ") + fmt.Sprintf(", or a multiple of %d", h)
}

// AppendPartRecord appends to dst the encoded record of part p of whole,
// an encoded whole block: whole's header with the part range, payload
// length, payload checksum and header checksum rewritten for p, followed
// by the part's payload (ExtractPart). It is how a node serves a read of
// one rank's slice from the block it stores. whole's header is decoded
// and verified (DecodeHeader); its payload is taken as it is, the caller
// having verified it when it was stored. A p that is not a valid part of
// the block is ErrBadPart; a whole that is not a whole block, ErrCorrupt.
// On error dst is returned unchanged.
func AppendPartRecord(dst, whole []byte, p Part) ([]byte, error) {
	h, err := partSource(whole, p)
	if err != nil {
		return dst, err
	}
	n := len(h.Tokens)
	start := len(dst)
	dst = append(dst, whole[:h.Len]...)
	// Each run is hashed as it is copied, while it is in cache: one pass
	// over the bytes rather than a copy and then a checksum.
	var d xxhash.Digest
	d.Reset()
	payload := whole[h.Len:]
	h.Layout.runs(n, p, func(off, m int) {
		dst = append(dst, payload[off:off+m]...)
		d.Write(dst[len(dst)-m:])
	})
	rec := dst[start:]
	rewriteHeader(rec, n, p, len(rec)-h.Len, d.Sum64())
	return dst, nil
}

// PartRecordLen returns the length of the record AppendPartRecord makes of
// part p of whole, or the error it would fail with.
func PartRecordLen(whole []byte, p Part) (int, error) {
	h, err := partSource(whole, p)
	if err != nil {
		return 0, err
	}
	return h.Len + h.Layout.PartLen(len(h.Tokens), p), nil
}

// partSource decodes whole's header and checks that whole is a whole
// block of which p is a valid part.
func partSource(whole []byte, p Part) (Header, error) {
	h, err := DecodeHeader(whole, 0)
	switch {
	case err != nil:
		return h, err
	case !h.Whole():
		return h, corrupt("a part record (%s) where a whole block belongs", h.Part)
	case len(whole) != h.Len+h.PayloadLen:
		return h, corrupt("%d bytes, header says %d", len(whole), h.Len+h.PayloadLen)
	}
	return h, h.Layout.CheckPart(p)
}
