package openai

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/tokenizer"
)

// FuzzOpenAIRequest: whatever the body, a completion request is either
// accepted or refused with a 4xx error object naming a problem; it never
// panics or reads as a server error.
func FuzzOpenAIRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"kvmesh","prompt":"hi","max_tokens":3}`,
		`{"model":"kvmesh","prompt":[1,2,3],"stop":["a","b"],"temperature":0.5,"top_p":0.9,"seed":-4}`,
		`{"model":"kvmesh","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"max_completion_tokens":2}`,
		`{"model":"kvmesh","prompt":[[300]],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":1}`, `[]`, `nul`, ``, `{"model":"kvmesh","prompt":"x","max_tokens":1e99}`,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	e := newTestEngine(f)
	o := &API{engine: e, model: e.Namespace().Model, tok: tokenizer.Bytes{}, inflight: newBudget(DefaultMaxInFlightBytes)}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		r, err := http.NewRequest("POST", "/v1/completions", strings.NewReader(body))
		if err != nil {
			t.Skip()
		}
		j, err := o.parse(httptestRecorder{}, r, chat)
		if err == nil {
			if cerr := e.CheckGenerate(j.prompt, j.opts); cerr != nil {
				t.Fatalf("parse accepted %q, which the engine refuses: %v", body, cerr)
			}
			return
		}
		he, ok := err.(*httpError)
		if !ok || he.status < 400 || he.status >= 500 || he.Message == "" || he.Type == "" {
			t.Fatalf("body %q: %#v is not a 4xx error object", body, err)
		}
	})
}

// httptestRecorder is the ResponseWriter parse needs (for the body limit).
type httptestRecorder struct{}

func (httptestRecorder) Header() http.Header         { return http.Header{} }
func (httptestRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (httptestRecorder) WriteHeader(int)             {}
