package openai

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// TestSamplingDefaults: a request that names no temperature or top_p gets
// the model's (Options.Sampling, from generation_config.json), else
// OpenAI's; what a request names wins.
func TestSamplingDefaults(t *testing.T) {
	e := newTestEngine(t)
	temp, topP := 0.6, 0.9
	model := prefill.SamplingDefaults{Temperature: &temp, TopP: &topP}
	for _, c := range []struct {
		sampling  prefill.SamplingDefaults
		body      string
		temp, top float64
	}{
		{model, `{"model":"kvmesh","prompt":"hi"}`, 0.6, 0.9},
		{model, `{"model":"kvmesh","prompt":"hi","temperature":0}`, 0, 0.9},
		{model, `{"model":"kvmesh","prompt":"hi","top_p":0.5}`, 0.6, 0.5},
		{prefill.SamplingDefaults{}, `{"model":"kvmesh","prompt":"hi"}`, 1, 0}, // OpenAI's: top_p 0 reads as 1
	} {
		o := &API{opts: Options{Sampling: c.sampling}, engine: e, model: e.Namespace().Model, tok: tokenizer.Bytes{},
			inflight: newBudget(DefaultMaxInFlightBytes)}
		r, err := http.NewRequest("POST", "/v1/completions", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		j, err := o.parse(httptestRecorder{}, r, false)
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if j.opts.Temperature != c.temp || j.opts.TopP != c.top {
			t.Errorf("%s with the model's %+v: temperature %g, top_p %g; want %g, %g", c.body, c.sampling, j.opts.Temperature, j.opts.TopP, c.temp, c.top)
		}
	}
}
