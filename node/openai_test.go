package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/openai"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// apiCall is one HTTP exchange with a node's OpenAI-compatible API.
type apiCall struct {
	status int
	header http.Header
	body   []byte
}

func (c apiCall) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(c.body, &m); err != nil {
		t.Fatalf("answer %d is not JSON: %v: %q", c.status, err, c.body)
	}
	return m
}

// events returns the data of a stream's events, [DONE] included.
func (c apiCall) events(t testing.TB) []string {
	t.Helper()
	if ct := c.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("a stream answered %d with Content-Type %q: %q", c.status, ct, c.body)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(string(c.body), "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("event %q is not a data line", ev)
		}
		out = append(out, data)
	}
	return out
}

func callAPI(t testing.TB, method, url, token string, body any, header ...string) apiCall {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return apiCall{status: resp.StatusCode, header: resp.Header, body: b}
}

// completion is the part of an answer the tests compare.
type completion struct {
	Text                  string
	Finish                string
	Prompt, Cached, Compl int
}

func parseCompletion(t testing.TB, c apiCall, chat bool) completion {
	t.Helper()
	if c.status != http.StatusOK {
		t.Fatalf("status %d: %s", c.status, c.body)
	}
	var r struct {
		Object  string
		Choices []struct {
			Text         string
			Message      struct{ Role, Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			TotalTokens         int `json:"total_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
	}
	if err := json.Unmarshal(c.body, &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("answer %q: %v", c.body, err)
	}
	u := r.Usage
	if u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage %+v: total is not prompt + completion", u)
	}
	out := completion{Finish: r.Choices[0].FinishReason, Prompt: u.PromptTokens, Cached: u.PromptTokensDetails.CachedTokens, Compl: u.CompletionTokens}
	out.Text = r.Choices[0].Text
	if chat {
		out.Text = r.Choices[0].Message.Content
		if r.Object != "chat.completion" || r.Choices[0].Message.Role != "assistant" {
			t.Errorf("chat answer %q", c.body)
		}
	} else if r.Object != "text_completion" {
		t.Errorf("object %q", r.Object)
	}
	return out
}

// parseStream reassembles a streamed answer; usage comes from the
// include_usage chunk.
func parseStream(t testing.TB, c apiCall, chat bool) completion {
	t.Helper()
	evs := c.events(t)
	if evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("the stream does not end with [DONE]: %q", evs)
	}
	var out completion
	for i, ev := range evs[:len(evs)-1] {
		var ch struct {
			Object  string
			Choices []struct {
				Text         string
				Delta        struct{ Role, Content string }
				FinishReason *string `json:"finish_reason"`
			}
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		if err := json.Unmarshal([]byte(ev), &ch); err != nil {
			t.Fatalf("event %d %q: %v", i, ev, err)
		}
		if want := map[bool]string{true: "chat.completion.chunk", false: "text_completion"}[chat]; ch.Object != want {
			t.Errorf("event %d: object %q, want %q", i, ch.Object, want)
		}
		if ch.Usage != nil {
			out.Prompt, out.Cached, out.Compl = ch.Usage.PromptTokens, ch.Usage.PromptTokensDetails.CachedTokens, ch.Usage.CompletionTokens
			continue
		}
		if len(ch.Choices) != 1 {
			t.Fatalf("event %d has %d choices", i, len(ch.Choices))
		}
		if chat && i == 0 && ch.Choices[0].Delta.Role != "assistant" {
			t.Errorf("the first chat chunk names no role: %q", ev)
		}
		out.Text += ch.Choices[0].Text + ch.Choices[0].Delta.Content
		if f := ch.Choices[0].FinishReason; f != nil {
			out.Finish = *f
		}
	}
	return out
}

func apiURL(n *Node, path string) string { return "http://" + n.HTTPAddr() + path }

// coldText is what a cold engine of the node's model generates for prompt,
// as the API renders it.
func coldText(t testing.TB, c prefill.Config, prompt string, o prefill.GenerateOptions) string {
	t.Helper()
	e, err := prefill.New(nil, prefill.Options{Config: c, Weights: seededWeights(c, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	g, err := e.Generate(context.Background(), prefill.TokenizeBytes(prompt), o)
	if err != nil {
		t.Fatal(err)
	}
	return string([]rune(string(tokenizer.Bytes{}.Decode(g.Tokens)))) // an invalid byte is U+FFFD, as the API renders it
}

func longText(r *rand.Rand, n int) string {
	const words = "the of cache block prefix token node store decode attention key value "
	var b strings.Builder
	for b.Len() < n {
		i := r.IntN(len(words) - 8)
		b.WriteString(words[i : i+1+r.IntN(7)])
	}
	return b.String()[:n]
}

// TestOpenAICompletions drives one node's API as a client would: the model
// list, completions and chat, whole and streamed; a repeated prompt reports
// its cached tokens and generates the same text; the text equals a cold
// engine's; the session hint is echoed.
func TestOpenAICompletions(t *testing.T) {
	pn := startPrefillNode(t, "", nil, nil, nil)
	c := tinyModel()
	models := callAPI(t, "GET", apiURL(pn.Node, "/v1/models"), "", nil).json(t)
	data, _ := models["data"].([]any)
	if len(data) != 1 || data[0].(map[string]any)["id"] != pn.ns.Model {
		t.Fatalf("/v1/models = %v, want the engine's model %q", models, pn.ns.Model)
	}
	if got := callAPI(t, "GET", apiURL(pn.Node, "/v1/models/kvmesh"), "", nil); got.status != 200 {
		t.Errorf("/v1/models/kvmesh: %d %s", got.status, got.body)
	}

	prompt := longText(rand.New(rand.NewPCG(1, 2)), 300)
	req := map[string]any{"model": openai.ModelAlias, "prompt": prompt, "max_tokens": 24, "temperature": 0}
	want := coldText(t, c, prompt, prefill.GenerateOptions{MaxTokens: 24})
	first := parseCompletion(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", req), false)
	if first.Text != want || first.Finish != "length" || first.Prompt != 300 || first.Compl != 24 || first.Cached != 0 {
		t.Errorf("first completion %+v, want text %q, length, 300 prompt, 24 completion, 0 cached", first, want)
	}
	pn.waitCached(t, prefill.TokenizeBytes(prompt))
	again := callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", req, SessionHeader, "conv-1")
	second := parseCompletion(t, again, false)
	if second.Text != want || second.Cached < 300/c.BlockTokens*c.BlockTokens {
		t.Errorf("second completion %+v: want the same text and at least %d cached tokens", second, 300/c.BlockTokens*c.BlockTokens)
	}
	if again.header.Get(SessionHeader) != "conv-1" || again.header.Get("X-Kvmesh-Cached-Tokens") != fmt.Sprint(second.Cached) {
		t.Errorf("headers %v: want the session echoed and the cached tokens", again.header)
	}

	req["stream"], req["stream_options"] = true, map[string]any{"include_usage": true}
	streamed := parseStream(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", req), false)
	if streamed.Text != want || streamed.Finish != "length" || streamed.Cached != second.Cached || streamed.Compl != 24 {
		t.Errorf("streamed completion %+v, want %+v", streamed, second)
	}

	// Chat: the template, a stop sequence, whole and streamed agree.
	chatReq := map[string]any{"model": pn.ns.Model, "max_tokens": 40, "temperature": 0.8, "seed": 7,
		"messages": []map[string]any{{"role": "system", "content": prompt}, {"role": "user", "content": []map[string]any{{"type": "text", "text": "hi"}}}}}
	tmpl := "<|system|>\n" + prompt + "\n<|user|>\nhi\n<|assistant|>\n"
	wantChat := coldText(t, c, tmpl, prefill.GenerateOptions{MaxTokens: 40, Temperature: 0.8, Seed: 7})
	chat := parseCompletion(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/chat/completions"), "", chatReq), true)
	if chat.Text != wantChat || chat.Prompt != len(tmpl) || chat.Cached != 0 {
		t.Errorf("chat %+v, want text %q, %d prompt tokens, none cached", chat, wantChat, len(tmpl))
	}
	chatReq["stream"] = true
	chatStream := parseStream(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/chat/completions"), "", chatReq), true)
	if chatStream.Text != wantChat || chatStream.Finish != "length" {
		t.Errorf("streamed chat %+v, want %q", chatStream, wantChat)
	}
	// Stop on two printable ASCII bytes of the answer (bytes of a rune
	// that is not valid UTF-8 show as U+FFFD in the text).
	ascii := func(b byte) bool { return b >= 0x20 && b < 0x7f }
	at := 1
	for at+1 < len(wantChat) && !(ascii(wantChat[at]) && ascii(wantChat[at+1])) {
		at++
	}
	if at+1 < len(wantChat) {
		stop := wantChat[at : at+2]
		chatReq["stop"] = []string{stop}
		cut := wantChat[:strings.Index(wantChat, stop)]
		whole := parseCompletion(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/chat/completions"), "", map[string]any{
			"model": "kvmesh", "max_tokens": 40, "temperature": 0.8, "seed": 7, "stop": stop, "messages": chatReq["messages"]}), true)
		st := parseStream(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/chat/completions"), "", chatReq), true)
		if whole.Text != cut || whole.Finish != "stop" || st.Text != cut || st.Finish != "stop" {
			t.Errorf("stop %q: whole %+v, streamed %+v; want %q, stop", stop, whole, st, cut)
		}
	}
}

// TestOpenAIBadInput: every bad request gets OpenAI's error object with a
// 4xx status, never a 500 or a hang, and the node keeps serving.
func TestOpenAIBadInput(t *testing.T) {
	pn := startPrefillNode(t, "", nil, nil, nil)
	comp, chat := apiURL(pn.Node, "/v1/completions"), apiURL(pn.Node, "/v1/chat/completions")
	msgs := []map[string]string{{"role": "user", "content": "hi"}}
	for _, c := range []struct {
		name         string
		method, url  string
		body         any
		status       int
		param, code  string
		errorMessage string
	}{
		{name: "malformed JSON", url: comp, body: `{"model": "kvmesh", "prompt": "x"`, status: 400},
		{name: "not an object", url: comp, body: `[1, 2]`, status: 400},
		{name: "trailing data", url: comp, body: `{"model": "kvmesh", "prompt": "x"} {}`, status: 400},
		{name: "empty body", url: comp, body: ``, status: 400},
		{name: "missing model", url: comp, body: map[string]any{"prompt": "x"}, status: 400, param: "model"},
		{name: "unknown model", url: comp, body: map[string]any{"model": "gpt-4o", "prompt": "x"}, status: 404, param: "model", code: "model_not_found"},
		{name: "missing prompt", url: comp, body: map[string]any{"model": "kvmesh"}, status: 400, param: "prompt"},
		{name: "empty prompt", url: comp, body: map[string]any{"model": "kvmesh", "prompt": ""}, status: 400, param: "prompt"},
		{name: "prompt a number", url: comp, body: map[string]any{"model": "kvmesh", "prompt": 12}, status: 400, param: "prompt"},
		{name: "two prompts", url: comp, body: map[string]any{"model": "kvmesh", "prompt": []string{"a", "b"}}, status: 400, param: "prompt"},
		{name: "token outside the vocabulary", url: comp, body: map[string]any{"model": "kvmesh", "prompt": []int{1, 99999}}, status: 400, param: "prompt"},
		{name: "max_tokens a string", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "max_tokens": "ten"}, status: 400, param: "max_tokens"},
		{name: "max_tokens 0", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "max_tokens": 0}, status: 400, param: "max_tokens"},
		{name: "huge max_tokens", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "max_tokens": 1 << 40}, status: 400, param: "max_tokens", code: "context_length_exceeded"},
		{name: "max_tokens past int", url: comp, body: `{"model": "kvmesh", "prompt": "x", "max_tokens": 1e300}`, status: 400, param: "max_tokens"},
		{name: "temperature a string", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "temperature": "hot"}, status: 400, param: "temperature"},
		{name: "temperature 3", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "temperature": 3}, status: 400, param: "temperature"},
		{name: "top_p 0", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "top_p": 0}, status: 400, param: "top_p"},
		{name: "n 2", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "n": 2}, status: 400, param: "n"},
		{name: "stream a string", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "stream": "yes"}, status: 400, param: "stream"},
		{name: "five stops", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "stop": []string{"a", "b", "c", "d", "e"}}, status: 400, param: "stop"},
		{name: "empty stop", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "stop": ""}, status: 400, param: "stop"},
		{name: "stop a number", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x", "stop": 3}, status: 400, param: "stop"},
		{name: "missing messages", url: chat, body: map[string]any{"model": "kvmesh"}, status: 400, param: "messages"},
		{name: "messages a string", url: chat, body: map[string]any{"model": "kvmesh", "messages": "hi"}, status: 400, param: "messages"},
		{name: "no messages", url: chat, body: map[string]any{"model": "kvmesh", "messages": []any{}}, status: 400, param: "messages"},
		{name: "bad role", url: chat, body: map[string]any{"model": "kvmesh", "messages": []map[string]string{{"role": "wizard", "content": "x"}}}, status: 400, param: "messages[0].role"},
		{name: "image part", url: chat, body: map[string]any{"model": "kvmesh", "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url"}}}}}, status: 400, param: "messages[0].content"},
		{name: "max_completion_tokens a bool", url: chat, body: map[string]any{"model": "kvmesh", "messages": msgs, "max_completion_tokens": true}, status: 400, param: "max_completion_tokens"},
		{name: "chat past the context", url: chat, body: map[string]any{"model": "kvmesh", "messages": []map[string]string{{"role": "user", "content": strings.Repeat("x", 2000)}}}, status: 400, param: "messages", code: "context_length_exceeded"},
		{name: "body over the limit", url: comp, body: `{"model": "kvmesh", "prompt": "` + strings.Repeat("x", openai.MaxBodyBytes) + `"}`, status: 413, code: "request_too_large"},
		{name: "GET on completions", method: "GET", url: comp, status: 405},
		{name: "unknown path", url: apiURL(pn.Node, "/v1/embeddings"), body: map[string]any{}, status: 404},
		{name: "unknown model path", method: "GET", url: apiURL(pn.Node, "/v1/models/gpt-4o"), status: 404, code: "model_not_found"},
		{name: "session too long", url: comp, body: map[string]any{"model": "kvmesh", "prompt": "x"}, status: 400, param: SessionHeader},
	} {
		method := c.method
		if method == "" {
			method = "POST"
		}
		var hdr []string
		if c.name == "session too long" {
			hdr = []string{SessionHeader, strings.Repeat("s", openai.MaxSessionBytes+1)}
		}
		got := callAPI(t, method, c.url, "", c.body, hdr...)
		var e struct {
			Error struct {
				Message, Type string
				Param, Code   *string
			}
		}
		if err := json.Unmarshal(got.body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s: %d %q is not an OpenAI error object", c.name, got.status, got.body)
			continue
		}
		if got.status != c.status {
			t.Errorf("%s: status %d (%s), want %d", c.name, got.status, e.Error.Message, c.status)
		}
		if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
			t.Errorf("%s: param %v (%s), want %q", c.name, e.Error.Param, e.Error.Message, c.param)
		}
		if c.code != "" && (e.Error.Code == nil || *e.Error.Code != c.code) {
			t.Errorf("%s: code %v, want %q", c.name, e.Error.Code, c.code)
		}
	}
	ok := callAPI(t, "POST", comp, "", map[string]any{"model": "kvmesh", "prompt": "still serving", "max_tokens": 2})
	parseCompletion(t, ok, false)
}

// TestOpenAIAuth: the HTTP API takes the gRPC API's bearer tokens and
// scopes: none or an unknown one is 401, a read-only token may list models
// but not complete (403), a read-write tenant token completes in its own
// namespace.
func TestOpenAIAuth(t *testing.T) {
	n, err := New(Options{
		DataDir:  t.TempDir(),
		Listen:   ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Tiers:    TierOptions{DRAMBytes: 64 * MiB, NVMeBytes: 64 * MiB},
		Logger:   slog.New(slog.DiscardHandler),
		Prefill:  PrefillOptions{Model: tinyModel()},
		Security: SecurityOptions{TokensFile: tenantsFile(t)},
	}, newFakeCache(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	pn := struct{ Node *Node }{n}
	comp := apiURL(pn.Node, "/v1/completions")
	req := map[string]any{"model": "kvmesh", "prompt": strings.Repeat("tenant prompt ", 5), "max_tokens": 3}
	for _, c := range []struct {
		name, token, method, url string
		status                   int
		msg                      string // what the error says, in HTTP's terms
	}{
		{"no token", "", "POST", comp, 401, `send the header "Authorization: Bearer <token>" (OpenAI SDKs: api_key=<token>`},
		{"unknown token", "nope", "POST", comp, 401, `the API key (the "Authorization: Bearer" token) is not accepted`},
		{"models without a token", "", "GET", apiURL(pn.Node, "/v1/models"), 401, "this node requires an API key"},
		{"read-only completes", "acme-r", "POST", comp, 403, ""},
		{"read-only lists", "acme-r", "GET", apiURL(pn.Node, "/v1/models"), 200, ""},
		{"read-write completes", "acme-rw", "POST", comp, 200, ""},
	} {
		body := any(req)
		if c.method == "GET" {
			body = nil
		}
		got := callAPI(t, c.method, c.url, c.token, body)
		if got.status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, got.status, got.body, c.status)
		}
		if c.status >= 400 {
			e, _ := got.json(t)["error"].(map[string]any)
			msg, _ := e["message"].(string)
			if e == nil || msg == "" || !strings.Contains(msg, c.msg) || strings.Contains(msg, "metadata") {
				t.Errorf("%s: %s; want an error object saying %q, in HTTP's terms", c.name, got.body, c.msg)
			}
		}
	}
	// Tenants do not share prefixes: beta repeats acme's prompt cold.
	pn.Node.prefill.engine.Flush(context.Background())
	again := parseCompletion(t, callAPI(t, "POST", comp, "acme-rw", req), false)
	other := parseCompletion(t, callAPI(t, "POST", comp, "beta-rw", req), false)
	if again.Cached == 0 || other.Cached != 0 {
		t.Errorf("acme's repeat found %d cached tokens (want > 0), beta's first %d (want 0)", again.Cached, other.Cached)
	}
}

// TestOpenAITooManyRequests: with the engine busy and MaxWaiting requests
// waiting, one more is answered 429 with Retry-After.
func TestOpenAITooManyRequests(t *testing.T) {
	cache, hold, entered := gatedCache()
	pn := startPrefillNode(t, "", cache, func(o *Options) { o.Prefill.MaxWaiting = 1; o.ShutdownTimeout = time.Millisecond }, nil)
	c := tinyModel()
	blocker := randPrompt(rand.New(rand.NewPCG(5, 5)), 2*c.BlockTokens, c.Vocab)
	pn.run(t, blocker, "")
	pn.waitCached(t, blocker)
	holdEngine(t, pn, hold, entered, blocker)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 { // they wait for the engine until the test ends
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", apiURL(pn.Node, "/v1/completions"),
				strings.NewReader(`{"model": "kvmesh", "prompt": "wait", "max_tokens": 1}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	testkit.WaitFor(t, "two requests admitted", func() bool {
		return metricValue(scrape(t, pn.HTTPAddr()), "kvmesh_openai_admitted_requests") == 2
	})
	got := callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", map[string]any{"model": "kvmesh", "prompt": "x"})
	if got.status != 429 || got.header.Get("Retry-After") == "" {
		t.Errorf("a request past the limit: %d %s (Retry-After %q), want 429 with Retry-After", got.status, got.body, got.header.Get("Retry-After"))
	}
	cancel()
}

// TestOpenAIGenerateAcrossTheCluster: the generated text is the cold
// engine's whether the prompt's prefix was computed on the node, on
// another member (fetched over the data plane), or read back from NVMe.
func TestOpenAIGenerateAcrossTheCluster(t *testing.T) {
	c := tinyModel()
	blk := int64(block.EncodedLen(c.BlockTokens, c.Namespace(0, "").BlockBytes()))
	nodes := startClusterNodes(t, 2, func(i int, o *Options) { o.Prefill.Model = c })
	r := rand.New(rand.NewPCG(9, 9))
	for i, o := range []map[string]any{
		{"temperature": 0},
		{"temperature": 1.2, "top_p": 0.9, "seed": 42},
	} {
		prompt := longText(r, 200+r.IntN(200))
		req := map[string]any{"model": "kvmesh", "prompt": prompt[:len(prompt)*2/3], "max_tokens": 20}
		for k, v := range o {
			req[k] = v
		}
		gopts := prefill.GenerateOptions{MaxTokens: 20}
		if i == 1 {
			gopts.Temperature, gopts.TopP, gopts.Seed = 1.2, 0.9, 42
		}
		parseCompletion(t, callAPI(t, "POST", apiURL(nodes[0].Node, "/v1/completions"), "", req), false)
		if err := nodes[0].Node.prefill.engine.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		hit := len(prompt) * 2 / 3 / c.BlockTokens * c.BlockTokens
		ns := nodes[0].Node.prefill.engine.Namespace()
		testkit.WaitFor(t, "node 1 to see node 0's prefix", func() bool {
			l, err := nodes[1].client.Lookup(context.Background(), ns, client.Prompt{Tokens: prefill.TokenizeBytes(prompt)})
			return err == nil && l.CachedTokens >= hit
		})
		req["prompt"] = prompt
		got := parseCompletion(t, callAPI(t, "POST", apiURL(nodes[1].Node, "/v1/completions"), "", req), false)
		if want := coldText(t, c, prompt, gopts); got.Text != want || got.Cached < hit {
			t.Errorf("case %d on the other node: %+v, want text %q and at least %d cached", i, got, want, hit)
		}
	}

	// NVMe: a node whose DRAM quota holds one block keeps the rest on NVMe.
	nv := openClusterNode(t, t.TempDir(), "nvme", nil, func(o *Options) {
		o.Prefill.Model = c
		o.Tiers.QuotaDRAMBytes = blk
	})
	prompt := longText(r, 500)
	req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 20, "temperature": 0}
	first := parseCompletion(t, callAPI(t, "POST", apiURL(nv.Node, "/v1/completions"), "", req), false)
	if err := nv.Node.prefill.engine.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var onNVMe int64
	for _, ts := range nv.cache.Stats().Tiers {
		if ts.Name == "nvme" {
			onNVMe = ts.Blocks
		}
	}
	if onNVMe < int64(len(prompt)/c.BlockTokens)-1 {
		t.Fatalf("%d blocks on NVMe, want the prompt's but one", onNVMe)
	}
	second := parseCompletion(t, callAPI(t, "POST", apiURL(nv.Node, "/v1/completions"), "", req), false)
	want := coldText(t, c, prompt, prefill.GenerateOptions{MaxTokens: 20})
	if first.Text != want || second.Text != want || second.Cached < len(prompt)/c.BlockTokens*c.BlockTokens {
		t.Errorf("NVMe: first %+v, second %+v; want text %q and the prompt cached the second time", first, second, want)
	}
}
