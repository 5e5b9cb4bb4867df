package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Publish queues the blocks of keys that this node holds for the owners of
// their placement chunks (chunkKeys[i] places keys[i]), as Put does for the
// blocks it stores; keys not held here are skipped. It is for blocks that
// reached the local store without their placement (the data plane carries
// keys and bytes only). It returns how many blocks it queued for at least
// one other owner. Like Put, it never waits for a peer.
func (c *Cluster) Publish(ctx context.Context, keys, chunkKeys []prefixhash.Key) (int, error) {
	if len(chunkKeys) != len(keys) {
		return 0, fmt.Errorf("store: cluster publish: %d keys but %d chunk keys", len(keys), len(chunkKeys))
	}
	owners := chunkOwners{p: c.placement()}
	var want []prefixhash.Key
	var wantOwners [][]string
	for k, key := range keys {
		var remote []string
		for _, o := range owners.of(chunkKeys[k]) {
			if o != c.self {
				remote = append(remote, o)
			}
		}
		if len(remote) > 0 {
			want = append(want, key)
			wantOwners = append(wantOwners, remote)
		}
	}
	if len(want) == 0 {
		return 0, nil
	}
	refs, err := c.local.GetMany(ctx, want)
	if err != nil {
		return 0, err
	}
	n := 0
	for j, r := range refs {
		if r == nil {
			continue
		}
		for _, o := range wantOwners[j] {
			c.enqueue(o, r.Bytes())
		}
		r.Release()
		n++
	}
	return n, nil
}

// PublishBlocks queues encoded blocks, which the caller has just stored
// with Local.Put or PutCopy (so they are verified), for the owners of their
// placement chunks (chunkKeys[i] places blocks[i]) other than this node, as
// Put does. Unlike Publish it does not read them back: a copy stored under
// EvictDedup may already be gone again. It returns how many blocks it
// queued for at least one other owner, and never waits for a peer.
func (c *Cluster) PublishBlocks(blocks [][]byte, chunkKeys []prefixhash.Key) (int, error) {
	if len(chunkKeys) != len(blocks) {
		return 0, fmt.Errorf("store: cluster publish: %d blocks but %d chunk keys", len(blocks), len(chunkKeys))
	}
	owners := chunkOwners{p: c.placement()}
	n := 0
	for k, b := range blocks {
		queued := false
		for _, o := range owners.of(chunkKeys[k]) {
			if o != c.self {
				c.enqueue(o, b)
				queued = true
			}
		}
		if queued {
			n++
		}
	}
	return n, nil
}

// Owns reports whether this node is one of the owners of the placement
// chunk whose key is chunkKey.
func (c *Cluster) Owns(chunkKey prefixhash.Key) bool {
	var buf [8]string
	return slices.Contains(c.placement().Owners(buf[:0], chunkKey), c.self)
}

// Put stores blocks locally (the producer keeps what it computed; a block
// another node owns as a copy, Local.PutCopy) and queues each for the owners
// of its placement chunk, whose key is chunkKeys[i].
// Pushes run in the background through a bounded queue per owner: when a
// queue is full the block is dropped and counted; Put never waits for a
// peer. The error is the local store's (see Local.PutMany): a block it
// refused is not pushed.
func (c *Cluster) Put(ctx context.Context, blocks [][]byte, chunkKeys []prefixhash.Key) error {
	if len(blocks) != len(chunkKeys) {
		return fmt.Errorf("store: cluster put: %d blocks but %d chunk keys", len(blocks), len(chunkKeys))
	}
	var errs []error
	placed := chunkOwners{p: c.placement()}
	for k, b := range blocks {
		owners := placed.of(chunkKeys[k])
		put := c.local.PutCopy // another node owns it (see EvictDedup)
		if slices.Contains(owners, c.self) {
			put = c.local.Put
		}
		if err := put(ctx, b); err != nil {
			if ctx.Err() != nil {
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, fmt.Errorf("block %d: %w", k, err))
			continue
		}
		for _, o := range owners {
			if o != c.self {
				c.enqueue(o, b)
			}
		}
	}
	return errors.Join(errs...)
}

// Handoff pushes the blocks this node holds in memory to the owners they
// will have once it is gone, at most maxBytes of them, and returns the keys
// of those it pushed (to one owner at least). Call it on a graceful leave,
// before leaving the membership, so that the hot part of the cache survives
// the departure. Pushes run in parallel per owner; a failed one is counted
// and skipped.
func (c *Cluster) Handoff(ctx context.Context, maxBytes int64) []prefixhash.Key {
	p := c.placement()
	var others []Member
	for _, m := range p.Members() {
		if m.ID != c.self {
			others = append(others, m)
		}
	}
	if len(others) == 0 {
		return nil
	}
	next := NewPlacement(others, c.opts.Replicas)
	byOwner := map[string][]prefixhash.Key{}
	var total int64
	for _, b := range c.local.InMemory(func(tokens int) int { return c.ChunkBlocks(tokens) }) {
		if total+int64(b.Size) > maxBytes {
			break
		}
		total += int64(b.Size)
		for _, o := range next.Owners(nil, b.ChunkKey) {
			byOwner[o] = append(byOwner[o], b.Key)
		}
	}
	var mu sync.Mutex
	var pushed []prefixhash.Key
	var wg sync.WaitGroup
	for o, keys := range byOwner {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for len(keys) > 0 && ctx.Err() == nil {
				var batch [][]byte
				var refs []*Ref
				var sent []prefixhash.Key
				var size int64
				for len(keys) > 0 && size < c.opts.PushBatchBytes {
					r, err := c.local.Get(ctx, keys[0])
					if err == nil {
						sent = append(sent, keys[0])
					}
					keys = keys[1:]
					if err != nil {
						continue // evicted since the walk
					}
					refs = append(refs, r)
					batch = append(batch, r.Bytes())
					size += int64(len(r.Bytes()))
				}
				if len(batch) > 0 {
					pctx, cancel := context.WithTimeout(ctx, c.opts.PushTimeout)
					if err := c.peers.Put(pctx, o, batch); err != nil {
						c.c.pushFailed.Add(uint64(len(batch)))
					} else {
						c.c.pushed.Add(uint64(len(batch)))
						mu.Lock()
						pushed = append(pushed, sent...)
						mu.Unlock()
					}
					cancel()
				}
				for _, r := range refs {
					r.Release()
				}
			}
		}()
	}
	wg.Wait()
	// With replicas, a block went to several owners: once each here.
	slices.SortFunc(pushed, func(a, b prefixhash.Key) int { return bytes.Compare(a[:], b[:]) })
	return slices.Compact(pushed)
}
