package client

import (
	"context"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// PartialBlock is an incomplete block on a node: some of its parts (the
// ranges of tensor- and pipeline-parallel ranks) are stored, not all. It is
// not served until complete, and expires after the node's --partial-ttl.
type PartialBlock struct {
	Key             prefixhash.Key
	NamespaceDigest uint64
	Tokens          int
	Parts           []block.Part // stored, in the order they came
	Layers, Heads   int          // the block's grid of cells (Heads 1: latent)
	Covered         int          // cells the parts cover
	Age             time.Duration
	Bytes           int64 // DRAM the node holds for it
}

// Partials lists the incomplete blocks of the node (those of the caller's
// tenant), the oldest first, at most limit of them (0: 1000), and how many
// there are.
func (c *Client) Partials(ctx context.Context, limit int) ([]PartialBlock, int, error) {
	var resp *kvmeshv1.PartialsResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.Partials(ctx, &kvmeshv1.PartialsRequest{Limit: uint32(max(limit, 0))})
		return err
	})
	if err != nil {
		return nil, 0, callError("partials", err)
	}
	var out []PartialBlock
	for _, b := range resp.GetBlocks() {
		p := PartialBlock{NamespaceDigest: b.GetNamespaceDigest(), Tokens: int(b.GetTokens()),
			Layers: int(b.GetLayers()), Heads: int(b.GetHeads()), Covered: int(b.GetCovered()),
			Age: time.Duration(b.GetAgeSeconds() * float64(time.Second)), Bytes: int64(b.GetBytes())}
		copy(p.Key[:], b.GetKey())
		for _, r := range b.GetParts() {
			p.Parts = append(p.Parts, block.Part{L0: int(r.GetL0()), L1: int(r.GetL1()), H0: int(r.GetH0()), H1: int(r.GetH1())})
		}
		out = append(out, p)
	}
	return out, int(resp.GetTotal()), nil
}
