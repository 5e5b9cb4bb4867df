package transfer

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Parts of blocks (issue 23): a tensor- or pipeline-parallel rank of a
// model instance reads its slice of each block (GetParts: getPartReq
// frames, answered with part records the server builds from the whole
// blocks it holds) and, before it writes a part that other ranks write
// identically (the latent layout, replicated heads), asks whether it still
// needs sending (Claim: claimReq and claimResp frames). Part records are
// put like blocks: a put needs nothing new beside StatusConflict.

// StatusConflict: put, the value is a part whose bytes differ from a
// stored part it overlaps; refused (nothing of it stored).
const StatusConflict Status = 4

// PartPeer is a Peer that reads parts and claims them. Client and
// ShmClient implement it.
type PartPeer interface {
	Peer
	// GetParts fetches, for each i, the record of part parts[i] of the
	// block keys[i]: an encoded part record (block.Decode verifies it;
	// its Part is parts[i]), or the whole block when parts[i] is the
	// whole range. A range that is not a valid part of its block is
	// StatusError for that item. Deadline, limits, retries and Release
	// as Get.
	GetParts(ctx context.Context, keys []prefixhash.Key, parts []block.Part) (*Result, error)
	// Claim asks, for each i, whether part parts[i] of block keys[i]
	// still needs to be put (block.ClaimWrite) or not. A server whose sink
	// takes no claims answers with an error wrapping ErrRemote.
	Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part) ([]block.ClaimStatus, error)
}

var (
	_ PartPeer = (*Client)(nil)
	_ PartPeer = (*ShmClient)(nil)
)

// Claimer is a Sink that answers claims.
type Claimer interface {
	// Claim sets st[i] to the claim status of part parts[i] of the block
	// keys[i] (st arrives zeroed: block.ClaimWrite). A claim it cannot answer
	// (a bad range, an error) is left block.ClaimWrite: the put that follows
	// gets the verdict. ctx carries the requester's access, as Put's.
	Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part, st []block.ClaimStatus)
}

// sizeValues sets lens[i] to the length of what answers item i of a get:
// the value itself, or, for a getPartReq (parts not nil), the part record
// built from it; an item whose range is not a valid part of its block (or
// whose value is no whole block) becomes StatusError.
func sizeValues(vals [][]byte, st []Status, parts []block.Part, lens []int) {
	for i, v := range vals {
		lens[i] = 0
		if st[i] != StatusOK {
			continue
		}
		if parts == nil {
			lens[i] = len(v)
			continue
		}
		n, err := block.PartRecordLen(v, parts[i])
		if err != nil {
			st[i] = StatusError
			continue
		}
		lens[i] = n
	}
}

// asStored reports whether the answer to an item of a get-part request,
// of n bytes (sizeValues), is the stored value v itself: the item asks for
// the whole block, whose part record is the block (same header, payload
// and checksums), sent as it is rather than built again. Any other part
// is shorter than its block.
func asStored(n int, v []byte) bool { return n == len(v) }

// putRecord builds the part record of part p of whole in dst, which has
// room for exactly the record (sizeValues said how much).
func putRecord(dst, whole []byte, p block.Part) error {
	rec, err := block.AppendPartRecord(dst[:0], whole, p)
	if err == nil && (len(rec) != len(dst) || &rec[0] != &dst[0]) {
		err = fmt.Errorf("%d bytes where %d were sized", len(rec), len(dst))
	}
	if err != nil {
		return fmt.Errorf("transfer: build part record %s: %w", p, err)
	}
	return nil
}

// serveClaim answers a claim request (its table in table) from sink: the
// claimResp frame, valid until enc's next use. It is shared by the TCP and
// shared-memory servers.
func serveClaim(ctx context.Context, h *header, table []byte, sink Sink, sc *scratch, enc *encoder) ([]byte, error) {
	cl, ok := sink.(Claimer)
	if !ok {
		return nil, fmt.Errorf("%w: this server takes no claims", ErrUnsupported)
	}
	n := h.count
	sc.size(n)
	sc.parts = grow(sc.parts, n)
	parsePartReq(table, sc.keys, sc.parts)
	st := make([]block.ClaimStatus, n)
	cl.Claim(ctx, sc.keys, sc.parts, st)
	t := enc.begin(typeClaimResp, n)
	for i, s := range st {
		if s > block.ClaimClaimed {
			s = block.ClaimWrite
		}
		putClaimEntry(t, i, s)
	}
	return enc.finish(header{typ: typeClaimResp, id: h.id, count: n}), nil
}

// requestFrame builds, in enc, the get request for the items idx of keys: a
// getReq, or a getPartReq of parts when parts is not nil. The frame is
// valid until enc's next use.
func requestFrame(ctx context.Context, enc *encoder, id uint64, keys []prefixhash.Key, parts []block.Part, idx []int, lim *Limits) []byte {
	if parts != nil {
		return partFrame(ctx, enc, typeGetPartReq, id, keys, parts, idx, lim)
	}
	t := enc.begin(typeGetReq, len(idx))
	for i, j := range idx {
		putKeyEntry(t, i, keys[j])
	}
	return enc.finish(getHeader(ctx, id, len(idx), lim))
}

// partFrame builds, in enc, a getPartReq (or claimReq) frame for the items
// idx of keys and parts.
func partFrame(ctx context.Context, enc *encoder, typ frameType, id uint64, keys []prefixhash.Key, parts []block.Part, idx []int, lim *Limits) []byte {
	t := enc.begin(typ, len(idx))
	for i, j := range idx {
		putPartEntry(t, i, keys[j], parts[j])
	}
	if typ == typeGetPartReq {
		h := getHeader(ctx, id, len(idx), lim)
		h.typ = typeGetPartReq
		return enc.finish(h)
	}
	return enc.finish(scoped(ctx, header{typ: typ, id: id, count: len(idx), timeout: timeoutMillis(ctx)}))
}

// claimRounds runs a Claim of keys in requests of at most maxItems:
// round asks for the items idx and fills their statuses.
func claimRounds(keys []prefixhash.Key, parts []block.Part, maxItems int, round func(idx []int, st []block.ClaimStatus) error) ([]block.ClaimStatus, error) {
	if err := checkParts(keys, parts); err != nil {
		return nil, err
	}
	st := make([]block.ClaimStatus, len(keys))
	idx := make([]int, 0, min(len(keys), maxItems))
	for lo := 0; lo < len(keys); lo += maxItems {
		hi := min(lo+maxItems, len(keys))
		idx = idx[:0]
		for i := lo; i < hi; i++ {
			idx = append(idx, i)
		}
		if err := round(idx, st[lo:hi]); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// GetParts fetches the records of parts[i] of the blocks keys[i] (see
// PartPeer), as Get fetches blocks: batches of at most MaxItems, as many
// requests as the server needs to stay within MaxBatchBytes, values in
// pooled buffers until Release.
func (c *Client) GetParts(ctx context.Context, keys []prefixhash.Key, parts []block.Part) (*Result, error) {
	if err := checkParts(keys, parts); err != nil {
		return nil, err
	}
	return c.get(ctx, keys, parts)
}

// Claim asks the peer whether parts[i] of the blocks keys[i] still need to
// be put (see PartPeer).
func (c *Client) Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part) ([]block.ClaimStatus, error) {
	ctx, cancel := requestContext(ctx, c.opts.RequestTimeout)
	defer cancel()
	st, err := claimRounds(keys, parts, c.opts.MaxItems, func(idx []int, st []block.ClaimStatus) error {
		return c.do(ctx, func(cc *clientConn) error {
			id := c.nextID.Add(1)
			if _, err := cc.nc.Write(partFrame(ctx, &cc.enc, typeClaimReq, id, keys, parts, idx, &c.opts.Limits)); err != nil {
				return fmt.Errorf("send request: %w", err)
			}
			h, err := cc.readFrame(id, typeClaimResp, &c.opts.Limits)
			if err != nil {
				return err
			}
			if h.count != len(idx) {
				return corrupt("%d items in the answer to %d claims", h.count, len(idx))
			}
			return parseClaimResp(cc.table, st)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("transfer: claim %d parts from %s: %w", len(keys), c.addr, err)
	}
	return st, nil
}
