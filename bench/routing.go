package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
)

// Policy is how a trace replay routes requests to nodes.
type Policy string

// The routing policies of `--routing`.
const (
	// RoutingRandom picks a node uniformly at random (seeded): what an
	// operator can do when any node's cache serves any prefix.
	RoutingRandom Policy = "random"
	// RoutingRoundRobin cycles through the nodes in order.
	RoutingRoundRobin Policy = "round-robin"
	// RoutingSession pins every request of a session to one node, by
	// rendezvous hashing of its session key (see Trace.Sessions): what a
	// deployment without a shared cache must do to get hits.
	RoutingSession Policy = "session-affinity"
	// RoutingLeastLoaded sends a request to the node with the fewest prompt
	// tokens in flight, ties broken by the fewest tokens routed so far, then
	// by node index. In a replay with one request in flight it balances
	// tokens, not requests.
	RoutingLeastLoaded Policy = "least-loaded"
)

// Policies returns every routing policy.
func Policies() []Policy {
	return []Policy{RoutingRandom, RoutingRoundRobin, RoutingSession, RoutingLeastLoaded}
}

// ParsePolicy parses a policy name; "rr", "session" and "least-tokens" are
// accepted as short forms.
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(s) {
	case "random":
		return RoutingRandom, nil
	case "round-robin", "roundrobin", "rr":
		return RoutingRoundRobin, nil
	case "session-affinity", "session":
		return RoutingSession, nil
	case "least-loaded", "least-tokens":
		return RoutingLeastLoaded, nil
	}
	var names []string
	for _, p := range Policies() {
		names = append(names, string(p))
	}
	return "", fmt.Errorf("bench: routing policy %q: want one of %s", s, strings.Join(names, ", "))
}

// Router picks the node of each request of a trace. Route is called in
// trace order by one goroutine; Done, from any goroutine, when request i
// finished on node. Implementations are safe for that use.
type Router interface {
	Route(i int) int
	Done(i, node int)
}

// NewRouter returns the router of policy p for t over nodes nodes. seed
// seeds RoutingRandom; the session keys of RoutingSession come from
// t.Sessions(0).
func NewRouter(p Policy, nodes int, t *Trace, seed uint64) (Router, error) {
	if nodes < 1 {
		return nil, fmt.Errorf("bench: router: nodes %d must be at least 1", nodes)
	}
	switch p {
	case RoutingRandom:
		return &randomRouter{rng: rand.New(rand.NewPCG(seed, 0x6b766d657368)), n: nodes}, nil
	case RoutingRoundRobin:
		return &roundRobinRouter{n: nodes}, nil
	case RoutingSession:
		return &sessionRouter{keys: t.Sessions(0), n: nodes}, nil
	case RoutingLeastLoaded:
		r := &leastLoadedRouter{t: t}
		r.mu.inflight = make([]int64, nodes)
		r.mu.total = make([]int64, nodes)
		return r, nil
	}
	_, err := ParsePolicy(string(p))
	return nil, err
}

type randomRouter struct {
	rng *rand.Rand // used by the one routing goroutine only
	n   int
}

func (r *randomRouter) Route(int) int { return r.rng.IntN(r.n) }
func (r *randomRouter) Done(int, int) {}

type roundRobinRouter struct{ next, n int }

func (r *roundRobinRouter) Route(int) int {
	node := r.next
	r.next = (r.next + 1) % r.n
	return node
}
func (r *roundRobinRouter) Done(int, int) {}

type sessionRouter struct {
	keys []uint64
	n    int
}

func (r *sessionRouter) Route(i int) int { return rendezvous(r.keys[i], r.n) }
func (r *sessionRouter) Done(int, int)   {}

type leastLoadedRouter struct {
	t  *Trace
	mu struct {
		sync.Mutex
		inflight []int64 // prompt tokens of requests routed and not done
		total    []int64 // prompt tokens routed so far
	}
}

func (r *leastLoadedRouter) Route(i int) int {
	tokens := int64(r.t.Requests[i].InputLength)
	r.mu.Lock()
	defer r.mu.Unlock()
	best := 0
	for n := 1; n < len(r.mu.inflight); n++ {
		if r.mu.inflight[n] < r.mu.inflight[best] ||
			(r.mu.inflight[n] == r.mu.inflight[best] && r.mu.total[n] < r.mu.total[best]) {
			best = n
		}
	}
	r.mu.inflight[best] += tokens
	r.mu.total[best] += tokens
	return best
}

func (r *leastLoadedRouter) Done(i, node int) {
	r.mu.Lock()
	r.mu.inflight[node] -= int64(r.t.Requests[i].InputLength)
	r.mu.Unlock()
}

// rendezvous returns the node in [0, n) with the highest hash of (key,
// node): highest-random-weight hashing, so a change in n moves only the keys
// whose winner changed.
func rendezvous(key uint64, n int) int {
	best, bestScore := 0, uint64(0)
	for node := range n {
		if s := mix64(key ^ mix64(uint64(node)+0x6b766d657368)); node == 0 || s > bestScore {
			best, bestScore = node, s
		}
	}
	return best
}

// mix64 is splitmix64's finalizer: a bijection that scrambles every bit.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
