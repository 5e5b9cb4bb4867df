package store

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// fakeAfter stands in for time.After in a Cluster's push workers: a wait
// ends only when the test fires it, and every wait is recorded.
type fakeAfter struct {
	mu      sync.Mutex
	pending []chan time.Time
	asked   []time.Duration
	waiting chan struct{} // a token whenever a wait starts
}

func newFakeAfter(c *Cluster) *fakeAfter {
	f := &fakeAfter{waiting: make(chan struct{}, 1)}
	c.after = f.after
	return f
}

func (f *fakeAfter) after(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	f.mu.Lock()
	f.pending = append(f.pending, ch)
	f.asked = append(f.asked, d)
	f.mu.Unlock()
	select {
	case f.waiting <- struct{}{}:
	default:
	}
	return ch
}

// fire ends every wait started so far.
func (f *fakeAfter) fire() {
	f.mu.Lock()
	for _, ch := range f.pending {
		ch <- time.Time{}
	}
	f.pending = nil
	f.mu.Unlock()
}

func (f *fakeAfter) durations() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.asked)
}

// flushFiring flushes c, firing every wait its workers start until the
// flush ends.
func flushFiring(t *testing.T, c *Cluster, f *fakeAfter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	flushed := make(chan error, 1)
	go func() { flushed <- c.Flush(ctx) }()
	for {
		select {
		case err := <-flushed:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-f.waiting:
			f.fire()
		}
	}
}

// pacePut puts a prompt of n blocks through node 0 and returns its chain and
// how many of its blocks node 1 owns (and must receive).
func pacePut(t *testing.T, tc *testCluster, seed uint64, n int) ([]prefixhash.Key, int) {
	t.Helper()
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(seed, seed)), ns, n)
	a := tc.nodes[0]
	chunks := a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))
	if err := a.Put(context.Background(), blocks, chunks); err != nil {
		t.Fatal(err)
	}
	owned := 0
	for _, ck := range chunks {
		if slices.Contains(a.Owners(ck), "n1") {
			owned++
		}
	}
	if owned == 0 {
		t.Fatal("node n1 owns none of the prompt: pick another seed")
	}
	return chain, owned
}

// checkPushed checks that node n1 holds every block of the chains it owns
// (owned in all) and that node 0 pushed them all, dropping and failing none.
func checkPushed(t *testing.T, tc *testCluster, owned int, chains ...[]prefixhash.Key) ClusterStats {
	t.Helper()
	a, b := tc.nodes[0], tc.net.nodes["n1"]
	ns := clusterNS()
	for _, chain := range chains {
		for i, ck := range a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain)) {
			if slices.Contains(a.Owners(ck), "n1") && !b.Contains(auth.Access{}, chain[i]) {
				t.Fatalf("block %d never reached its owner n1", i)
			}
		}
	}
	st := a.Stats()
	if st.Pushed != uint64(owned) || st.PushDropped != 0 || st.PushFailed != 0 {
		t.Fatalf("push stats %+v, want %d pushed and none dropped or failed", st, owned)
	}
	return st
}

// TestClusterPushYieldsToForeground: while serving work is in flight, a push
// waits; it goes as soon as the work ends.
func TestClusterPushYieldsToForeground(t *testing.T) {
	tc := newTestCluster(t, 2, ClusterOptions{ChunkTokens: 4, PushBatchBytes: 1, PushYield: 2 * time.Second})
	a := tc.nodes[0]
	f := newFakeAfter(a)
	done := a.Foreground()
	chain, owned := pacePut(t, tc, 7, 40)
	<-f.waiting // the worker waits for the foreground work, with nothing sent
	if st := a.Stats(); st.Pushed != 0 || st.PushYields != 1 {
		t.Fatalf("while serving: %+v, want nothing pushed and one yield", st)
	}
	done()
	done() // a second call is harmless
	flushFiring(t, a, f)
	if st := checkPushed(t, tc, owned, chain); st.PushYieldTimeouts != 0 {
		t.Fatalf("the wait ended by its bound, not by the end of the work: %+v", st)
	}
}

// TestClusterPushUnderContinuousLoad: foreground work that never ends (a held
// mark, and gets and lookups running through the whole test) delays each
// push batch by at most PushYield: every block still reaches its owner.
func TestClusterPushUnderContinuousLoad(t *testing.T) {
	tc := newTestCluster(t, 2, ClusterOptions{ChunkTokens: 4, PushBatchBytes: 1, PushYield: time.Hour})
	a := tc.nodes[0]
	f := newFakeAfter(a)
	defer a.Foreground()()
	ns := clusterNS()
	served, _ := prompt(t, rand.New(rand.NewPCG(8, 8)), ns, 4)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // bounded by the test: it stops when the pushes are done
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			a.LongestPrefix(context.Background(), served, ns.BlockTokens)
			if fe, err := a.Get(context.Background(), served, ns.BlockTokens, 0, len(served)); err == nil {
				fe.Release()
			}
		}
	}()
	var chains [][]prefixhash.Key
	total := 0
	for i := range 3 {
		chain, owned := pacePut(t, tc, uint64(20+i), 30)
		chains = append(chains, chain)
		total += owned
	}
	flushFiring(t, a, f)
	close(stop)
	wg.Wait()
	st := checkPushed(t, tc, total, chains...)
	// One batch per block (PushBatchBytes 1), each waited its bound.
	if st.PushYields != uint64(total) || st.PushYieldTimeouts != uint64(total) {
		t.Fatalf("push stats %+v: want %d yields, all ended by the bound", st, total)
	}
	for _, d := range f.durations() {
		if d != time.Hour {
			t.Fatalf("a push waited %v, want the PushYield bound", d)
		}
	}
}

// TestClusterPushRate: with PushBytesPerSec, each batch waits its size over
// the rate before it goes; no block is lost.
func TestClusterPushRate(t *testing.T) {
	const rate = 1 << 20
	tc := newTestCluster(t, 2, ClusterOptions{ChunkTokens: 4, PushBatchBytes: 1, PushBytesPerSec: rate, PushYield: -1})
	a := tc.nodes[0]
	f := newFakeAfter(a)
	chain, owned := pacePut(t, tc, 9, 40)
	flushFiring(t, a, f)
	st := checkPushed(t, tc, owned, chain)
	if st.PushYields != 0 {
		t.Fatalf("PushYield -1 still yielded: %+v", st)
	}
	ds := f.durations()
	if len(ds) != owned {
		t.Fatalf("%d waits for %d batches", len(ds), owned)
	}
	ns := clusterNS()
	size := block.EncodedLen(ns.BlockTokens, ns.BlockBytes()) // one block a batch
	want := time.Duration(float64(size) / rate * float64(time.Second))
	for _, d := range ds {
		if d != want || d <= 0 {
			t.Fatalf("a %d-byte batch waited %v at %d B/s, want %v", size, d, rate, want)
		}
	}
}

func TestClusterPaceOptions(t *testing.T) {
	o := ClusterOptions{PushBytesPerSec: -1}
	o.EnsureDefaults()
	if err := o.Validate(); err == nil {
		t.Fatal("a negative PushBytesPerSec was accepted")
	}
	o = ClusterOptions{}
	o.EnsureDefaults()
	if o.PushYield != 0 || o.PushBytesPerSec != 0 {
		t.Fatalf("defaults: PushYield %v, PushBytesPerSec %d", o.PushYield, o.PushBytesPerSec)
	}
}

// TestClusterPushFullQueueDoesNotWait: a queue at least half full pushes at
// once, foreground work or not, so that yielding never drops a block.
func TestClusterPushFullQueueDoesNotWait(t *testing.T) {
	tc := newTestCluster(t, 2, ClusterOptions{PushQueueBytes: 1000, PushBytesPerSec: 1, PushYield: 2 * time.Second})
	a := tc.nodes[0]
	f := newFakeAfter(a)
	defer a.Foreground()()
	if !a.pace(100, 500, nil) {
		t.Fatal("pace reported the cluster closed")
	}
	if ds := f.durations(); len(ds) != 0 {
		t.Fatalf("a half-full queue waited %v", ds)
	}
	paced := make(chan bool, 1)
	go func() { paced <- a.pace(100, 499, nil) }()
	<-f.waiting
	f.fire() // the yield
	<-f.waiting
	f.fire() // the rate
	if !<-paced || len(f.durations()) != 2 {
		t.Fatalf("a queue under half full: waits %v, want the yield and the rate", f.durations())
	}
}

// TestClusterPushUrgedWhenQueueFills: a push waiting for foreground work goes
// as soon as its queue reaches half its bound, before the wait's bound, so
// yielding never drops a block that would have fitted.
func TestClusterPushUrgedWhenQueueFills(t *testing.T) {
	ns := clusterNS()
	size := int64(block.EncodedLen(ns.BlockTokens, ns.BlockBytes()))
	tc := newTestCluster(t, 2, ClusterOptions{PushBatchBytes: 1, PushYield: time.Hour, PushQueueBytes: 8 * size})
	a := tc.nodes[0]
	f := newFakeAfter(a)
	done := a.Foreground()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(11, 11)), ns, 5)
	a.enqueue("n1", blocks[0])
	<-f.waiting // block 0 waits for the foreground work, the queue empty behind it
	for _, b := range blocks[1:] {
		a.enqueue("n1", b) // the fourth fills the queue to half
	}
	select { // block 0 goes without its bound passing; block 1 waits
	case <-f.waiting:
	case <-time.After(10 * time.Second): // a hang guard, not a timing
		t.Fatal("the push stayed waiting with its queue half full")
	}
	if st := a.Stats(); st.Pushed != 1 || st.PushYieldTimeouts != 0 || st.PushDropped != 0 {
		t.Fatalf("push stats %+v: want block 0 pushed, urged by the queue, nothing dropped", st)
	}
	done()
	flushFiring(t, a, f)
	for i, key := range chain {
		if !tc.net.nodes["n1"].Contains(auth.Access{}, key) {
			t.Fatalf("block %d never reached n1", i)
		}
	}
	if st := a.Stats(); st.Pushed != 5 || st.PushDropped != 0 || st.PushFailed != 0 {
		t.Fatalf("push stats %+v", st)
	}
}
