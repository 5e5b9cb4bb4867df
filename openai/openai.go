package openai

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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
// user, assistant and tool.
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

// apiError is OpenAI's error object.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// httpError is an error answer: status and the error object.
type httpError struct {
	status int
	apiError
	retryAfter int // seconds; 0: no Retry-After
}

func (e *httpError) Error() string { return e.Message }

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func errorType(code int) string {
	switch code {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, http.StatusInternalServerError:
		return "server_error"
	}
	return "invalid_request_error"
}

func newHTTPError(code int, param, errCode, format string, args ...any) *httpError {
	return &httpError{status: code, apiError: apiError{Message: fmt.Sprintf(format, args...), Type: errorType(code),
		Param: nullable(param), Code: nullable(errCode)}}
}

func badRequest(param, format string, args ...any) *httpError {
	return newHTTPError(http.StatusBadRequest, param, "", format, args...)
}

// WriteError answers with OpenAI's error object: status code, message,
// type ("invalid_request_error", "server_error", ...) and, when not empty,
// the param at fault and a code.
func WriteError(w http.ResponseWriter, code int, msg, typ, param, errCode string) {
	WriteJSON(w, code, struct {
		Error apiError `json:"error"`
	}{apiError{Message: msg, Type: typ, Param: nullable(param), Code: nullable(errCode)}})
}

// WriteJSON answers with status code and v as JSON, as every answer of the
// API is written (Content-Type and Content-Length set, a newline at the end).
func WriteJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("openai: encoding an HTTP answer: %v", err)) // our own types always encode
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// statusWriter remembers the status code written, for the metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

type modelJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (o *API) modelJSON() modelJSON {
	return modelJSON{ID: o.model, Object: "model", OwnedBy: "kvmesh"}
}

func (o *API) knows(model string) bool { return model == o.model || model == ModelAlias }

func (o *API) unknownModel(model string) error {
	return newHTTPError(http.StatusNotFound, "model", "model_not_found", "the model %q does not exist on this node; it serves %q (also called %q)", model, o.model, ModelAlias)
}

// completionRequest is the body of both completions; fields of the other
// endpoint are ignored, unknown fields too.
type completionRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	N                   *int            `json:"n"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Echo bool `json:"echo"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// decodeBody reads a JSON body of at most limit bytes into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	body := http.MaxBytesReader(w, r.Body, limit)
	dec := json.NewDecoder(body)
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("data after the JSON object")
		}
	}
	var (
		tooBig  *http.MaxBytesError
		typeErr *json.UnmarshalTypeError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooBig):
		return newHTTPError(http.StatusRequestEntityTooLarge, "", "request_too_large", "the request body is over %d bytes", tooBig.Limit)
	case errors.As(err, &typeErr):
		return badRequest(typeErr.Field, "%s: expected %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case errors.Is(err, io.EOF):
		return badRequest("", "the request body is empty; send a JSON object")
	}
	return badRequest("", "the request body is not valid JSON: %v", err)
}

// job is a checked completion request.
type job struct {
	chat    bool
	prompt  []uint32
	opts    prefill.GenerateOptions
	stream  bool
	usage   bool // stream_options.include_usage
	session string
}

func (o *API) parse(w http.ResponseWriter, r *http.Request, chat bool) (*job, error) {
	var req completionRequest
	if err := decodeBody(w, r, &req, MaxBodyBytes); err != nil {
		return nil, err
	}
	return o.check(&req, chat, r.Header.Get(SessionHeader))
}

// check validates a decoded completion request and makes it a job.
func (o *API) check(req *completionRequest, chat bool, session string) (*job, error) {
	j := &job{chat: chat, stream: req.Stream, usage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	switch {
	case req.Model == "":
		return nil, badRequest("model", "model is required (this node serves %q, also called %q)", o.model, ModelAlias)
	case !o.knows(req.Model):
		return nil, o.unknownModel(req.Model)
	case req.N != nil && *req.N != 1:
		return nil, badRequest("n", "n must be 1: this server generates one choice per request")
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported")
	}
	var err error
	if chat {
		j.prompt, err = chatPrompt(o.tok, o.chatML, req.Messages)
	} else {
		j.prompt, err = completionPrompt(o.tok, req.Prompt)
	}
	if err != nil {
		return nil, err
	}
	j.opts.MaxTokens = DefaultCompletionTokens
	if chat {
		j.opts.MaxTokens = DefaultChatTokens
		if req.MaxCompletionTokens != nil {
			req.MaxTokens = req.MaxCompletionTokens
		}
	}
	maxParam := "max_tokens"
	if chat && req.MaxCompletionTokens != nil {
		maxParam = "max_completion_tokens"
	}
	if req.MaxTokens != nil {
		if *req.MaxTokens < 1 {
			return nil, badRequest(maxParam, "%s must be at least 1, got %d", maxParam, *req.MaxTokens)
		}
		j.opts.MaxTokens = *req.MaxTokens
	} else if chat {
		// Without a limit, a chat answer stops where the context does.
		j.opts.MaxTokens = max(1, min(j.opts.MaxTokens, o.engine.Config().MaxContext-len(j.prompt)))
	}
	j.opts.Temperature = 1 // OpenAI's default
	if req.Temperature != nil {
		j.opts.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		if *req.TopP <= 0 || *req.TopP > 1 {
			return nil, badRequest("top_p", "top_p must be in (0, 1], got %g", *req.TopP)
		}
		j.opts.TopP = *req.TopP
	}
	if req.Seed != nil {
		j.opts.Seed = uint64(*req.Seed)
	} else {
		var b [8]byte
		rand.Read(b[:])
		for _, x := range b {
			j.opts.Seed = j.opts.Seed<<8 | uint64(x)
		}
	}
	if j.opts.Stop, err = stopSequences(o.tok, req.Stop); err != nil {
		return nil, err
	}
	j.opts.Stop = append(j.opts.Stop, o.endOfTurn...)
	if err := o.engine.CheckGenerate(j.prompt, j.opts); err != nil {
		msg := strings.TrimPrefix(err.Error(), prefill.ErrInvalidInput.Error()+": ")
		param := "prompt"
		if chat {
			param = "messages"
		}
		code := ""
		switch {
		case strings.HasPrefix(msg, "max_tokens"):
			param, code = maxParam, "context_length_exceeded"
		case strings.HasPrefix(msg, "temperature"):
			param = "temperature"
		case strings.HasPrefix(msg, "top_p"):
			param = "top_p"
		case strings.HasPrefix(msg, "stop"):
			param = "stop"
		case strings.Contains(msg, "context holds"):
			code = "context_length_exceeded"
		}
		return nil, badRequest(param, "%s", msg).withCode(code)
	}
	j.session = session
	if len(j.session) > MaxSessionBytes {
		return nil, badRequest(SessionHeader, "the %s header has %d bytes; at most %d", SessionHeader, len(j.session), MaxSessionBytes)
	}
	j.opts.Session = j.session
	return j, nil
}

func (e *httpError) withCode(code string) *httpError {
	if code != "" {
		e.Code = &code
	}
	return e
}

// completionPrompt reads /v1/completions' prompt: a string, an array of one
// string, an array of token ids, or an array of one array of token ids.
func completionPrompt(tok tokenizer.Tokenizer, raw json.RawMessage) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return tok.Encode(s), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return nil, badRequest("prompt", "prompt: %d prompts; this server takes one per request", len(ss))
		}
		return tok.Encode(ss[0]), nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		return ids, nil
	}
	var idss [][]uint32
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 {
			return nil, badRequest("prompt", "prompt: %d prompts; this server takes one per request", len(idss))
		}
		return idss[0], nil
	}
	return nil, badRequest("prompt", "prompt must be a string, an array of one string, or an array of token ids (0..4294967295)")
}

// chatRoles are the roles ChatTemplate knows.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// chatPrompt renders messages with ChatTemplate, or ChatML when chatML,
// and tokenizes them.
func chatPrompt(tok tokenizer.Tokenizer, chatML bool, raw json.RawMessage) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("messages", "messages is required: an array of {role, content}")
	}
	var msgs []chatMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, badRequest("messages", "messages must be an array of {\"role\": string, \"content\": string or array of text parts}: %v", err)
	}
	if len(msgs) == 0 {
		return nil, badRequest("messages", "messages is empty")
	}
	var b strings.Builder
	for i, m := range msgs {
		if !chatRoles[m.Role] {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role: %q is not one of system, developer, user, assistant, tool", i, m.Role)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content: %v", i, err)
		}
		if chatML {
			fmt.Fprintf(&b, "<|im_start|>%s\n%s<|im_end|>\n", m.Role, text)
		} else {
			fmt.Fprintf(&b, "<|%s|>\n%s\n", m.Role, text)
		}
	}
	if chatML {
		b.WriteString("<|im_start|>assistant\n")
	} else {
		b.WriteString("<|assistant|>\n")
	}
	return tok.Encode(b.String()), nil
}

// messageText reads a message's content: a string, null, or an array of
// text parts ({"type":"text","text":...}), which are concatenated.
func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of text parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", fmt.Errorf("a part of type %q: only text parts are supported", p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// stopSequences reads stop: null, a string or an array of strings.
func stopSequences(tok tokenizer.Tokenizer, raw json.RawMessage) ([][]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var ss []string
	var s string
	if json.Unmarshal(raw, &s) == nil {
		ss = []string{s}
	} else if err := json.Unmarshal(raw, &ss); err != nil {
		return nil, badRequest("stop", "stop must be a string or an array of strings")
	}
	if len(ss) > maxAPIStops {
		return nil, badRequest("stop", "stop: %d sequences, at most %d", len(ss), maxAPIStops)
	}
	out := make([][]uint32, 0, len(ss))
	for i, s := range ss {
		if s == "" || len(s) > prefill.MaxStopTokens {
			return nil, badRequest("stop", "stop[%d] has %d bytes; want 1..%d", i, len(s), prefill.MaxStopTokens)
		}
		out = append(out, tok.Encode(s))
	}
	return out, nil
}

// textDecoder turns generated bytes into text as they come: a UTF-8
// sequence once it is complete, an invalid byte as U+FFFD. Streamed pieces
// concatenate to the text of the whole.
type textDecoder struct{ pending []byte }

func (d *textDecoder) text(in []byte, final bool) string {
	d.pending = append(d.pending, in...)
	var b strings.Builder
	p := d.pending
	for len(p) > 0 && (final || utf8.FullRune(p)) {
		r, size := utf8.DecodeRune(p)
		b.WriteRune(r)
		p = p[size:]
	}
	d.pending = append(d.pending[:0], p...)
	return b.String()
}

// Usage is a completion's usage, with the prompt tokens whose K/V came from
// the cache (prompt_tokens_details.cached_tokens).
type Usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func usageOf(g prefill.Generation) *Usage {
	u := &Usage{PromptTokens: g.Usage.PromptTokens, CompletionTokens: g.CompletionTokens,
		TotalTokens: g.Usage.PromptTokens + g.CompletionTokens}
	u.PromptTokensDetails.CachedTokens = g.Usage.CachedTokens
	return u
}

type chatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type choiceJSON struct {
	Index        int        `json:"index"`
	Text         *string    `json:"text,omitempty"`    // completions
	Message      *chatDelta `json:"message,omitempty"` // chat
	Delta        *chatDelta `json:"delta,omitempty"`   // chat chunks
	Logprobs     *struct{}  `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

type responseJSON struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Choices           []choiceJSON `json:"choices"`
	Usage             *Usage       `json:"usage,omitempty"`
}

func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (o *API) complete(w http.ResponseWriter, r *http.Request, chat bool, who auth.Principal) error {
	began := time.Now()
	j, err := o.parse(w, r, chat)
	if err != nil {
		return err
	}
	select {
	case o.admit <- struct{}{}:
		defer func() { <-o.admit }()
	default:
		e := newHTTPError(http.StatusTooManyRequests, "", "rate_limit_exceeded", "%d requests are already running or waiting for this node's engine; retry shortly, or on another node", cap(o.admit))
		e.retryAfter = 1
		return e
	}
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
		sse = &sseWriter{w: w, rc: http.NewResponseController(w)}
		if chat {
			resp.Object = "chat.completion.chunk"
		}
		j.opts.Emit = func(tokens []uint32) error {
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
	serving := o.n.Foreground() // pushes to owners wait for the generation (not for the publishing below)
	g, err := o.engine.Generate(ctx, j.prompt, j.opts)
	serving()
	if err != nil {
		var he *httpError
		switch {
		case errors.Is(err, prefill.ErrInvalidInput):
			he = badRequest("", "%s", strings.TrimPrefix(err.Error(), prefill.ErrInvalidInput.Error()+": "))
		case errors.Is(err, prefill.ErrClosed):
			he = newHTTPError(http.StatusServiceUnavailable, "", "", "the node is shutting down; retry on another node")
		case r.Context().Err() != nil, sse != nil && sse.err != nil:
			o.log.Info("openai: the client left", "path", r.URL.Path, "session", j.session, "err", err)
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
	o.account(r.URL.Path, j, g, began)
	if sse == nil && r.Header.Get(PublishHeader) == "wait" {
		// The engine hands its blocks to the cache, which keeps them here
		// and pushes them to their owners, where other nodes look: wait
		// for both (bounded; a miss only costs the next node compute).
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := o.engine.Flush(fctx)
		if err == nil {
			err = o.n.Flush(fctx)
		}
		cancel()
		if err != nil {
			o.log.Info("openai: the prompt's blocks are not all published yet", "err", err)
		}
	}
	if sse == nil {
		text := dec.text(o.tok.Decode(g.Tokens), true)
		h := w.Header()
		h.Set("X-Kvmesh-Cached-Tokens", strconv.Itoa(g.Usage.CachedTokens))
		h.Set("X-Kvmesh-Prefill-Ms", strconv.FormatFloat(ms(g.Prefill), 'f', 3, 64))
		h.Set("X-Kvmesh-Ttft-Ms", strconv.FormatFloat(ms(g.TTFT), 'f', 3, 64))
		h.Set("X-Kvmesh-Decode-Ms", strconv.FormatFloat(ms(g.Decode), 'f', 3, 64))
		WriteJSON(w, http.StatusOK, whole(resp, chat, text, g))
		return nil
	}
	if !sse.started { // nothing was emitted: no text at all
		if err := sse.start(); err != nil {
			return nil
		}
		if chat {
			sse.event(o.chunk(resp, chat, "", true, nil))
		}
	}
	finish := g.Finish
	if rest := dec.text(nil, true); rest != "" {
		sse.event(o.chunk(resp, chat, rest, false, nil))
	}
	sse.event(o.chunk(resp, chat, "", false, &finish))
	if j.usage {
		last := resp
		last.Choices, last.Usage = []choiceJSON{}, usageOf(g)
		sse.event(last)
	}
	sse.done()
	return nil
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

// LookupResult is the answer of LookupPath.
type LookupResult struct {
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	MaxTokens    int `json:"max_tokens"`
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

// sseWriter writes server-sent events, each flushed, each write under
// writeTimeout.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	err     error // the first write error; later events are not written
}

func (s *sseWriter) start() error {
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	return s.write(nil)
}

func (s *sseWriter) event(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("openai: encoding an event: %v", err))
	}
	return s.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

func (s *sseWriter) done() error { return s.write([]byte("data: [DONE]\n\n")) }

func (s *sseWriter) write(b []byte) error {
	if s.err != nil {
		return s.err
	}
	s.rc.SetWriteDeadline(time.Now().Add(writeTimeout)) // not every writer has deadlines
	if len(b) > 0 {
		if _, err := s.w.Write(b); err != nil {
			s.err = fmt.Errorf("openai: writing to the client: %w", err)
			return s.err
		}
	}
	if err := s.rc.Flush(); err != nil {
		s.err = fmt.Errorf("openai: flushing to the client: %w", err)
	}
	return s.err
}
