package store

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Fetched holds blocks returned by Cluster.Get. Blocks[i] is the verified
// encoded block of the i-th requested key, or nil on a miss. The bytes are
// valid until Release.
type Fetched struct {
	Blocks   [][]byte
	releases []func()
}

// Release returns every block's memory. The blocks must not be used after.
func (f *Fetched) Release() {
	if f == nil {
		return
	}
	for _, r := range f.releases {
		r()
	}
	f.releases, f.Blocks = nil, nil
}

// Get returns blocks from..to-1 of chain (see LongestPrefix). Local tiers
// answer first; the rest is fetched from the owners in parallel, bounded by
// GetTimeout. Every block from a peer is verified (Decode, and its key must
// be the one asked for); a failed, late or corrupt answer is a miss. The
// error is only the caller's context or a closed store.
func (c *Cluster) Get(ctx context.Context, chain []prefixhash.Key, blockTokens, from, to int) (*Fetched, error) {
	if from < 0 || to > len(chain) || from > to {
		return nil, fmt.Errorf("store: cluster get: range [%d,%d) of a %d-block chain", from, to, len(chain))
	}
	return c.GetKeys(ctx, chain[from:to], c.ChunkKeys(chain, blockTokens, from, to), time.Time{})
}

// GetKeys is Get for keys that need not form a chain. chunkKeys[i] is the
// placement-chunk key of keys[i]; with chunkKeys nil (the caller does not
// know them), the keys missing here are first looked for on every member, in
// one lookup round bounded by LookupTimeout. Remote fetches end by remoteBy,
// or GetTimeout from now when that is sooner (remoteBy zero: GetTimeout), so
// a caller that reads a long list in several calls can bound their remote
// part as a whole. The local tiers answer under ctx alone.
func (c *Cluster) GetKeys(ctx context.Context, keys, chunkKeys []prefixhash.Key, remoteBy time.Time) (*Fetched, error) {
	c.fg.begin() // serving: pushes wait for it
	defer c.fg.end()
	if chunkKeys != nil && len(chunkKeys) != len(keys) {
		return nil, fmt.Errorf("store: cluster get: %d keys but %d chunk keys", len(keys), len(chunkKeys))
	}
	refs, err := c.local.GetMany(ctx, keys)
	if err != nil {
		return nil, err
	}
	f := &Fetched{Blocks: make([][]byte, len(keys))}
	var missing []int
	for k, r := range refs {
		if r != nil {
			f.Blocks[k] = r.Bytes()
			f.releases = append(f.releases, r.Release)
		} else {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return f, nil
	}
	rctx, cancel := remoteContext(ctx, remoteBy, c.opts.GetTimeout)
	defer cancel()
	if chunkKeys != nil {
		// Round r asks each still-missing key's r-th remote owner, so a
		// replica answers for an owner that is dead or lacks the block,
		// within the same deadline.
		p := c.placement()
		remote := make(map[int][]string, len(missing))
		for _, k := range missing {
			for _, o := range p.Owners(nil, chunkKeys[k]) {
				if o != c.self {
					remote[k] = append(remote[k], o)
				}
			}
		}
		for round := 0; rctx.Err() == nil; round++ {
			byOwner := map[string][]int{} // owner → indexes into keys
			for _, k := range missing {
				if os := remote[k]; f.Blocks[k] == nil && round < len(os) {
					byOwner[os[round]] = append(byOwner[os[round]], k)
				}
			}
			if len(byOwner) == 0 {
				break
			}
			c.fetch(rctx, keys, byOwner, f)
		}
	} else {
		byOwner := map[string][]int{} // owner → indexes into keys
		for j, h := range c.whoHas(rctx, keys, missing) {
			if h != "" {
				byOwner[h] = append(byOwner[h], missing[j])
			}
		}
		c.fetch(rctx, keys, byOwner, f)
	}
	if err := ctx.Err(); err != nil {
		f.Release()
		return nil, err
	}
	return f, nil
}

// remoteContext bounds ctx by by and by timeout from now, whichever comes
// first (by zero: timeout alone).
func remoteContext(ctx context.Context, by time.Time, timeout time.Duration) (context.Context, context.CancelFunc) {
	dl := time.Now().Add(timeout)
	if !by.IsZero() && by.Before(dl) {
		dl = by
	}
	return context.WithDeadline(ctx, dl)
}

// fetch reads keys[idx] from each owner in byOwner, in parallel under ctx,
// verifies what arrives and records it in f.
func (c *Cluster) fetch(ctx context.Context, keys []prefixhash.Key, byOwner map[string][]int, f *Fetched) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for o, idx := range byOwner {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ks := make([]prefixhash.Key, len(idx))
			for j, k := range idx {
				ks[j] = keys[k]
			}
			c.c.remoteGets.Add(1)
			blocks, release, err := c.peers.Get(ctx, o, ks)
			if err != nil || len(blocks) != len(ks) {
				c.c.remoteGetFails.Add(1)
				if release != nil {
					release()
				}
				return
			}
			kept := false
			for j, b := range blocks {
				if b == nil {
					c.c.remoteMisses.Add(1)
					continue
				}
				blk, err := block.Decode(b, c.local.opts.MaxBlockBytes)
				if err != nil || blk.Key != ks[j] {
					c.c.remoteCorrupt.Add(1)
					continue
				}
				c.c.remoteHits.Add(1)
				if c.opts.KeepRemote {
					_ = c.local.PutCopy(ctx, b) // best effort: a full node still serves the copy
				}
				mu.Lock()
				f.Blocks[idx[j]] = b
				mu.Unlock()
				kept = true
			}
			if release != nil {
				if kept {
					mu.Lock()
					f.releases = append(f.releases, release)
					mu.Unlock()
				} else {
					release()
				}
			}
		}()
	}
	wg.Wait()
}
