package openai

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// clusterNode is a fakeNode in a cluster: its peers and the lenders gossip
// would show, and the backlogs it advertised.
type clusterNode struct {
	fakeNode
	id      string // "" is fakeNode's
	peers   []Peer
	lenders []Lender

	mu         sync.Mutex
	advertised []int
}

func (c *clusterNode) Peers() []Peer { return c.peers }
func (c *clusterNode) ID() string {
	if c.id == "" {
		return c.fakeNode.ID()
	}
	return c.id
}
func (c *clusterNode) Lenders() []Lender { return c.lenders }
func (c *clusterNode) AdvertiseBacklog(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advertised = append(c.advertised, n)
}

func (c *clusterNode) lastAdvertised() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.advertised) == 0 {
		return -1
	}
	return c.advertised[len(c.advertised)-1]
}

// claimLog records, in order, which peers were asked for a batch; each
// answers 204 (none to lend).
type claimLog struct {
	mu    sync.Mutex
	asked []string
}

func (l *claimLog) peer(t *testing.T, name string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == internalQueuePath+"claim" {
			l.mu.Lock()
			l.asked = append(l.asked, name)
			l.mu.Unlock()
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestStealAsksLoadedPeers: of 40 engine peers, a steal asks only those
// that advertise a backlog, at most two of them and the larger backlog
// first; with none advertised, it asks nobody (an idle cluster sends no
// claims), where it asked all 40 before.
func TestStealAsksLoadedPeers(t *testing.T) {
	var log claimLog
	n := &clusterNode{}
	addr := map[string]string{}
	for i := range 40 {
		name := string(rune('A'+i%26)) + string(rune('a'+i/26))
		addr[name] = log.peer(t, name)
		n.peers = append(n.peers, Peer{ID: name, Addr: addr[name]})
	}
	a := startTestAPIOn(t, n, BatchOptions{Share: -1}) // no workers: steal is called here
	a.stealRand.r = rand.New(rand.NewPCG(1, 2))

	a.steal()
	if len(log.asked) != 0 {
		t.Fatalf("no lender advertised, yet a steal asked %v", log.asked)
	}

	n.lenders = []Lender{{Addr: addr["Ba"], Backlog: 1}, {Addr: addr["Ka"], Backlog: 4}}
	a.steal()
	if want := []string{"Ka", "Ba"}; !slices.Equal(log.asked, want) {
		t.Fatalf("two lenders: asked %v, want %v (the larger backlog first)", log.asked, want)
	}
	var none dto.Metric
	if err := a.batchMetrics.claims.WithLabelValues("none").Write(&none); err != nil || none.GetCounter().GetValue() != 2 {
		t.Errorf("claims answered none: %v (%v), want 2", none.GetCounter().GetValue(), err)
	}

	n.lenders = nil
	for _, name := range []string{"Ca", "Da", "Ea", "Fa", "Ga", "Ab"} {
		n.lenders = append(n.lenders, Lender{Addr: addr[name], Backlog: 2})
	}
	n.lenders[3].Backlog = 8
	seen := map[string]bool{}
	for range 20 {
		log.asked = nil
		a.steal()
		if len(log.asked) != 2 || log.asked[0] == log.asked[1] {
			t.Fatalf("six lenders: asked %v, want two of them", log.asked)
		}
		for _, name := range log.asked {
			if !slices.ContainsFunc(n.lenders, func(l Lender) bool { return l.Addr == addr[name] }) {
				t.Fatalf("asked %s, which advertised no backlog", name)
			}
			seen[name] = true
		}
		if slices.Contains(log.asked, "Fa") && log.asked[0] != "Fa" {
			t.Fatalf("asked %v: Fa, with the larger backlog, not first", log.asked)
		}
	}
	if len(seen) < 4 {
		t.Errorf("20 steals asked only %v of six lenders: the draw is not spread", seen)
	}
}

// TestAdvertiseBacklog: a node with batches nobody runs advertises how
// many, rounded down to a power of two, and 0 once they are gone.
func TestAdvertiseBacklog(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 1, 2: 2, 3: 2, 7: 4, 8: 8, 1000: 512} {
		if got := coarseBacklog(n); got != want {
			t.Errorf("coarseBacklog(%d) = %d, want %d", n, got, want)
		}
	}
	n := &clusterNode{}
	a := startTestAPIOn(t, n, BatchOptions{Share: -1, StealInterval: 10 * time.Millisecond})
	testkit.WaitFor(t, "an empty queue advertised as 0", func() bool { return n.lastAdvertised() == 0 })
	req := []byte(`t{"model": "kvmesh", "prompt": "queued", "max_tokens": 1}`)
	var ids []string
	for range 3 {
		m, err := a.batches.submit(queueOwner{}, [][]byte{req}, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	testkit.WaitFor(t, "three batches advertised as 2", func() bool { return n.lastAdvertised() == 2 })
	for _, id := range ids {
		if _, err := a.batches.cancel(id, queueOwner{}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, "no batch advertised as 0", func() bool { return n.lastAdvertised() == 0 })
}
