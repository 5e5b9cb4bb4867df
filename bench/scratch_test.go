package bench

import (
	"context"
	"testing"
	"time"
)

func TestScratchTraceStats(t *testing.T) {
	tr, err := ConversationTrace()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1000, 2000, 4000, 0} {
		h := tr.Head(n)
		id := h.Ideal()
		t.Logf("head %d: %+v", n, id)
	}
	t0 := time.Now()
	w, err := NewWorkload(context.Background(), tr, TraceNamespace(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("workload %v", time.Since(t0))
	enough := w.Ideal().DistinctFullBlocks
	t0 = time.Now()
	sim, _ := NewSim(SimOptions{Nodes: 4, CapacityBlocks: enough})
	st, err := Replay(context.Background(), w, sim.Nodes(), sim.Backend(), ReplayOptions{})
	t.Logf("sim replay %v: %.4f", time.Since(t0), st.RatioVsIdeal)
}
