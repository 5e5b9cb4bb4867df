package bench

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

func loadSmall(t *testing.T) *Trace {
	t.Helper()
	tr, err := LoadTrace("testdata/small_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestParseTrace(t *testing.T) {
	tr := loadSmall(t)
	if len(tr.Requests) != 6 {
		t.Fatalf("%d requests, want 6 (the blank line is skipped)", len(tr.Requests))
	}
	r := tr.Requests[2]
	if r.Timestamp.Milliseconds() != 20 || r.InputLength != 1600 || r.OutputLength != 10 ||
		!slices.Equal(r.HashIDs, []uint64{0, 1, 4, 5}) || r.FullBlocks() != 3 {
		t.Fatalf("request 2 = %+v", r)
	}
}

func TestParseTraceErrorsNameTheLine(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}` + "\n"
	tests := []struct {
		name, input, want string
	}{
		{"truncated json", good + `{"timestamp": 5, "input_length": 6`, "line 2"},
		{"not json", "hello\n", "line 1"},
		{"missing timestamp", `{"input_length": 600, "hash_ids": [0, 1]}`, "line 1: missing timestamp"},
		{"missing input", `{"timestamp": 1, "hash_ids": [0]}`, "line 1: missing input_length"},
		{"missing ids", `{"timestamp": 1, "input_length": 5}`, "line 1: missing hash_ids"},
		{"zero input", `{"timestamp": 1, "input_length": 0, "hash_ids": []}`, "line 1: input_length 0"},
		{"negative output", `{"timestamp": 1, "input_length": 5, "output_length": -1, "hash_ids": [1]}`, "line 1: output_length -1"},
		{"wrong id count", good + "\n" + `{"timestamp": 1, "input_length": 1100, "hash_ids": [0, 1]}`, "line 3: 2 hash_ids, but input_length 1100 needs"},
		{"negative id", `{"timestamp": 1, "input_length": 5, "hash_ids": [-3]}`, "line 1: hash_ids[0] = -3"},
		{"negative time", `{"timestamp": -1, "input_length": 5, "hash_ids": [3]}`, "line 1: timestamp -1"},
		{"unsorted", `{"timestamp": 9, "input_length": 5, "hash_ids": [3]}` + "\n" + good, "line 2: timestamp 0 ms is before"},
		{"empty", "\n\n", "no requests"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(tt.input), "t.jsonl")
			if !errors.Is(err, ErrTrace) {
				t.Fatalf("err = %v, want ErrTrace", err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "t.jsonl") {
				t.Fatalf("error %q does not say %q and name the file", err, tt.want)
			}
		})
	}
}

func TestIdealSmallTrace(t *testing.T) {
	// Worked by hand: see testdata/small_trace.jsonl. Hash id 3 is a full
	// block in request 1 and a partial tail in request 3, which the ideal
	// counts as a hit and a block cache cannot.
	got := loadSmall(t).Ideal()
	want := Ideal{Requests: 6, Blocks: 15, HitBlocks: 8, HitRatio: 8.0 / 15, FullBlocks: 10, FullHitBlocks: 6,
		FullBlockHitRatio: 0.6, DistinctFullBlocks: 4, PromptTokens: 5724, CachedTokens: 6 * 512}
	if got != want {
		t.Fatalf("Ideal() =\n%+v, want\n%+v", got, want)
	}
}

// conversationTrace parses the bundled trace once for every test.
var conversationTrace = sync.OnceValues(ConversationTrace)

func TestConversationTrace(t *testing.T) {
	tr, err := conversationTrace()
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 12031 {
		t.Fatalf("%d requests, want 12031", len(tr.Requests))
	}
	id := tr.Ideal()
	// The figures DESIGN.md quotes: 0.366 of all hash ids, 0.382 of full blocks.
	if id.Blocks != 288500 || id.HitBlocks != 105710 || math.Abs(id.HitRatio-0.3664) > 0.0001 {
		t.Errorf("ideal over all hash ids: %d of %d = %.4f, want 105710 of 288500 = 0.3664", id.HitBlocks, id.Blocks, id.HitRatio)
	}
	if id.FullBlocks != 276491 || id.FullHitBlocks != 105592 || math.Abs(id.FullBlockHitRatio-0.3819) > 0.0001 {
		t.Errorf("ideal over full blocks: %d of %d = %.4f, want 105592 of 276491 = 0.3819", id.FullHitBlocks, id.FullBlocks, id.FullBlockHitRatio)
	}
	// Every request opens with hash id 0, so it cannot be the session key.
	keys := tr.Sessions(0)
	distinct := map[uint64]bool{}
	for i, k := range keys {
		if k == 0 {
			t.Fatalf("request %d keyed by the shared hash id 0", i)
		}
		if ids := tr.Requests[i].HashIDs; len(ids) > 1 && k != ids[1] {
			t.Fatalf("request %d keyed by %d, want its second id %d", i, k, ids[1])
		}
		distinct[k] = true
	}
	if len(distinct) < 5000 {
		t.Errorf("%d sessions, want thousands", len(distinct))
	}
}

func TestSessions(t *testing.T) {
	got := loadSmall(t).Sessions(0)
	// Id 0 opens 5 of 6 requests (more than half): skipped.
	if want := []uint64{1, 3, 1, 3, 1, 6}; !slices.Equal(got, want) {
		t.Fatalf("Sessions = %v, want %v", got, want)
	}
	// With a threshold above 5/6 nothing is common: the first id keys all.
	if got := loadSmall(t).Sessions(0.9); !slices.Equal(got, []uint64{0, 0, 0, 0, 0, 6}) {
		t.Fatalf("Sessions(0.9) = %v", got)
	}
}

func TestHashIDTokensDeterministic(t *testing.T) {
	a := make([]uint32, TraceBlockTokens)
	b := make([]uint32, TraceBlockTokens)
	HashIDTokens(a, 42, DefaultVocab)
	HashIDTokens(b, 42, DefaultVocab)
	if !slices.Equal(a, b) {
		t.Fatal("same id, different tokens")
	}
	HashIDTokens(b, 43, DefaultVocab)
	if slices.Equal(a, b) {
		t.Fatal("ids 42 and 43 give the same tokens")
	}
	for _, tok := range a {
		if tok >= DefaultVocab {
			t.Fatalf("token %d outside the vocabulary", tok)
		}
	}
	// A partial block is the prefix of the full one.
	p := make([]uint32, 100)
	HashIDTokens(p, 42, DefaultVocab)
	if !slices.Equal(p, a[:100]) {
		t.Fatal("partial block is not the prefix of the full block")
	}
	// Pinned (and checked against an independent splitmix64): the tokens
	// must not change between releases, or replays by different versions
	// stop sharing prefixes.
	HashIDTokens(p[:4], 0, DefaultVocab)
	if want := []uint32{114382, 51222, 94205, 91839}; !slices.Equal(p[:4], want) {
		t.Fatalf("tokens of hash id 0 = %v, pinned %v", p[:4], want)
	}
}

func TestWorkloadKeys(t *testing.T) {
	tr := loadSmall(t)
	ns := TraceNamespace()
	w, err := NewWorkload(context.Background(), tr, ns, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range tr.Requests {
		tokens := w.Tokens(nil, i)
		if len(tokens) != tr.Requests[i].InputLength {
			t.Fatalf("request %d: %d tokens, want %d", i, len(tokens), tr.Requests[i].InputLength)
		}
		if got, want := w.Keys(i), prefixhash.Keys(ns, tokens); !slices.Equal(got, want) {
			t.Fatalf("request %d: workload keys differ from prefixhash.Keys of its tokens", i)
		}
	}
	// Shared hash ids, shared keys; a different id, a different key.
	if w.Keys(0)[1] != w.Keys(2)[1] || w.Keys(0)[0] != w.Keys(1)[0] {
		t.Fatal("requests sharing a prefix do not share keys")
	}
	if w.Keys(0)[1] == w.Keys(1)[1] {
		t.Fatal("different prefixes share a key")
	}
	if len(w.Keys(5)) != 0 {
		t.Fatal("a request shorter than a block has a key")
	}
	// Another namespace, other keys.
	other := ns
	other.TenantSalt = "x"
	w2, err := NewWorkload(context.Background(), tr, other, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w2.Keys(0)[0] == w.Keys(0)[0] {
		t.Fatal("two namespaces share a key")
	}
	bad := ns
	bad.BlockTokens = 256
	if _, err := NewWorkload(context.Background(), tr, bad, 0, nil); err == nil || !strings.Contains(err.Error(), "block_tokens") {
		t.Fatalf("256-token namespace: err = %v, want one naming block_tokens", err)
	}
}
