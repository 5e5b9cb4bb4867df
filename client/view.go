package client

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// A View holds blocks read without a copy (GetView). Until Release, the
// bytes of its blocks belong to the node or to the client's data plane, not
// to the caller: on the node's host they are the node's DRAM itself, which
// the node keeps unchanged under a lease (the blocks stay pinned there)
// until Release, or until the node's lease timeout (30s by default), after
// which it may reuse them. Read them, never write them, and not after
// Release. A View is not safe for concurrent use.
type View struct {
	// Blocks has one entry per key asked for, in order; a miss has Found
	// false. Payload and Tokens are valid until Release.
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

// GetView reads the blocks of keys under ns as GetKeys does, verified the
// same way, but hands them out in place: through the node's data plane they
// stay where the transport put them (the node's DRAM on its host, a receive
// buffer over TCP) until View.Release. Blocks the node does not hold itself
// come from the cluster (BatchGet), copied. The caller must release the
// View, also when it reads nothing from it.
func (c *Client) GetView(ctx context.Context, ns prefixhash.Namespace, keys []prefixhash.Key) (*View, error) {
	if err := checkNamespace(ns); err != nil {
		return nil, err
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	v := &View{Blocks: make([]Block, len(keys))}
	missing := make([]int, 0, len(keys))
	if db, ok := c.bulk.(*dataBulk); ok {
		ts := db.dp.transports(ctx)
		win := windowOf(ns)
		for lo := 0; lo < len(keys); lo += win {
			hi := min(lo+win, len(keys))
			r, t := db.dataGet(ctx, &ts, block.Part{}, keys[lo:hi])
			if r != nil {
				v.results = append(v.results, r)
			}
			for i := lo; i < hi; i++ {
				if r != nil && r.Status[i-lo] == transfer.StatusOK {
					if b, ok := db.check(ns, block.Part{}, keys[i], r.Values[i-lo], t.full); ok {
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
	if len(missing) > 0 {
		mk := make([]prefixhash.Key, len(missing))
		for j, i := range missing {
			mk[j] = keys[i]
		}
		err := c.GetKeys(ctx, ns, mk, func(b Block) error {
			i := missing[b.Index]
			if b.Found { // GetKeys reuses its buffers: keep copies
				b.Payload = append([]byte(nil), b.Payload...)
				b.Tokens = append([]uint32(nil), b.Tokens...)
			}
			v.Blocks[i] = b
			return nil
		})
		if err != nil {
			v.Release()
			return nil, fmt.Errorf("client: get view: %w", err)
		}
	}
	for i := range v.Blocks {
		v.Blocks[i].Index, v.Blocks[i].Key = i, keys[i]
	}
	return v, nil
}
