package router

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestChooseLeastLoaded(t *testing.T) {
	for _, c := range []struct {
		loads  []nodeLoad
		decode bool
		start  int
		want   int
	}{
		{[]nodeLoad{{prompt: 500}, {prompt: 10}, {prompt: 90}}, false, 0, 1},
		{[]nodeLoad{{prompt: 500, decode: 1}, {prompt: 10, decode: 900}}, true, 1, 0},
		// Equal tokens: fewer requests; all equal: the start.
		{[]nodeLoad{{prompt: 5, requests: 3}, {prompt: 5, requests: 1}, {prompt: 5, requests: 2}}, false, 2, 1},
		{[]nodeLoad{{}, {}, {}}, false, 2, 2},
	} {
		if got := chooseLeastLoaded(c.loads, c.decode, c.start); got != c.want {
			t.Errorf("chooseLeastLoaded(%+v, decode %v, start %d) = %d, want %d", c.loads, c.decode, c.start, got, c.want)
		}
	}
}

// TestRouterPicksByUncachedTokens: the token policy sends a request to the
// node with the fewest uncached prompt tokens in flight, whatever the
// session; the session policy keeps a session on one node.
func TestRouterPicksByUncachedTokens(t *testing.T) {
	r := &Router{opts: Options{Policy: PolicyTokens}, pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x"}, []string{"node", "kind"})}
	r.mu.load = map[string]*nodeLoad{}
	cands := []backend{{id: "a"}, {id: "b"}, {id: "c"}}
	_, doneA := r.charge("a", 4000, 10)
	preB, doneB := r.charge("b", 300, 10)
	_, doneC := r.charge("c", 900, 10)
	for range 5 {
		if i := r.pick(cands, false, "session-1"); cands[i].id != "b" {
			t.Fatalf("picked %s with loads a=4000 b=300 c=900", cands[i].id)
		}
	}
	preB() // b's prompt is computed: it decodes, its prompt load is gone
	if i := r.pick(cands, false, ""); cands[i].id != "b" {
		t.Errorf("picked %s once b's prefill was done", cands[i].id)
	}
	doneA()
	doneB()
	doneC()
	if l := r.mu.load["b"]; l.prompt != 0 || l.decode != 0 || l.requests != 0 {
		t.Errorf("load of b after its requests ended: %+v", *l)
	}
	r.opts.Policy = PolicySession
	first := r.pick(cands, false, "conv-7")
	for range 5 {
		if r.pick(cands, false, "conv-7") != first {
			t.Fatal("the session policy moved a session")
		}
	}
}
