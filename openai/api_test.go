package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefill"
)

// fakeNode is a node alone, open to everyone, with no cluster to flush to:
// what the API needs of a node, without one.
type fakeNode struct{}

var _ Node = fakeNode{}

func (fakeNode) ID() string     { return "fake" }
func (fakeNode) Stopping() bool { return false }
func (fakeNode) Foreground() func() {
	return func() {}
}
func (fakeNode) Flush(context.Context) error { return nil }
func (fakeNode) Peers() []string             { return nil }
func (fakeNode) Authorize([]string, string, auth.Scope) (auth.Principal, error) {
	return auth.Open, nil
}

// tinyModel is small enough for -race: two layers, grouped-query attention,
// 16-token blocks, a byte-level vocabulary.
func tinyModel() prefill.Config {
	c := prefill.Config{Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96, Vocab: 260,
		MaxContext: 1024, BlockTokens: 16}
	c.EnsureDefaults()
	return c
}

// newTestEngine is the tiny model's engine over no cache.
func newTestEngine(t testing.TB) *prefill.Engine {
	t.Helper()
	e, err := prefill.New(nil, prefill.Options{Config: tinyModel(), Weights: prefill.SeededWeights(tinyModel(), 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// quietPebble drops pebble's log lines.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// testAPI is an API over the tiny model on a fake node, its batches in a
// pebble database of its own, served on loopback and started.
type testAPI struct {
	*API
	srv *httptest.Server
}

func startTestAPI(t *testing.T) *testAPI {
	t.Helper()
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	var batch BatchOptions
	batch.EnsureDefaults()
	a, err := New(fakeNode{}, Options{Engine: newTestEngine(t), Concurrency: 1, MaxWaiting: 4, Batch: batch, DB: db,
		DataDir: dir, Alone: true, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	a.Register(mux)
	ta := &testAPI{API: a, srv: httptest.NewServer(mux)}
	a.Start()
	t.Cleanup(func() {
		ta.srv.Close()
		a.Close()
		db.Close()
	})
	return ta
}

// TestQueueFailedRequest: a request that fails when it runs (here one
// whose stored body is no longer valid, as after a version change) is
// answered with an OpenAI error object in its place; the batch completes
// and its other requests are answered.
func TestQueueFailedRequest(t *testing.T) {
	a := startTestAPI(t)
	good := []byte(`t{"model": "kvmesh", "prompt": "still fine", "max_tokens": 3, "temperature": 0}`)
	m, err := a.batches.submit(queueOwner{}, [][]byte{good, []byte(`t{"model": `), good}, "")
	if err != nil {
		t.Fatal(err)
	}
	var (
		got   batchMeta
		resps []json.RawMessage
	)
	testkit.WaitFor(t, "the batch to finish", func() bool {
		got, resps, err = a.batches.get(m.ID, queueOwner{})
		return err != nil || got.finishedState()
	})
	if err != nil || got.State != batchCompleted || got.Failed != 1 || len(resps) != 3 {
		t.Fatalf("batch %+v, %d responses, %v; want completed, one failed, three responses", got, len(resps), err)
	}
	for i, r := range resps {
		var body struct {
			Choices []choiceJSON `json:"choices"`
			Error   *apiError    `json:"error"`
		}
		if err := json.Unmarshal(r, &body); err != nil {
			t.Fatalf("response %d: %s: %v", i, r, err)
		}
		if failed := i == 1; failed != (body.Error != nil) || (failed && (body.Error.Message == "" || body.Error.Type == "")) ||
			(!failed && (len(body.Choices) != 1 || body.Choices[0].Text == nil)) {
			t.Errorf("response %d: %s; want %s", i, r, map[bool]string{true: "an error object", false: "a completion"}[failed])
		}
	}
	var failed dto.Metric
	if err := a.batchMetrics.requests.WithLabelValues("failed").Write(&failed); err != nil || failed.GetCounter().GetValue() != 1 {
		t.Errorf("failed requests counted %v (%v), want 1", failed.GetCounter().GetValue(), err)
	}
}
