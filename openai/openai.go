package openai

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// The OpenAI-compatible HTTP API, on the node's HTTP address beside
// /metrics and /healthz (the node mounts it: Register):
//
//	GET  /v1/models               the engine's model
//	GET  /v1/models/{id}
//	POST /v1/completions          prompt: a string, [string], [token ids] or [[token ids]]
//	POST /v1/chat/completions     messages through ChatTemplate
//
// Both completions are answered whole or streamed as server-sent events
// ("stream": true; "stream_options": {"include_usage": true} adds a last
// chunk with usage), and report usage with
// prompt_tokens_details.cached_tokens: the prompt positions whose K/V came
// from the cluster's cache instead of being computed. Text is tokenized byte
// by byte (UTF-8 bytes as token ids) and generated tokens are read back the
// same way (a byte that is not valid UTF-8 becomes U+FFFD; ids above 255,
// which a byte-level model never needs, are not text and are dropped). stop
// sequences match tokens, so here bytes. The model answers to its engine
// id (the namespace's model, listed by /v1/models) and to ModelAlias.
//
// Authentication is the gRPC API's: "Authorization: Bearer <token>" with a
// token of the node's tokens or tokens file; completions need the write
// scope (they publish the blocks they compute), the model list read. A
// tenant's prompts run in its own namespace. The x-session-affinity header
// is a hint: logged, counted and echoed in the response, never used for a
// lookup. Errors are OpenAI's error object with 400 (bad request), 401 (no
// or unknown token), 403 (scope), 404 (unknown model or path), 405, 413
// (body over MaxBodyBytes), 429 (more than Options.MaxWaiting requests
// waiting for the engine; Retry-After says when to retry) and 503 (no engine,
// or shutting down).

// LookupPath is kvmesh's own endpoint beside the OpenAI ones, for routers:
// POST LookupPath+"/completions" or LookupPath+"/chat/completions" with a
// completion request's body checks it as the completion would (the same
// errors) and answers, without computing anything, {"prompt_tokens": N,
// "cached_tokens": M, "max_tokens": K}: how long the prompt is, how much of
// it the cluster's cache holds now for the caller (one Lookup), and how many
// tokens it may generate. It needs the read scope.
const LookupPath = "/v1/kvmesh/lookup"

// PublishHeader, set to "wait" on a completion that is not streamed,
// makes the node answer only once the prompt's new blocks are handed to the
// cache, so that the next node asked for the prompt finds them (a router's
// prefill step).
const PublishHeader = "X-Kvmesh-Publish"

// ModelAlias is the model name the node answers to besides its engine's id.
const ModelAlias = "kvmesh"

// ChatTemplate is how chat messages become a prompt: each message is
// "<|ROLE|>\n" + content + "\n", in order, and the prompt ends with
// "<|assistant|>\n", where the answer starts. Roles are system, developer,
// user, assistant and tool. A model directory's own chat template
// (tokenizer.Dir) replaces it.
const ChatTemplate = "<|{role}|>\n{content}\n ... <|assistant|>\n"

// Limits of the HTTP API.
const (
	// MaxBodyBytes bounds a request body; past it, 413.
	MaxBodyBytes = 4 << 20
	// DefaultCompletionTokens is max_tokens when a completion request
	// has none (OpenAI's default for /v1/completions); chat requests
	// default to DefaultChatTokens.
	DefaultCompletionTokens = 16
	DefaultChatTokens       = 256
	// maxAPIStops is the most stop sequences a request may give (OpenAI's 4).
	maxAPIStops = 4
	// writeTimeout bounds one write to a client: a reader that
	// stalls longer loses its stream rather than hold the engine.
	writeTimeout = 30 * time.Second
)

// metrics are the completions' metrics.
type metrics struct {
	requests *prometheus.CounterVec // path, code
	hints    prometheus.Counter
	tokens   *prometheus.CounterVec // kind: prompt, cached, completion
	ttft     prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, admit chan struct{}) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_openai_requests_total",
			Help: "Requests to the OpenAI-compatible HTTP API, by path and HTTP status.",
		}, []string{"path", "code"}),
		hints: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_openai_session_hints_total",
			Help: "Completions that carried an x-session-affinity header; a hint only, hits never depend on it.",
		}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_openai_tokens_total",
			Help: "Tokens of the completions answered, by kind: prompt, cached (prompt tokens from the cache) and completion.",
		}, []string{"kind"}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvmesh_openai_ttft_seconds",
			Help:    "Time from a completion request's arrival to its first generated token.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
	}
	reg.MustRegister(m.requests, m.hints, m.tokens, m.ttft,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvmesh_openai_admitted_requests",
			Help: "Completions running on the engine or waiting for it (at most Concurrency + MaxWaiting; one more is answered 429).",
		}, func() float64 { return float64(len(admit)) }))
	return m
}

// endsOfTurn returns the token sequences that end every answer: the
// model's EOS ids, and <|im_end|> when tok renders chats as ChatML (it has
// <|im_start|> and <|im_end|>), which chatML reports.
func endsOfTurn(tok tokenizer.Tokenizer, eos []uint32) (ends [][]uint32, chatML bool) {
	ids := slices.Clone(eos)
	_, start := tok.Special("<|im_start|>")
	if end, ok := tok.Special("<|im_end|>"); start && ok {
		chatML = true
		ids = append(ids, end)
	}
	slices.Sort(ids)
	for _, id := range slices.Compact(ids)[:min(len(slices.Compact(ids)), prefill.MaxStops-maxAPIStops)] {
		ends = append(ends, []uint32{id})
	}
	return ends, chatML
}

func (o *API) complete(w http.ResponseWriter, r *http.Request, chat bool, who auth.Principal) error {
	began := time.Now()
	j, err := o.parse(w, r, chat)
	if err != nil {
		return err
	}
	release, err := o.admitted()
	if err != nil {
		return err
	}
	defer release()
	if j.session != "" {
		o.metrics.hints.Inc()
		w.Header().Set(SessionHeader, j.session)
	}
	w.Header().Set("X-Kvmesh-Node", o.n.ID())
	// Queued work stays off the cores for the whole request.
	defer o.engine.Hold()()
	ctx := ownerOf(who).context(r.Context())

	resp := responseJSON{ID: newID("cmpl-"), Object: "text_completion", Created: began.Unix(), Model: o.model, SystemFingerprint: o.fingerprint()}
	if chat {
		resp.ID, resp.Object = newID("chatcmpl-"), "chat.completion"
	}
	var (
		sse *sseWriter
		dec textDecoder
	)
	if j.stream {
		if chat {
			resp.Object = "chat.completion.chunk"
		}
		sse = &sseWriter{w: w, rc: http.NewResponseController(w)}
		j.opts.Emit = o.emitter(sse, resp, chat, &dec)
	}
	serving := o.n.Foreground() // pushes to owners wait for the generation (not for the publishing below)
	g, err := o.engine.Generate(ctx, j.prompt, j.opts)
	serving()
	if err != nil {
		return o.generateError(r, j, sse, err)
	}
	o.account(r.URL.Path, j, g, began)
	if sse == nil {
		if r.Header.Get(PublishHeader) == "wait" {
			o.waitPublished(ctx)
		}
		o.answerWhole(w, resp, chat, dec.text(o.tok.Decode(g.Tokens), true), g)
		return nil
	}
	o.finishStream(sse, resp, chat, dec.text(nil, true), g, j.usage)
	return nil
}

// admitted admits a completion to run or wait for the engine, at most
// Concurrency + MaxWaiting at once (429 past them); release ends it.
func (o *API) admitted() (release func(), _ error) {
	select {
	case o.admit <- struct{}{}:
		return func() { <-o.admit }, nil
	default:
		e := newHTTPError(http.StatusTooManyRequests, "", "rate_limit_exceeded", "%d requests are already running or waiting for this node's engine; retry shortly, or on another node", cap(o.admit))
		e.retryAfter = 1
		return nil, e
	}
}

// emitter streams the generated tokens as events of resp: the first
// starts the stream (and, for a chat, names the role), then each piece of
// text as soon as dec completes it.
func (o *API) emitter(sse *sseWriter, resp responseJSON, chat bool, dec *textDecoder) func([]uint32) error {
	return func(tokens []uint32) error {
		if !sse.started {
			if err := sse.start(); err != nil {
				return err
			}
			if chat { // the first chunk names the role
				if err := sse.event(o.chunk(resp, chat, "", true, nil)); err != nil {
					return err
				}
			}
		}
		if text := dec.text(o.tok.Decode(tokens), false); text != "" {
			return sse.event(o.chunk(resp, chat, text, false, nil))
		}
		return nil
	}
}

// generateError answers a generation that failed: a client that left is
// no error, an error after the stream started is sent in it.
func (o *API) generateError(r *http.Request, j *job, sse *sseWriter, err error) error {
	var he *httpError
	switch {
	case errors.Is(err, prefill.ErrInvalidInput):
		he = badRequest("", "%s", strings.TrimPrefix(err.Error(), prefill.ErrInvalidInput.Error()+": "))
	case errors.Is(err, prefill.ErrClosed):
		he = newHTTPError(http.StatusServiceUnavailable, "", "", "the node is shutting down; retry on another node")
	case r.Context().Err() != nil, sse != nil && sse.err != nil:
		o.log.Info("openai: the client left", "path", clip(r.URL.Path), "session", j.session, "err", err)
		return nil
	default:
		return err
	}
	if sse != nil && sse.started {
		sse.event(struct {
			Error apiError `json:"error"`
		}{he.apiError})
	}
	return he
}

// waitPublished waits until the prompt's blocks are where the next node
// looks for them (PublishHeader): the engine hands them to the cache,
// which keeps them here and pushes them to their owners. Bounded: a miss
// only costs the next node compute.
func (o *API) waitPublished(ctx context.Context) {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := o.engine.Flush(fctx)
	if err == nil {
		err = o.n.Flush(fctx)
	}
	if err != nil {
		o.log.Info("openai: the prompt's blocks are not all published yet", "err", err)
	}
}

// answerWhole answers a completion not streamed, with kvmesh's timing
// headers.
func (o *API) answerWhole(w http.ResponseWriter, resp responseJSON, chat bool, text string, g prefill.Generation) {
	h := w.Header()
	h.Set("X-Kvmesh-Cached-Tokens", strconv.Itoa(g.Usage.CachedTokens))
	h.Set("X-Kvmesh-Prefill-Ms", strconv.FormatFloat(ms(g.Prefill), 'f', 3, 64))
	h.Set("X-Kvmesh-Ttft-Ms", strconv.FormatFloat(ms(g.TTFT), 'f', 3, 64))
	h.Set("X-Kvmesh-Decode-Ms", strconv.FormatFloat(ms(g.Decode), 'f', 3, 64))
	if g.Speculative != "" {
		h.Set("X-Kvmesh-Speculative", g.Speculative)
		h.Set("X-Kvmesh-Proposed-Tokens", strconv.Itoa(g.Proposed))
		h.Set("X-Kvmesh-Accepted-Tokens", strconv.Itoa(g.Accepted))
	}
	WriteJSON(w, http.StatusOK, whole(resp, chat, text, g))
}

// finishStream ends a stream: the text not yet sent (rest), the finish
// reason, the usage when asked for, and [DONE]. A stream that emitted
// nothing starts here.
func (o *API) finishStream(sse *sseWriter, resp responseJSON, chat bool, rest string, g prefill.Generation, usage bool) {
	if !sse.started { // nothing was emitted: no text at all
		if err := sse.start(); err != nil {
			return
		}
		if chat {
			sse.event(o.chunk(resp, chat, "", true, nil))
		}
	}
	finish := g.Finish
	if rest != "" {
		sse.event(o.chunk(resp, chat, rest, false, nil))
	}
	sse.event(o.chunk(resp, chat, "", false, &finish))
	if usage {
		last := resp
		last.Choices, last.Usage = []choiceJSON{}, usageOf(g)
		sse.event(last)
	}
	sse.done()
}

// whole completes resp, a response not streamed, with the answer's text,
// finish reason and usage.
func whole(resp responseJSON, chat bool, text string, g prefill.Generation) responseJSON {
	finish := g.Finish
	c := choiceJSON{FinishReason: &finish}
	if chat {
		c.Message = &chatDelta{Role: "assistant", Content: text}
	} else {
		c.Text = &text
	}
	resp.Choices, resp.Usage = []choiceJSON{c}, usageOf(g)
	return resp
}

func (o *API) lookup(w http.ResponseWriter, r *http.Request, chat bool, who auth.Principal) error {
	j, err := o.parse(w, r, chat)
	if err != nil {
		return err
	}
	cached := o.engine.Cached(ownerOf(who).context(r.Context()), j.prompt)
	WriteJSON(w, http.StatusOK, LookupResult{PromptTokens: len(j.prompt), CachedTokens: cached, MaxTokens: j.opts.MaxTokens})
	return nil
}

// chunk is one streamed event: text, the role (chat's first chunk), or the
// finish reason (the last).
func (o *API) chunk(resp responseJSON, chat bool, text string, role bool, finish *string) responseJSON {
	c := choiceJSON{FinishReason: finish}
	switch {
	case chat && role:
		c.Delta = &chatDelta{Role: "assistant"}
	case chat:
		c.Delta = &chatDelta{Content: text}
	default:
		c.Text = &text
	}
	resp.Choices = []choiceJSON{c}
	return resp
}

func (o *API) fingerprint() string {
	return "kvmesh-" + digestString(o.engine.WeightsDigest())
}

func (o *API) account(path string, j *job, g prefill.Generation, began time.Time) {
	o.metrics.tokens.WithLabelValues("prompt").Add(float64(g.Usage.PromptTokens))
	o.metrics.tokens.WithLabelValues("cached").Add(float64(g.Usage.CachedTokens))
	o.metrics.tokens.WithLabelValues("completion").Add(float64(g.CompletionTokens))
	o.metrics.ttft.Observe(g.TTFT.Seconds())
	o.log.Info("completion", "path", path, "session", j.session, "stream", j.stream,
		"prompt_tokens", g.Usage.PromptTokens, "cached_tokens", g.Usage.CachedTokens, "completion_tokens", g.CompletionTokens,
		"finish", g.Finish, "prefill_ms", ms(g.Prefill), "ttft_ms", ms(g.TTFT), "decode_ms", ms(g.Decode),
		"total_ms", ms(time.Since(began)))
}
