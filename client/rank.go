package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// Parts of blocks, for the ranks of a model instance spread over several
// GPUs (tensor and pipeline parallelism). A block key names the whole
// model's KV of its tokens; each rank puts and gets its part of it (the
// KV heads and layers it holds, block.RankPart), and the node assembles
// the parts: a block is served, and counted by Lookup, once every part of
// it is there. Which part a call moves is the caller's Prompt.Rank, not the
// namespace's, so that instances of different parallel sizes share blocks.
//
// Parts travel over the node's data plane (its shared memory or TCP): the
// gRPC API carries whole blocks. A read of a part the node's data plane
// lacks (a block another member holds) reads the whole block through
// BatchGet and cuts the part from it.

// Rank is a parallel rank of a model instance: tensor-parallel rank TPRank
// of TPSize ranks, pipeline stage PPRank of PPSize stages. A size of 0 is
// 1, so the zero value is a single-GPU instance, whose part is the whole
// block.
type Rank struct{ TPRank, TPSize, PPRank, PPSize int }

func (r Rank) String() string {
	tp, pp := r.sizes()
	return fmt.Sprintf("tp %d/%d pp %d/%d", r.TPRank, tp, r.PPRank, pp)
}

// sizes returns the rank's sizes, 0 read as 1.
func (r Rank) sizes() (tp, pp int) {
	tp, pp = r.TPSize, r.PPSize
	if tp == 0 {
		tp = 1
	}
	if pp == 0 {
		pp = 1
	}
	return tp, pp
}

// Part returns the part of each block of ns that the rank holds
// (block.RankPart). A rank the model cannot be split into (a TP size that
// neither divides the KV heads nor is a multiple of them, more stages than
// layers, a rank out of its size) is ErrInvalid, wrapping block.ErrBadPart,
// with the valid sizes named.
func (r Rank) Part(ns prefixhash.Namespace) (block.Part, error) {
	tp, pp := r.sizes()
	p, err := block.RankPart(ns, r.TPRank, tp, r.PPRank, pp)
	if err != nil {
		return block.Part{}, fmt.Errorf("%w: rank %s: %w", ErrInvalid, r, err)
	}
	return p, nil
}

// shared reports whether other ranks of the instance hold the same part as
// r, bytes and all: every rank of a latent (MLA) namespace holds the whole
// latent, and ranks beyond the KV heads hold copies of them.
func (r Rank) shared(ns prefixhash.Namespace) bool {
	tp, _ := r.sizes()
	if ns.Layout == prefixhash.LatentKV {
		return tp > 1
	}
	return tp > ns.KVHeads
}

// rankPart checks ns and returns r's part of its blocks, zero when that is
// the whole block (the plain put and get paths), before any I/O.
func rankPart(ns prefixhash.Namespace, r Rank) (part block.Part, err error) {
	if err := checkNamespace(ns); err != nil {
		return block.Part{}, err
	}
	p, err := r.Part(ns)
	if err != nil || p == block.WholePart(ns) {
		return block.Part{}, err
	}
	return p, nil
}

// errPartsNeedDataPlane: a part put found no data plane to carry it.
var errPartsNeedDataPlane = errors.New("a part of a block travels over the node's data plane (shared memory or TCP) only, and none took it; the gRPC API carries whole blocks")

// partRefused is the error of a part put the node did not store: st is the
// put's statuses (nil when no data-plane transport took it), j the part's.
func partRefused(it *putItem, st []transfer.Status, j int) error {
	switch {
	case st == nil:
		return fmt.Errorf("%w: block %s, %s", errPartsNeedDataPlane, it.key, it.part)
	case st[j] == transfer.StatusMiss:
		return fmt.Errorf("%w: block %s, %s: the node dropped the part (no room for the block it belongs to)", ErrExhausted, it.key, it.part)
	}
	return fmt.Errorf("block %s, %s: the node failed the part (status %s)", it.key, it.part, st[j])
}

// claim asks the node which of items, part p of their blocks, still need
// to be sent, and returns those: the ones it answered ClaimWrite (the
// client now holds the claim, which the put releases). The others are
// complete, covered by stored parts, or claimed by another writer, which
// sends them. Without a data plane that answers claims, it asks which
// blocks are complete (Exists) and returns the rest.
func (c *Client) claim(ctx context.Context, p block.Part, items []putItem) ([]putItem, error) {
	keys := make([]prefixhash.Key, len(items))
	parts := make([]block.Part, len(items))
	for i, it := range items {
		keys[i], parts[i] = it.key, p
	}
	keep := func(send func(i int) bool) []putItem {
		var out []putItem
		for i, it := range items {
			if send(i) {
				out = append(out, it)
			}
		}
		return out
	}
	if d, ok := c.bulk.(*dataBulk); ok {
		ts := d.dp.transports(ctx)
		for _, t := range ts {
			pp, ok := t.peer.(transfer.PartPeer)
			if !ok {
				continue
			}
			st, err := pp.Claim(ctx, keys, parts)
			if err == nil && len(st) == len(keys) {
				return keep(func(i int) bool { return st[i] == block.ClaimWrite }), nil
			}
			if ctx.Err() != nil {
				return nil, callError("put", ctx.Err())
			}
			if err != nil && !errors.Is(err, transfer.ErrUnsupported) {
				d.dp.failed(t)
			}
		}
	}
	have, err := c.Exists(ctx, keys)
	if err != nil {
		return nil, err
	}
	return keep(func(i int) bool { return !have[i] }), nil
}
