package bench

import (
	"slices"
	"testing"
)

// TestAgenticDeterministic: the same seed gives the same trace, another seed
// another one, and the trace is a valid Mooncake trace whose sessions share
// their agents' prefixes and reuse their own prompts.
func TestAgenticDeterministic(t *testing.T) {
	o := AgenticOptions{Sessions: 60}
	a, err := GenerateAgentic(o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := GenerateAgentic(o)
	o.Seed = 2
	c, _ := GenerateAgentic(o)
	same := func(x, y *Trace) bool {
		return slices.EqualFunc(x.Requests, y.Requests, func(p, q Request) bool {
			return p.Timestamp == q.Timestamp && p.InputLength == q.InputLength && slices.Equal(p.HashIDs, q.HashIDs)
		})
	}
	if !same(a, b) {
		t.Fatal("two traces of seed 1 differ")
	}
	if same(a, c) {
		t.Fatal("seeds 1 and 2 give the same trace")
	}
	for i, r := range a.Requests {
		if want := (r.InputLength + TraceBlockTokens - 1) / TraceBlockTokens; len(r.HashIDs) != want {
			t.Fatalf("request %d: %d ids for %d tokens", i, len(r.HashIDs), r.InputLength)
		}
		if i > 0 && r.Timestamp < a.Requests[i-1].Timestamp {
			t.Fatalf("request %d is before request %d", i, i-1)
		}
	}
	id := a.Ideal()
	if id.HitRatio < 0.5 || id.DistinctFullBlocks >= id.FullBlocks/2 {
		t.Fatalf("ideal %+v: agent sessions should reuse most of their blocks", id)
	}
}

func TestParseAgenticPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
		seed uint64
		bad  bool
	}{
		{"agentic", true, 0, false},
		{"agentic:7", true, 7, false},
		{"agentic:0", true, 0, true},
		{"agentic:x", true, 0, true},
		{"agentics.jsonl", false, 0, false},
		{"conversation_trace.jsonl", false, 0, false},
	} {
		o, ok, err := ParseAgenticPath(tc.path)
		if ok != tc.ok || (err != nil) != tc.bad || (!tc.bad && o.Seed != tc.seed) {
			t.Errorf("ParseAgenticPath(%q) = %+v, %v, %v", tc.path, o, ok, err)
		}
	}
	if _, err := GenerateAgentic(AgenticOptions{Sessions: -1}); err == nil {
		t.Error("GenerateAgentic took -1 sessions")
	}
}
