package transfer

import (
	"context"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// SKELETON (issue 23): the API the other packages build against. The
// transfer helper replaces this file with the implementation.

// StatusConflict: put, the value is a part whose bytes differ from a
// stored part it overlaps; refused.
const StatusConflict Status = 4

// ClaimStatus is the answer to a claim of one item.
type ClaimStatus uint8

const (
	ClaimWrite ClaimStatus = iota
	ClaimComplete
	ClaimCovered
	ClaimClaimed
)

// PartPeer is a Peer that reads parts and claims them.
type PartPeer interface {
	Peer
	GetParts(ctx context.Context, keys []prefixhash.Key, parts []block.Part) (*Result, error)
	Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part) ([]ClaimStatus, error)
}

// Claimer is a Sink that answers claims.
type Claimer interface {
	Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part, st []ClaimStatus)
}

func (c *Client) GetParts(ctx context.Context, keys []prefixhash.Key, parts []block.Part) (*Result, error) {
	return nil, ErrUnsupported
}

func (c *Client) Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part) ([]ClaimStatus, error) {
	return nil, ErrUnsupported
}
