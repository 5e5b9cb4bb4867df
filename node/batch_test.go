package node

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/openai"
)

// queueNode is a node with the tiny model and tenants (tenantsFile) on
// dataDir, served on loopback until stop.
type queueNode struct {
	*Node
	stop func()
}

func startQueueNode(t *testing.T, dataDir string, mod func(*Options)) *queueNode {
	t.Helper()
	opts := Options{
		DataDir:  dataDir,
		Listen:   ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Tiers:    TierOptions{DRAMBytes: 64 * MiB, NVMeBytes: 64 * MiB},
		Logger:   slog.New(slog.DiscardHandler),
		Prefill:  PrefillOptions{Model: tinyModel()},
		Security: SecurityOptions{TokensFile: tenantsFile(t)},
	}
	if mod != nil {
		mod(&opts)
	}
	n, err := New(opts, newFakeCache(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx) }()
	stopped := false
	qn := &queueNode{Node: n}
	qn.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	t.Cleanup(qn.stop)
	return qn
}

// batchAnswer is GET /v1/queue/{id}'s body.
type batchAnswer struct {
	RequestID string            `json:"request_id"`
	Status    string            `json:"status"`
	Responses []json.RawMessage `json:"responses"`
}

func submitBatch(t *testing.T, n *Node, token string, body any) string {
	t.Helper()
	got := callAPI(t, "POST", apiURL(n, openai.QueuePath), token, body)
	var a batchAnswer
	if got.status != http.StatusAccepted || json.Unmarshal(got.body, &a) != nil || a.Status != "queued" || a.RequestID == "" {
		t.Fatalf("POST %s: %d %s; want 202 with a request_id, queued", openai.QueuePath, got.status, got.body)
	}
	return a.RequestID
}

func pollBatch(t *testing.T, n *Node, token, id string) batchAnswer {
	t.Helper()
	got := callAPI(t, "GET", apiURL(n, openai.QueuePath+"/"+id), token, nil)
	var a batchAnswer
	if got.status != http.StatusOK || json.Unmarshal(got.body, &a) != nil || a.RequestID != id {
		t.Fatalf("GET %s/%s: %d %s", openai.QueuePath, id, got.status, got.body)
	}
	return a
}

// waitBatch polls until the batch is no longer queued or running.
func waitBatch(t *testing.T, n *Node, token, id string) batchAnswer {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		a := pollBatch(t, n, token, id)
		if a.Status != "queued" && a.Status != "running" {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s after 60s", id, a.Status)
		}
		time.Sleep(10 * time.Millisecond) // polling, as a client does; nothing is timed
	}
}

// wantAPIError checks an OpenAI error object with status.
func wantAPIError(t *testing.T, what string, got apiCall, status int) {
	t.Helper()
	if got.status != status {
		t.Errorf("%s: %d %s, want %d", what, got.status, got.body, status)
		return
	}
	e, _ := got.json(t)["error"].(map[string]any)
	if e == nil || e["message"] == "" || e["type"] == "" {
		t.Errorf("%s: %s is not an OpenAI error object", what, got.body)
	}
}

// TestQueueCompletes: a batch of completions and chats submitted to
// /v1/queue completes with the answers the same requests get
// synchronously at temperature 0, with full usage; another tenant cannot
// see or cancel it.
func TestQueueCompletes(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), nil)
	reqs := []map[string]any{
		{"model": "kvmesh", "prompt": strings.Repeat("queued prompt one ", 12), "max_tokens": 12, "temperature": 0},
		{"model": "kvmesh", "messages": []map[string]any{{"role": "user", "content": "a queued chat"}}, "max_tokens": 10, "temperature": 0},
		{"model": "kvmesh", "prompt": strings.Repeat("queued prompt two ", 9), "max_tokens": 8, "temperature": 0, "stop": "zz"},
	}
	id := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": reqs})
	a := waitBatch(t, n.Node, "acme-rw", id)
	if a.Status != "completed" || len(a.Responses) != len(reqs) {
		t.Fatalf("batch answered %+v; want completed with %d responses", a, len(reqs))
	}
	for i, req := range reqs {
		chat := req["messages"] != nil
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		queued := parseCompletion(t, apiCall{status: 200, body: a.Responses[i]}, chat)
		sync := parseCompletion(t, callAPI(t, "POST", apiURL(n.Node, path), "acme-rw", req), chat)
		if queued.Text != sync.Text || queued.Finish != sync.Finish || queued.Prompt != sync.Prompt || queued.Compl != sync.Compl {
			t.Errorf("request %d: queued %+v, synchronous %+v", i, queued, sync)
		}
		var u struct {
			Object string
			Usage  struct {
				TotalTokens         *int `json:"total_tokens"`
				PromptTokensDetails struct {
					CachedTokens *int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		json.Unmarshal(a.Responses[i], &u)
		if u.Usage.TotalTokens == nil || u.Usage.PromptTokensDetails.CachedTokens == nil || (chat != (u.Object == "chat.completion")) {
			t.Errorf("request %d: %s lacks the full usage or the right object", i, a.Responses[i])
		}
	}

	// Another tenant: 404 like an unknown id, for GET and DELETE.
	wantAPIError(t, "beta polls acme's batch", callAPI(t, "GET", apiURL(n.Node, openai.QueuePath+"/"+id), "beta-rw", nil), 404)
	wantAPIError(t, "beta cancels acme's batch", callAPI(t, "DELETE", apiURL(n.Node, openai.QueuePath+"/"+id), "beta-rw", nil), 404)
	wantAPIError(t, "unknown id", callAPI(t, "GET", apiURL(n.Node, openai.QueuePath+"/batch_nope"), "acme-rw", nil), 404)
	wantAPIError(t, "cancel a completed batch", callAPI(t, "DELETE", apiURL(n.Node, openai.QueuePath+"/"+id), "acme-rw", nil), 409)
	wantAPIError(t, "no token", callAPI(t, "GET", apiURL(n.Node, openai.QueuePath+"/"+id), "", nil), 401)
	wantAPIError(t, "read-only submits", callAPI(t, "POST", apiURL(n.Node, openai.QueuePath), "acme-r", map[string]any{"requests": reqs}), 403)
	if again := pollBatch(t, n.Node, "acme-r", id); again.Status != "completed" {
		t.Errorf("acme's read-only token polls %+v", again)
	}
}

// TestQueueBadInputAndCancel: bad batches are refused with OpenAI's error
// object and the right status; a tenant over its queue quota gets 429 with
// Retry-After; a queued batch is cancelled; the node keeps serving.
func TestQueueBadInputAndCancel(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), func(o *Options) {
		o.Prefill.Batch = openai.BatchOptions{MaxRequests: 3, MaxBodyBytes: 4 << 10, TenantQueued: 3}
	})
	url := apiURL(n.Node, openai.QueuePath)
	ok := map[string]any{"model": "kvmesh", "prompt": "hello", "max_tokens": 2, "temperature": 0}
	for _, c := range []struct {
		name   string
		body   any
		status int
	}{
		{"malformed JSON", `{"requests": [`, 400},
		{"no requests", `{}`, 400},
		{"empty requests", `{"requests": []}`, 400},
		{"too many", map[string]any{"requests": []any{ok, ok, ok, ok}}, 413},
		{"body too big", map[string]any{"requests": []any{map[string]any{"model": "kvmesh", "prompt": strings.Repeat("x", 5<<10)}}}, 413},
		{"stream in a batch", map[string]any{"requests": []any{ok, map[string]any{"model": "kvmesh", "prompt": "hi", "stream": true}}}, 400},
		{"neither prompt nor messages", map[string]any{"requests": []any{map[string]any{"model": "kvmesh"}}}, 400},
		{"unknown model", map[string]any{"requests": []any{map[string]any{"model": "gpt-9", "prompt": "hi"}}}, 404},
		{"not an object", map[string]any{"requests": []any{"hi"}}, 400},
		{"callback", map[string]any{"requests": []any{ok}, "callback_url": "http://10.0.0.1/hook"}, 400},
	} {
		wantAPIError(t, c.name, callAPI(t, "POST", url, "acme-rw", c.body), c.status)
	}
	wantAPIError(t, "PUT /v1/queue", callAPI(t, "PUT", url, "acme-rw", nil), 405)

	// Keep the engine busy, as a synchronous request does: nothing queued
	// starts.
	release := n.prefill.engine.Hold()
	id := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{ok, ok, ok}})
	full := callAPI(t, "POST", url, "acme-rw", map[string]any{"requests": []any{ok}})
	wantAPIError(t, "over the tenant's quota", full, 429)
	if full.header.Get("Retry-After") == "" {
		t.Errorf("429 without Retry-After: %v", full.header)
	}
	other := submitBatch(t, n.Node, "beta-rw", map[string]any{"requests": []any{ok}}) // beta's quota is its own
	if a := pollBatch(t, n.Node, "acme-rw", id); a.Status != "queued" {
		t.Errorf("with the engine held, the batch is %s, want queued", a.Status)
	}
	var list openai.QueueList
	if got := callAPI(t, "GET", url, "acme-r", nil); got.status != 200 || json.Unmarshal(got.body, &list) != nil ||
		len(list.Data) != 1 || list.Data[0].RequestID != id || list.Data[0].Status != "queued" || list.Data[0].Requests != 3 {
		t.Errorf("acme's list: %d %s; want its one queued batch only", got.status, got.body)
	}
	got := callAPI(t, "DELETE", apiURL(n.Node, openai.QueuePath+"/"+id), "acme-rw", nil)
	if got.status != 200 || got.json(t)["status"] != "cancelled" {
		t.Errorf("DELETE a queued batch: %d %s", got.status, got.body)
	}
	a := pollBatch(t, n.Node, "acme-rw", id)
	if a.Status != "cancelled" {
		t.Errorf("cancelled batch polls %+v", a)
	}
	for i, r := range a.Responses {
		if !strings.Contains(string(r), `"cancelled"`) {
			t.Errorf("response %d of a cancelled batch: %s", i, r)
		}
	}
	release()
	// The quota is free again, and the node serves.
	id = submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{ok}})
	if a := waitBatch(t, n.Node, "acme-rw", id); a.Status != "completed" || len(a.Responses) != 1 {
		t.Errorf("after the cancel, a batch answers %+v", a)
	}
	if a := waitBatch(t, n.Node, "beta-rw", other); a.Status != "completed" {
		t.Errorf("beta's batch answers %+v", a)
	}
	body := scrape(t, n.HTTPAddr())
	for series, want := range map[string]float64{
		`kvmesh_queue_requests_total{outcome="cancelled"}`: 3, `kvmesh_queue_requests_total{outcome="completed"}`: 2,
		`kvmesh_queue_queued_requests`: 0, `kvmesh_queue_running_requests`: 0, `kvmesh_queue_wait_seconds_count`: 2,
	} {
		if got := metricValue(body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestQueueRestart: a node closed with a batch queued and another
// completed reopens on the same data dir and answers both as before; the
// queued one then completes.
func TestQueueRestart(t *testing.T) {
	dir := t.TempDir()
	n := startQueueNode(t, dir, nil)
	req := map[string]any{"model": "kvmesh", "prompt": strings.Repeat("durable ", 10), "max_tokens": 6, "temperature": 0}
	done := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{req}})
	before := waitBatch(t, n.Node, "acme-rw", done)
	n.prefill.engine.Hold() // released by the stop
	queued := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{req, req}})
	n.stop()

	n = startQueueNode(t, dir, nil)
	after := pollBatch(t, n.Node, "acme-rw", done)
	if after.Status != "completed" || len(after.Responses) != 1 || string(after.Responses[0]) != string(before.Responses[0]) {
		t.Errorf("completed batch after a restart: %+v, before %+v", after, before)
	}
	a := waitBatch(t, n.Node, "acme-rw", queued)
	if a.Status != "completed" || len(a.Responses) != 2 {
		t.Fatalf("queued batch after a restart: %+v", a)
	}
	first := parseCompletion(t, apiCall{status: 200, body: before.Responses[0]}, false)
	for i, r := range a.Responses {
		if got := parseCompletion(t, apiCall{status: 200, body: r}, false); got.Text != first.Text {
			t.Errorf("response %d after the restart %+v, want %+v", i, got, first)
		}
	}
	wantAPIError(t, "beta after the restart", callAPI(t, "GET", apiURL(n.Node, openai.QueuePath+"/"+queued), "beta-rw", nil), 404)
}

// TestQueueCallback: a batch with a callback_url on an allowed host is
// POSTed there once completed, signed with the tenant's key; a host not
// allowed is refused at submission.
func TestQueueCallback(t *testing.T) {
	got := make(chan *http.Request, 1)
	bodies := make(chan []byte, 1)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		select {
		case got <- r:
			bodies <- b
		default:
		}
	}))
	defer recv.Close()
	host := strings.TrimPrefix(recv.URL, "http://")
	n := startQueueNode(t, t.TempDir(), func(o *Options) { o.Prefill.Batch.CallbackAllow = []string{host} })
	ok := map[string]any{"model": "kvmesh", "prompt": "call me back", "max_tokens": 2, "temperature": 0}
	wantAPIError(t, "a host not allowed", callAPI(t, "POST", apiURL(n.Node, openai.QueuePath), "acme-rw",
		map[string]any{"requests": []any{ok}, "callback_url": "http://169.254.169.254/latest"}), 400)
	wantAPIError(t, "not http", callAPI(t, "POST", apiURL(n.Node, openai.QueuePath), "acme-rw",
		map[string]any{"requests": []any{ok}, "callback_url": "file:///etc/passwd"}), 400)

	id := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{ok}, "callback_url": recv.URL + "/hook"})
	var r *http.Request
	select {
	case r = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("no callback within 60s")
	}
	body := <-bodies
	var st batchAnswer
	if json.Unmarshal(body, &st) != nil || st.RequestID != id || st.Status != "completed" {
		t.Errorf("callback body %s", body)
	}
	k := callAPI(t, "GET", apiURL(n.Node, openai.QueuePath+"/callback-key"), "acme-rw", nil).json(t)["key"].(string)
	key, _ := hex.DecodeString(k)
	if r.URL.Path != "/hook" || r.Header.Get(openai.SignatureHeader) != openai.Sign(key, body) {
		t.Errorf("callback to %s signed %q; want %q", r.URL.Path, r.Header.Get(openai.SignatureHeader), openai.Sign(key, body))
	}
	other := callAPI(t, "GET", apiURL(n.Node, openai.QueuePath+"/callback-key"), "beta-rw", nil).json(t)["key"]
	if other == k {
		t.Error("two tenants have the same callback key")
	}
}

// TestQueueCallbackRestart: a callback not yet delivered when the node
// stops (its receiver refused the first attempt) is stored with the batch
// and delivered, signed, by the node reopened on the same data dir; once
// delivered it is forgotten, so a second restart sends nothing.
func TestQueueCallbackRestart(t *testing.T) {
	var accept atomic.Bool
	refused := make(chan struct{}, 1)
	got := make(chan []byte, 4)
	sigs := make(chan string, 4)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if !accept.Load() {
			select {
			case refused <- struct{}{}:
			default:
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		got <- b
		sigs <- r.Header.Get(openai.SignatureHeader)
	}))
	defer recv.Close()
	host := strings.TrimPrefix(recv.URL, "http://")
	allow := func(o *Options) { o.Prefill.Batch.CallbackAllow = []string{host} }
	dir := t.TempDir()
	n := startQueueNode(t, dir, allow)
	ok := map[string]any{"model": "kvmesh", "prompt": "call me back later", "max_tokens": 2, "temperature": 0}
	id := submitBatch(t, n.Node, "acme-rw", map[string]any{"requests": []any{ok}, "callback_url": recv.URL + "/hook"})
	select {
	case <-refused:
	case <-time.After(60 * time.Second):
		t.Fatal("no callback attempt within 60s")
	}
	n.stop() // during the backoff before the second attempt
	if len(got) != 0 {
		t.Fatal("a refused callback was counted as delivered")
	}

	accept.Store(true)
	n = startQueueNode(t, dir, allow)
	var body []byte
	select {
	case body = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("the stored callback was not delivered after the restart")
	}
	var st batchAnswer
	if json.Unmarshal(body, &st) != nil || st.RequestID != id || st.Status != "completed" {
		t.Errorf("callback body %s", body)
	}
	k := callAPI(t, "GET", apiURL(n.Node, openai.QueuePath+"/callback-key"), "acme-rw", nil).json(t)["key"].(string)
	key, _ := hex.DecodeString(k)
	if sig := <-sigs; sig != openai.Sign(key, body) {
		t.Errorf("callback after the restart signed %q, want %q", sig, openai.Sign(key, body))
	}
	// Forgotten once delivered: wait until the store says so, then a
	// second restart sends nothing.
	// The sender records it after the receiver's answer.
	testkit.WaitFor(t, "the delivered callback to be forgotten", func() bool {
		return metricValue(scrape(t, n.HTTPAddr()), "kvmesh_queue_callbacks_pending") == 0
	})
	n.stop()
	n = startQueueNode(t, dir, allow)
	if p := metricValue(scrape(t, n.HTTPAddr()), "kvmesh_queue_callbacks_pending"); p != 0 {
		t.Errorf("after a second restart %v callbacks are pending", p)
	}
	n.stop()
	if len(got) != 0 {
		t.Errorf("a delivered callback was sent again after a restart: %s", <-got)
	}
}
