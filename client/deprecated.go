package client

import (
	"context"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// The methods of the client before it had one verb per operation (Lookup,
// Get, View, Put over a Prompt), kept for one release as wrappers over the
// verbs. Each says what replaces it.

// LookupExtra is Lookup of a prompt whose blocks carry extra keys.
//
// Deprecated: use Lookup(ctx, ns, Prompt{Tokens: tokens, Extra: extra}).
func (c *Client) LookupExtra(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys) (Lookup, error) {
	return c.Lookup(ctx, ns, Prompt{Tokens: tokens, Extra: extra})
}

// LookupTokens is Lookup with the tokens sent: the node hashes them.
//
// Deprecated: use Lookup(ctx, ns, Prompt{Tokens: tokens}, SendTokens()).
func (c *Client) LookupTokens(ctx context.Context, ns prefixhash.Namespace, tokens []uint32) (Lookup, error) {
	return c.Lookup(ctx, ns, Prompt{Tokens: tokens}, SendTokens())
}

// GetExtra is Get of a prompt whose blocks carry extra keys.
//
// Deprecated: use Get(ctx, ns, Prompt{Tokens: tokens, Extra: extra}).
func (c *Client) GetExtra(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys) ([]Block, error) {
	return c.Get(ctx, ns, Prompt{Tokens: tokens, Extra: extra})
}

// GetInto reads the cached prefix into the caller's buffers and returns
// how many it filled.
//
// Deprecated: use Get(ctx, ns, Prompt{Tokens: tokens}, Into(dst)); the
// count is the length of the blocks it returns.
func (c *Client) GetInto(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, dst [][]byte) (int, error) {
	blocks, err := c.Get(ctx, ns, Prompt{Tokens: tokens}, Into(dst))
	return len(blocks), err
}

// GetKeys reads blocks by key and calls fn for each, in key order, misses
// included; b.Payload and b.Tokens are valid only during fn. An error from
// fn ends the call and is returned.
//
// Deprecated: use Get(ctx, ns, Prompt{Keys: keys}, Each(fn)).
func (c *Client) GetKeys(ctx context.Context, ns prefixhash.Namespace, keys []prefixhash.Key, fn func(b Block) error) error {
	_, err := c.Get(ctx, ns, Prompt{Keys: keys}, Each(fn))
	return err
}

// GetView reads blocks by key in place.
//
// Deprecated: use View(ctx, ns, Prompt{Keys: keys}).
func (c *Client) GetView(ctx context.Context, ns prefixhash.Namespace, keys []prefixhash.Key) (*View, error) {
	return c.View(ctx, ns, Prompt{Keys: keys})
}

// PutExtra is Put of a prompt whose blocks carry extra keys.
//
// Deprecated: use Put(ctx, ns, Prompt{Tokens: tokens, Extra: extra}, payloads).
func (c *Client) PutExtra(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys, payloads [][]byte) ([]prefixhash.Key, error) {
	return c.Put(ctx, ns, Prompt{Tokens: tokens, Extra: extra}, payloads)
}

// PutRank stores a rank's part of each block.
//
// Deprecated: use Put(ctx, ns, Prompt{Tokens: tokens, Rank: r}, payloads).
func (c *Client) PutRank(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, payloads [][]byte, r Rank) ([]prefixhash.Key, error) {
	return c.Put(ctx, ns, Prompt{Tokens: tokens, Rank: r}, payloads)
}

// PutRankExtra is PutRank of a prompt whose blocks carry extra keys.
//
// Deprecated: use Put(ctx, ns, Prompt{Tokens: tokens, Extra: extra, Rank: r}, payloads).
func (c *Client) PutRankExtra(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys, payloads [][]byte, r Rank) ([]prefixhash.Key, error) {
	return c.Put(ctx, ns, Prompt{Tokens: tokens, Extra: extra, Rank: r}, payloads)
}

// GetRank reads a rank's part of each block of the cached prefix.
//
// Deprecated: use Get(ctx, ns, Prompt{Tokens: tokens, Rank: r}).
func (c *Client) GetRank(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, r Rank) ([]Block, error) {
	return c.Get(ctx, ns, Prompt{Tokens: tokens, Rank: r})
}

// GetRankExtra is GetRank of a prompt whose blocks carry extra keys.
//
// Deprecated: use Get(ctx, ns, Prompt{Tokens: tokens, Extra: extra, Rank: r}).
func (c *Client) GetRankExtra(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys, r Rank) ([]Block, error) {
	return c.Get(ctx, ns, Prompt{Tokens: tokens, Extra: extra, Rank: r})
}

// GetRankInto reads a rank's part of each block of the cached prefix into
// the caller's buffers and returns how many it filled.
//
// Deprecated: use Get(ctx, ns, Prompt{Tokens: tokens, Rank: r}, Into(dst)).
func (c *Client) GetRankInto(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, dst [][]byte, r Rank) (int, error) {
	blocks, err := c.Get(ctx, ns, Prompt{Tokens: tokens, Rank: r}, Into(dst))
	return len(blocks), err
}
