package store

import (
	"context"
	"slices"
	"sync"
)

// Flush waits until every queued push has been attempted, or ctx ends. For
// tests, benchmarks and graceful shutdown.
func (c *Cluster) Flush(ctx context.Context) error {
	c.mu.Lock()
	qs := make([]*pushQueue, 0, len(c.mu.queues))
	for _, q := range c.mu.queues {
		qs = append(qs, q)
	}
	c.mu.Unlock()
	for _, q := range qs {
		if err := q.flush(ctx); err != nil {
			return err
		}
	}
	return nil
}

// pushQueue holds copies of blocks waiting to go to one owner.
type pushQueue struct {
	c  *Cluster
	id string

	mu struct {
		sync.Mutex
		blocks   [][]byte
		bytes    int64
		inflight bool
		dead     bool          // the worker exited: its owner left the membership
		idle     chan struct{} // closed when the queue is empty and nothing is in flight
	}
	wake chan struct{}
	urge chan struct{} // a token when the queue reaches half its bound: a paced push goes at once
}

func (c *Cluster) enqueue(owner string, b []byte) {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		c.c.pushDropped.Add(1)
		return
	}
	q := c.mu.queues[owner]
	if q == nil {
		q = &pushQueue{c: c, id: owner, wake: make(chan struct{}, 1), urge: make(chan struct{}, 1)}
		c.mu.queues[owner] = q
		c.wg.Add(1)
		go q.run()
	}
	c.mu.Unlock()

	q.mu.Lock()
	if q.mu.dead || q.mu.bytes+int64(len(b)) > c.opts.PushQueueBytes {
		q.mu.Unlock()
		c.c.pushDropped.Add(1)
		return
	}
	q.mu.blocks = append(q.mu.blocks, slices.Clone(b))
	q.mu.bytes += int64(len(b))
	if q.mu.idle == nil {
		q.mu.idle = make(chan struct{})
	}
	full := q.mu.bytes >= c.opts.PushQueueBytes/2
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	if full {
		select {
		case q.urge <- struct{}{}:
		default:
		}
	}
}

// run pushes batches until the cluster closes. A worker whose owner left the
// membership drops its queue and exits.
func (q *pushQueue) run() {
	defer q.c.wg.Done()
	for {
		select {
		case <-q.c.ctx.Done():
			q.dropAll()
			return
		case <-q.wake:
		}
		for {
			batch := q.take()
			if batch == nil {
				break
			}
			switch {
			case !q.c.isMember(q.id):
				q.c.c.pushDropped.Add(uint64(len(batch)))
			case !q.c.pace(batchBytes(batch), q.queued(), q.urge):
				q.c.c.pushDropped.Add(uint64(len(batch))) // the cluster closed while it waited
			default:
				ctx, cancel := context.WithTimeout(q.c.ctx, q.c.opts.PushTimeout)
				err := q.c.peers.Put(ctx, q.id, batch)
				cancel()
				if err != nil {
					q.c.c.pushFailed.Add(uint64(len(batch)))
				} else {
					q.c.c.pushed.Add(uint64(len(batch)))
				}
			}
			q.done()
		}
		if !q.c.isMember(q.id) && q.retire() {
			return
		}
	}
}

// retire removes an idle queue whose owner left, so workers do not pile up
// with membership churn. It reports whether the queue is gone; a block
// enqueued meanwhile keeps it alive.
func (q *pushQueue) retire() bool {
	q.c.mu.Lock()
	defer q.c.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.mu.blocks) > 0 {
		return false
	}
	q.mu.dead = true
	if q.c.mu.queues[q.id] == q {
		delete(q.c.mu.queues, q.id)
	}
	return true
}

// take removes up to PushBatchBytes from the head of the queue.
func (q *pushQueue) take() [][]byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.mu.blocks) == 0 {
		return nil
	}
	var n int
	var size int64
	for n < len(q.mu.blocks) && (n == 0 || size+int64(len(q.mu.blocks[n])) <= q.c.opts.PushBatchBytes) {
		size += int64(len(q.mu.blocks[n]))
		n++
	}
	batch := slices.Clone(q.mu.blocks[:n])
	q.mu.blocks = slices.Delete(q.mu.blocks, 0, n)
	q.mu.bytes -= size
	q.mu.inflight = true
	return batch
}

// queued returns the bytes waiting in the queue, the batch in flight aside.
func (q *pushQueue) queued() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.mu.bytes
}

func batchBytes(batch [][]byte) int64 {
	var n int64
	for _, b := range batch {
		n += int64(len(b))
	}
	return n
}

func (q *pushQueue) done() {
	q.mu.Lock()
	q.mu.inflight = false
	if len(q.mu.blocks) == 0 && q.mu.idle != nil {
		close(q.mu.idle)
		q.mu.idle = nil
	}
	q.mu.Unlock()
}

func (q *pushQueue) dropAll() {
	q.mu.Lock()
	q.c.c.pushDropped.Add(uint64(len(q.mu.blocks)))
	q.mu.blocks, q.mu.bytes = nil, 0
	if q.mu.idle != nil {
		close(q.mu.idle)
		q.mu.idle = nil
	}
	q.mu.Unlock()
}

func (q *pushQueue) flush(ctx context.Context) error {
	q.mu.Lock()
	idle := q.mu.idle
	q.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Cluster) isMember(id string) bool {
	for _, m := range c.placement().Members() {
		if m.ID == id {
			return true
		}
	}
	return false
}
