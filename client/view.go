package client

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// A View holds blocks read without a copy (Client.View). Until Release,
// the bytes of its blocks belong to the node or to the client's data plane,
// not to the caller: on the node's host they are the node's DRAM itself,
// which the node keeps unchanged under a lease (the blocks stay pinned
// there) until Release, or until the node's lease timeout (30s by default),
// after which it may reuse them. Read them, never write them, and not after
// Release. A View is not safe for concurrent use.
type View struct {
	// Blocks are the blocks read, as Get returns them: by tokens, the
	// cached prefix's; by keys, one per key asked for, in order, a miss
	// with Found false. Payload and Tokens are valid until Release.
	Blocks []Block

	results []*transfer.Result
}

// Release gives the blocks back (ends the leases). Call it exactly once,
// soon; later calls do nothing.
func (v *View) Release() {
	for _, r := range v.results {
		r.Release()
	}
	v.results = nil
	clear(v.Blocks)
}

// View reads the blocks of p under ns as Get does, verified the same way,
// but hands them out in place: through the node's data plane they stay
// where the transport put them (the node's DRAM on its host, a receive
// buffer over TCP) until View.Release. Blocks the node does not hold itself
// come from the cluster (BatchGet), copied. The caller must release the
// View, also when it reads nothing from it.
func (c *Client) View(ctx context.Context, ns prefixhash.Namespace, p Prompt, opts ...CallOption) (*View, error) {
	if _, err := applyOptions("view", opts); err != nil {
		return nil, err
	}
	t, err := c.newTarget(ctx, ns, p, false)
	if err != nil {
		return nil, err
	}
	if t.group >= 0 && t.byTokens() {
		return nil, fmt.Errorf("%w: View of a namespace with groups reads records by Keys; Get by Tokens reads what resuming needs", ErrInvalid)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	keys := t.keys
	v := &View{Blocks: make([]Block, len(keys))}
	missing := make([]int, 0, len(keys))
	if db, ok := c.bulk.(*dataBulk); ok {
		ts := db.dp.transports(ctx)
		win := windowOf(t.ns)
		for lo := 0; lo < len(keys); lo += win {
			hi := min(lo+win, len(keys))
			r, tr := db.dataGet(ctx, &ts, t.part, keys[lo:hi])
			if r != nil {
				v.results = append(v.results, r)
			}
			for i := lo; i < hi; i++ {
				if r != nil && r.Status[i-lo] == transfer.StatusOK {
					if b, ok := db.check(t.ns, t.part, keys[i], r.Values[i-lo], tr.full); ok {
						v.Blocks[i] = b
						continue
					}
				}
				missing = append(missing, i)
			}
		}
	} else {
		for i := range keys {
			missing = append(missing, i)
		}
	}
	if err := c.viewMissing(ctx, t, v, missing); err != nil {
		v.Release()
		return nil, fmt.Errorf("client: view: %w", err)
	}
	for i := range v.Blocks {
		v.Blocks[i].Index, v.Blocks[i].Key = i, keys[i]
	}
	if t.byTokens() {
		v.Blocks = v.Blocks[:c.prefixOf(t, v.Blocks)]
	}
	return v, nil
}

// viewMissing reads the blocks of v that the data plane did not have,
// v.Blocks[i] for i in missing, through BatchGet, which reaches the
// cluster: copies of them. By tokens, the first miss ends the read.
func (c *Client) viewMissing(ctx context.Context, t *target, v *View, missing []int) error {
	if len(missing) == 0 {
		return nil
	}
	mk := make([]prefixhash.Key, len(missing))
	for j, i := range missing {
		mk[j] = t.keys[i]
	}
	var mck []prefixhash.Key
	if cks := c.chunkKeysOf(ctx, t); cks != nil {
		mck = make([]prefixhash.Key, len(missing))
		for j, i := range missing {
			mck[j] = cks[i]
		}
	}
	return c.getKeys(ctx, t.ns, t.part, mk, mck, t.byTokens(), true, func(b Block) error {
		i := missing[b.Index]
		v.Blocks[i] = b
		return nil
	})
}

// prefixOf returns how many leading blocks of blocks, read for t's prompt
// by tokens, are its cached prefix: found, and holding the prompt's tokens
// and parent. A block that does not is counted in RefusedBlocks.
func (c *Client) prefixOf(t *target, blocks []Block) int {
	for i, b := range blocks {
		if !b.Found {
			return i
		}
		if !t.holds(b) {
			c.refused.Add(1)
			return i
		}
	}
	return len(blocks)
}
