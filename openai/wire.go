package openai

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/kvmesh/kvmesh/prefill"
)

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
	// A message may quote what the caller sent (an id, a model): at most
	// 1 KiB of it, in the answer and in the log line of the refusal.
	return &httpError{status: code, apiError: apiError{Message: clipTo(fmt.Sprintf(format, args...), 1<<10), Type: errorType(code),
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

func (e *httpError) withCode(code string) *httpError {
	if code != "" {
		e.Code = &code
	}
	return e
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
	// CompletionTokensDetails is set when the engine decoded speculatively
	// (prefill.Options.Speculative), in OpenAI's shape for predicted
	// outputs: of the tokens its proposer guessed, those the model
	// accepted (each one of completion_tokens, counted once) and those it
	// rejected (never part of the answer).
	CompletionTokensDetails *CompletionTokensDetails `json:"completion_tokens_details,omitempty"`
}

// CompletionTokensDetails are the guesses of speculative decoding.
type CompletionTokensDetails struct {
	AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
	RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
}

func usageOf(g prefill.Generation) *Usage {
	u := &Usage{PromptTokens: g.Usage.PromptTokens, CompletionTokens: g.CompletionTokens,
		TotalTokens: g.Usage.PromptTokens + g.CompletionTokens}
	u.PromptTokensDetails.CachedTokens = g.Usage.CachedTokens
	if g.Speculative != "" {
		u.CompletionTokensDetails = &CompletionTokensDetails{AcceptedPredictionTokens: g.Accepted, RejectedPredictionTokens: g.Proposed - g.Accepted}
	}
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

// LookupResult is the answer of LookupPath.
type LookupResult struct {
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	MaxTokens    int `json:"max_tokens"`
}
