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
func (fakeNode) Flush(context.Context) error          { return nil }
func (fakeNode) Peers() []Peer                        { return nil }
func (fakeNode) Vouch(auth.Principal, string) string  { return "" }
func (fakeNode) Tenant(string) (auth.Principal, bool) { return auth.Principal{}, false }
func (fakeNode) Vouched(string, string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrVouch
}
func (fakeNode) Lenders() []Lender    { return nil }
func (fakeNode) AdvertiseBacklog(int) {}
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
	return startTestAPIOn(t, fakeNode{}, BatchOptions{})
}

// startTestAPIOn is startTestAPI on node n with batch options batch
// (defaults filled in); alone unless n is not a fakeNode.
func startTestAPIOn(t *testing.T, n Node, batch BatchOptions) *testAPI {
	t.Helper()
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	batch.EnsureDefaults()
	_, alone := n.(fakeNode)
	a, err := New(n, Options{Engine: newTestEngine(t), Concurrency: 1, MaxWaiting: 4, Batch: batch, DB: db,
		DataDir: dir, Alone: alone, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
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

// TestRoutes: each route answers its method; a known path asked with
// another is 405 with Allow, an unknown path 404, both as OpenAI's error
// object; every answer is counted under its route's label.
func TestRoutes(t *testing.T) {
	a := startTestAPI(t)
	for _, c := range []struct {
		method, path string
		status       int
		code, allow  string // the error object's code; the Allow header
	}{
		{"GET", "/v1/models", 200, "", ""},
		{"GET", "/v1/models/kvmesh", 200, "", ""},
		{"GET", "/v1/models/nope", 404, "model_not_found", ""},
		{"GET", "/v1/models/a/b", 404, "model_not_found", ""},
		{"POST", "/v1/models", 405, "method_not_allowed", "GET"},
		{"GET", "/v1/completions", 405, "method_not_allowed", "POST"},
		{"DELETE", "/v1/chat/completions", 405, "method_not_allowed", "POST"},
		{"GET", LookupPath + "/completions", 405, "method_not_allowed", "POST"},
		{"POST", LookupPath + "/other", 404, "unknown_url", ""},
		{"PUT", QueuePath, 405, "method_not_allowed", "GET, POST"},
		{"GET", QueuePath, 200, "", ""},
		{"GET", QueuePath + "/callback-key", 200, "", ""},
		{"POST", QueuePath + "/callback-key", 405, "method_not_allowed", "GET, DELETE"},
		{"GET", QueuePath + "/batch_nope", 404, "not_found", ""},
		{"DELETE", QueuePath + "/batch_nope", 404, "not_found", ""},
		{"GET", "/v1/nothing", 404, "unknown_url", ""},
		{"POST", internalQueuePath + "nope", 400, "", ""}, // the caller is checked first: no node named
	} {
		req, err := http.NewRequest(c.method, a.srv.URL+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		switch {
		case resp.StatusCode != c.status || err != nil:
			t.Errorf("%s %s: %d (%v), want %d", c.method, c.path, resp.StatusCode, err, c.status)
		case c.code != "" && (body.Error == nil || body.Error.Code != c.code):
			t.Errorf("%s %s: error %+v, want code %q", c.method, c.path, body.Error, c.code)
		case resp.Header.Get("Allow") != c.allow:
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, resp.Header.Get("Allow"), c.allow)
		}
	}
	for label, want := range map[string]float64{"/v1/models/{id}": 3, "/v1/models": 2, QueuePath + "/{id}": 4, "other": 1, LookupPath: 2} {
		n := 0.0
		for _, code := range []string{"200", "404", "405"} {
			var m dto.Metric
			a.metrics.requests.WithLabelValues(label, code).Write(&m)
			n += m.GetCounter().GetValue()
		}
		if n != want {
			t.Errorf("requests counted under %q: %v, want %v", label, n, want)
		}
	}
}
