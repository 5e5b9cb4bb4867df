package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Request bodies. Every endpoint that reads a body caps it before reading
// (a limit per endpoint: MaxBodyBytes for the completions and the lookup,
// BatchOptions.MaxBodyBytes for POST /v1/queue and the peers' lease calls;
// past it, 413), charges bodyCost of it to the API's in-flight budget
// (Options.MaxInFlightBytes) before reading a byte (no room within
// bodyWait: 503), and refuses JSON nested deeper than MaxJSONDepth (400)
// before decoding it. A batch's requests are stored re-encoded from what
// was decoded (canonicalRequest), so fields the API does not know are not
// kept, whatever their size.

// MaxJSONDepth is the deepest a request body may nest objects and arrays.
const MaxJSONDepth = 32

// bodyCost is what reading and decoding a body of n bytes is charged: the
// bytes, the decoder's copies of its raw parts and what is decoded from
// them (texts, tokens) stay within a few times the body.
func bodyCost(n int64) int64 { return 4 * n }

// bodyWait is how long a request waits for room in the budget.
const bodyWait = time.Second

// budget bounds the bytes the API's requests hold while their bodies are
// read and decoded.
type budget struct {
	size int64
	mu   struct {
		sync.Mutex
		used  int64
		freed chan struct{}
	}
}

func newBudget(size int64) *budget {
	b := &budget{size: size}
	b.mu.freed = make(chan struct{})
	return b
}

// acquire takes n bytes (at most size), waiting up to bodyWait or ctx.
func (b *budget) acquire(ctx context.Context, n int64) error {
	n = min(n, b.size)
	t := time.NewTimer(bodyWait)
	defer t.Stop()
	for {
		b.mu.Lock()
		if b.mu.used+n <= b.size {
			b.mu.used += n
			b.mu.Unlock()
			return nil
		}
		freed := b.mu.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return fmt.Errorf("no room for %d bytes in the node's max_inflight_bytes=%d", n, b.size)
		}
	}
}

func (b *budget) release(n int64) {
	n = min(n, b.size)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.used -= n; b.mu.used < 0 {
		panic("openai: body budget released more than acquired")
	}
	close(b.mu.freed)
	b.mu.freed = make(chan struct{})
}

// readBody reads r's body, of at most limit bytes, charged to the API's
// budget for as long as done is not called.
func (o *API) readBody(w http.ResponseWriter, r *http.Request, limit int64) (body []byte, done func(), err error) {
	if r.ContentLength > limit {
		return nil, nil, newHTTPError(http.StatusRequestEntityTooLarge, "", "request_too_large", "the request body is over %d bytes", limit)
	}
	size := limit
	if r.ContentLength >= 0 {
		size = r.ContentLength
	}
	cost := bodyCost(size)
	if err := o.inflight.acquire(r.Context(), cost); err != nil {
		return nil, nil, newHTTPError(http.StatusServiceUnavailable, "", "server_busy", "the node is busy reading other requests (%v); retry later", err)
	}
	done = func() { o.inflight.release(cost) }
	var buf bytes.Buffer
	buf.Grow(int(min(size, limit)) + 1)
	_, err = buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		done()
		return nil, nil, newHTTPError(http.StatusRequestEntityTooLarge, "", "request_too_large", "the request body is over %d bytes", tooBig.Limit)
	case err != nil:
		done()
		return nil, nil, badRequest("", "reading the request body: %v", err)
	}
	return buf.Bytes(), done, nil
}

// decodeBody reads a JSON body of at most limit bytes into v (readBody,
// checkDepth, then one JSON value and nothing after it).
func (o *API) decodeBody(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	body, done, err := o.readBody(w, r, limit)
	if err != nil {
		return err
	}
	defer done()
	return decodeJSON(body, v)
}

// decodeJSON decodes b, one JSON value nested at most MaxJSONDepth deep,
// into v, answering what is wrong as a 400.
func decodeJSON(b []byte, v any) error {
	if err := checkDepth(b); err != nil {
		return badRequest("", "%v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("data after the JSON object")
		}
	}
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return badRequest("", "the request body must be a JSON object, got %s", typeErr.Value)
	case errors.As(err, &typeErr):
		return badRequest(typeErr.Field, "%s must be %s, got %s", typeErr.Field, jsonType(typeErr.Type), typeErr.Value)
	case errors.Is(err, io.EOF):
		return badRequest("", "the request body is empty; send a JSON object")
	}
	return badRequest("", "the request body is not valid JSON: %v", err)
}

// checkDepth refuses JSON whose objects and arrays nest deeper than
// MaxJSONDepth, in one pass that skips strings; it does not validate the
// rest (the decoder does).
func checkDepth(b []byte) error {
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > MaxJSONDepth {
				return fmt.Errorf("the request body nests objects and arrays more than %d deep", MaxJSONDepth)
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return nil
}

// storedRequest is a batch's request as it is stored: the fields the API
// knows, re-encoded from what was decoded, so that nothing else a client
// sent is kept.
type storedRequest struct {
	Model               string          `json:"model"`
	Prompt              any             `json:"prompt,omitempty"`
	Messages            []storedMessage `json:"messages,omitempty"`
	MaxTokens           *int            `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int            `json:"max_completion_tokens,omitempty"`
	Temperature         *float64        `json:"temperature,omitempty"`
	TopP                *float64        `json:"top_p,omitempty"`
	N                   *int            `json:"n,omitempty"`
	Seed                *int64          `json:"seed,omitempty"`
	Stop                []string        `json:"stop,omitempty"`
	Echo                bool            `json:"echo,omitempty"`
}

type storedMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// canonicalRequest re-encodes req, a checked request of a batch, with the
// fields the API knows only: a message's content as its text, the prompt
// and stop sequences as the values they hold.
func canonicalRequest(req *completionRequest) ([]byte, error) {
	s := storedRequest{Model: req.Model, MaxTokens: req.MaxTokens, MaxCompletionTokens: req.MaxCompletionTokens,
		Temperature: req.Temperature, TopP: req.TopP, N: req.N, Seed: req.Seed, Echo: req.Echo}
	if len(req.Messages) > 0 && string(req.Messages) != "null" {
		var msgs []chatMessage
		if err := json.Unmarshal(req.Messages, &msgs); err != nil {
			return nil, err
		}
		for _, m := range msgs {
			text, err := messageText(m.Content)
			if err != nil {
				return nil, err
			}
			s.Messages = append(s.Messages, storedMessage{Role: m.Role, Content: text})
		}
	}
	if len(req.Prompt) > 0 && string(req.Prompt) != "null" {
		for _, v := range []any{new(string), new([]string), new([]uint32), new([][]uint32)} {
			if json.Unmarshal(req.Prompt, v) == nil {
				s.Prompt = v
				break
			}
		}
	}
	if len(req.Stop) > 0 && string(req.Stop) != "null" {
		var one string
		if json.Unmarshal(req.Stop, &one) == nil {
			s.Stop = []string{one}
		} else if err := json.Unmarshal(req.Stop, &s.Stop); err != nil {
			return nil, err
		}
	}
	return json.Marshal(s)
}
