package store

import (
	"sync"
	"time"
)

// foreground counts the node's serving work in flight (gets, lookups, and
// what the node marks with Cluster.Foreground, such as a prefill), so that
// background pushes can wait for it to end.
type foreground struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // made for a waiter while n > 0, closed when n drops to 0
}

func (f *foreground) begin() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *foreground) end() {
	f.mu.Lock()
	f.n--
	if f.n == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
	f.mu.Unlock()
}

// busy returns a channel closed when the foreground work now in flight has
// all ended, or nil when there is none.
func (f *foreground) busy() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return nil
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	return f.idle
}

// Foreground marks serving work in flight on this node until the returned
// function is called (calling it more than once is harmless). Background
// pushes to owners wait while any is in flight, for at most
// ClusterOptions.PushYield per batch, so they never starve. The Cluster
// marks its own gets and lookups; the node marks what else serves a client,
// such as a prefill.
func (c *Cluster) Foreground() (done func()) {
	c.fg.begin()
	var once sync.Once
	return func() { once.Do(c.fg.end) }
}

// pace runs before a push of size bytes, with queued bytes left behind it
// in its queue: it waits while foreground work is in flight (at most
// PushYield) and, with PushBytesPerSec set, long enough that pushes keep to
// that rate on average. A queue at least half full does not wait at all, and
// a wait ends when urge receives (the queue filled to half meanwhile):
// waiting would then drop blocks that no longer fit. It reports false when
// the cluster closed meanwhile.
func (c *Cluster) pace(size, queued int64, urge <-chan struct{}) bool {
	if queued >= c.opts.PushQueueBytes/2 {
		return true
	}
	if c.opts.PushYield > 0 {
		if busy := c.fg.busy(); busy != nil {
			c.c.pushYields.Add(1)
			select {
			case <-busy:
			case <-c.after(c.opts.PushYield):
				c.c.pushYieldTimeouts.Add(1)
			case <-urge:
				return true
			case <-c.ctx.Done():
				return false
			}
		}
	}
	if c.opts.PushBytesPerSec > 0 {
		d := time.Duration(float64(size) / float64(c.opts.PushBytesPerSec) * float64(time.Second))
		if d > 0 {
			select {
			case <-c.after(d):
			case <-urge:
			case <-c.ctx.Done():
				return false
			}
		}
	}
	return true
}
