package client

import (
	"context"
	"errors"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// SKELETON (issue 23): the API the other packages build against. The
// client helper replaces this file with the implementation.

// Rank is a parallel rank of a model instance: tensor-parallel rank TPRank
// of TPSize, pipeline stage PPRank of PPSize. The zero value (and sizes 0)
// is the whole block.
type Rank struct{ TPRank, TPSize, PPRank, PPSize int }

// PutRank stores the rank's part of each block of tokens.
func (c *Client) PutRank(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, payloads [][]byte, r Rank) ([]prefixhash.Key, error) {
	return nil, errors.New("client: PutRank not implemented yet")
}

// GetRank returns the rank's part of each cached complete block of the
// prompt's longest cached prefix.
func (c *Client) GetRank(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, r Rank) ([]Block, error) {
	return nil, errors.New("client: GetRank not implemented yet")
}
