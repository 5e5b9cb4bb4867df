package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// synthTrace is a conversation-like trace: every request opens with the
// shared block 0, then its session's own blocks; turn k of a session has
// k+2 own blocks and a partial tail, and extends turn k-1's prompt.
// Sessions interleave in a seeded random order.
func synthTrace(sessions, turns int, seed uint64) *Trace {
	rng := rand.New(rand.NewPCG(seed, 7))
	type sess struct {
		ids  []uint64
		turn int
	}
	next := uint64(1)
	all := make([]*sess, sessions)
	for i := range all {
		all[i] = &sess{}
	}
	var reqs []Request
	for len(all) > 0 {
		i := rng.IntN(len(all))
		s := all[i]
		for len(s.ids) < s.turn+2 {
			s.ids = append(s.ids, next)
			next++
		}
		tail := next // the partial tail is a block of its own
		next++
		ids := append(append([]uint64{0}, s.ids...), tail)
		reqs = append(reqs, Request{
			Timestamp:   time.Duration(len(reqs)) * time.Millisecond,
			InputLength: (len(ids)-1)*TraceBlockTokens + 1 + rng.IntN(TraceBlockTokens-1),
			HashIDs:     ids,
		})
		if s.turn++; s.turn == turns {
			all = slices.Delete(all, i, i+1)
		}
	}
	return &Trace{Name: "synthetic", Requests: reqs}
}

func routeAll(t *testing.T, p Policy, nodes int, tr *Trace, done bool) []int {
	t.Helper()
	r, err := NewRouter(p, nodes, tr, 1)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int, len(tr.Requests))
	for i := range tr.Requests {
		out[i] = r.Route(i)
		if out[i] < 0 || out[i] >= nodes {
			t.Fatalf("%s routed request %d to node %d of %d", p, i, out[i], nodes)
		}
		if done {
			r.Done(i, out[i])
		}
	}
	return out
}

func counts(routes []int, nodes int) []int {
	c := make([]int, nodes)
	for _, n := range routes {
		c[n]++
	}
	return c
}

func TestRoutingRandom(t *testing.T) {
	tr := synthTrace(400, 10, 1) // 4000 requests
	a := routeAll(t, RoutingRandom, 4, tr, true)
	for n, c := range counts(a, 4) {
		// Binomial(4000, 1/4): σ ≈ 27; ±200 is over 7σ.
		if c < 800 || c > 1200 {
			t.Errorf("node %d got %d of 4000 requests", n, c)
		}
	}
	if b := routeAll(t, RoutingRandom, 4, tr, true); !slices.Equal(a, b) {
		t.Error("the same seed routed differently")
	}
	r, _ := NewRouter(RoutingRandom, 4, tr, 2)
	same := 0
	for i := range tr.Requests {
		if r.Route(i) == a[i] {
			same++
		}
	}
	if same > 1500 {
		t.Errorf("seeds 1 and 2 agree on %d of 4000 routes", same)
	}
}

func TestRoutingRoundRobin(t *testing.T) {
	tr := synthTrace(10, 3, 1)
	for i, n := range routeAll(t, RoutingRoundRobin, 3, tr, true) {
		if n != i%3 {
			t.Fatalf("request %d went to node %d, want %d", i, n, i%3)
		}
	}
}

func TestRoutingSessionAffinity(t *testing.T) {
	tr := synthTrace(400, 10, 1)
	routes := routeAll(t, RoutingSession, 4, tr, true)
	keys := tr.Sessions(0)
	home := map[uint64]int{}
	for i, n := range routes {
		if h, ok := home[keys[i]]; ok && h != n {
			t.Fatalf("session %d on nodes %d and %d", keys[i], h, n)
		}
		home[keys[i]] = n
	}
	if len(home) != 400 {
		t.Fatalf("%d sessions, want 400", len(home))
	}
	for n, c := range counts(routes, 4) {
		if c < 600 || c > 1400 { // 100 sessions of 10 each expected per node
			t.Errorf("node %d got %d of 4000 requests", n, c)
		}
	}
	// Rendezvous hashing: a fifth node takes about a fifth of the sessions
	// and moves no session between the other four.
	moved := 0
	for k, h := range home {
		if n := rendezvous(k, 5); n != h {
			if n != 4 {
				t.Fatalf("session %d moved from node %d to %d, not to the new node", k, h, n)
			}
			moved++
		}
	}
	if moved < 40 || moved > 130 {
		t.Errorf("%d of 400 sessions moved to the fifth node, want about 80", moved)
	}
}

func TestRoutingLeastLoaded(t *testing.T) {
	tr := synthTrace(400, 10, 1)
	routes := routeAll(t, RoutingLeastLoaded, 4, tr, true)
	tokens := make([]int64, 4)
	for i, n := range routes {
		tokens[n] += int64(tr.Requests[i].InputLength)
	}
	if mm := maxOverMean(tokens); mm > 1.01 {
		t.Errorf("tokens per node %v: max/mean %.3f, want ≤ 1.01", tokens, mm)
	}
	// Requests in flight count: four at once land on four nodes.
	r, _ := NewRouter(RoutingLeastLoaded, 4, tr, 1)
	var got []int
	for i := range 4 {
		got = append(got, r.Route(i))
	}
	slices.Sort(got)
	if !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("four requests in flight went to nodes %v", got)
	}
}

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]Policy{"random": RoutingRandom, "rr": RoutingRoundRobin, "Round-Robin": RoutingRoundRobin,
		"session": RoutingSession, "session-affinity": RoutingSession, "least-loaded": RoutingLeastLoaded} {
		if got, err := ParsePolicy(in); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParsePolicy("sticky"); err == nil {
		t.Error("ParsePolicy accepted an unknown policy")
	}
	if _, err := NewRouter("sticky", 4, synthTrace(1, 1, 1), 1); err == nil {
		t.Error("NewRouter accepted an unknown policy")
	}
}
