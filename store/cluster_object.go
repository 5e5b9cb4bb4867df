package store

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Remove and Retain across the cluster (issue 33). A value may be held by
// its owners and, as copies, by nodes that produced or fetched it, so a
// removal goes to every member; a retention goes to the owners of the
// value's placement chunk (a copy is evicted first whatever its pin), or to
// every member when the caller does not know the chunk keys. Both take one
// parallel round bounded by LookupTimeout; a member that fails or is late
// answers "not there". A member's refusal of a retention over a limit
// (ErrQuota, ErrRetentionTTL) fails the call.

// Remove drops keys from every member that holds them (see Local.Remove)
// and reports per key whether any did.
func (c *Cluster) Remove(ctx context.Context, keys []prefixhash.Key) ([]bool, error) {
	found, err := c.local.Remove(ctx, keys)
	if err != nil {
		return nil, err
	}
	_, err = c.round(ctx, keys, c.askOthers(len(keys)), found, func(ctx context.Context, id string, ks []prefixhash.Key) ([]bool, error) {
		return c.peers.Remove(ctx, id, ks)
	})
	return found, err
}

// Retain sets the retention of keys (Local.Retain) on the members that
// should hold them: the owners of chunkKeys[i] (nil: every member), and
// this node when it holds them. It reports per key whether any member
// applied it.
func (c *Cluster) Retain(ctx context.Context, keys, chunkKeys []prefixhash.Key, r block.Retention) ([]bool, error) {
	if chunkKeys != nil && len(chunkKeys) != len(keys) {
		return nil, fmt.Errorf("store: cluster retain: %d keys but %d chunk keys", len(keys), len(chunkKeys))
	}
	if err := c.local.checkRetention(r); err != nil {
		return nil, err
	}
	applied, err := c.local.Retain(ctx, keys, r)
	if err != nil {
		return nil, err
	}
	var asks map[string][]int
	if chunkKeys == nil {
		asks = c.askOthers(len(keys))
	} else {
		asks = map[string][]int{}
		p := c.placement()
		var owners []string
		for k := range keys {
			for _, o := range p.Owners(owners[:0], chunkKeys[k]) {
				if o != c.self {
					asks[o] = append(asks[o], k)
				}
			}
		}
	}
	_, err = c.round(ctx, keys, asks, applied, func(ctx context.Context, id string, ks []prefixhash.Key) ([]bool, error) {
		return c.peers.Retain(ctx, id, ks, r)
	})
	return applied, err
}

// askOthers asks every member but this node for all n keys (the asks of
// round).
func (c *Cluster) askOthers(n int) map[string][]int {
	all := make([]int, n)
	for k := range all {
		all[k] = k
	}
	asks := map[string][]int{}
	for _, m := range c.placement().Members() {
		if m.ID != c.self {
			asks[m.ID] = all
		}
	}
	return asks
}

// round asks every member of asks at once for its keys (keys[idx]) with
// call, bounded by LookupTimeout, and ors each answer into got. It returns
// the first refusal a member gave (ErrQuota, ErrRetentionTTL); other
// failures count as "no".
func (c *Cluster) round(ctx context.Context, keys []prefixhash.Key, asks map[string][]int, got []bool,
	call func(ctx context.Context, id string, keys []prefixhash.Key) ([]bool, error)) (int, error) {
	if len(asks) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.LookupTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var refusal error
	answered := 0
	for o, idx := range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ks := make([]prefixhash.Key, len(idx))
			for j, k := range idx {
				ks[j] = keys[k]
			}
			c.c.remoteLookups.Add(1)
			res, err := call(ctx, o, ks)
			mu.Lock()
			defer mu.Unlock()
			if err != nil || len(res) != len(idx) {
				c.c.remoteLookupFails.Add(1)
				if refusal == nil && (errors.Is(err, ErrQuota) || errors.Is(err, ErrRetentionTTL)) {
					refusal = err
				}
				return
			}
			answered++
			for j, k := range idx {
				got[k] = got[k] || res[j]
			}
		}()
	}
	wg.Wait()
	return answered, refusal
}
