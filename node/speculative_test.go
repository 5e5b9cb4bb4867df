package node

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// writeDraftDir writes a draft of writeModelDir's model: one layer of the
// same shape, the same tokenizer.json.
func writeDraftDir(t *testing.T, model string) string {
	t.Helper()
	dir := t.TempDir()
	var c map[string]any
	b, err := os.ReadFile(filepath.Join(model, "config.json"))
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		t.Fatal(err)
	}
	c["num_hidden_layers"] = 1
	j, _ := json.Marshal(c)
	cfg, _, err := prefill.LoadConfigJSON(filepath.Join(model, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Layers = 1
	tok, err := os.ReadFile(filepath.Join(model, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"config.json": j, "tokenizer.json": tok} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := prefill.SaveWeights(filepath.Join(dir, "model.safetensors"), cfg, prefill.SeededWeights(cfg, 4)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestOpenAISpeculative: a node that decodes speculatively, with prompt
// lookup or a draft model directory, answers greedy completions with the
// tokens of a cold engine that does not, reports the guesses in the usage
// (OpenAI's completion_tokens_details) and headers, and counts them in its
// metrics, labelled with the proposer.
func TestOpenAISpeculative(t *testing.T) {
	dir, cfg, w := writeModelDir(t)
	draft := writeDraftDir(t, dir)
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cold, err := prefill.New(nil, prefill.Options{Config: cfg, Weights: w})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Close()
	prompt := strings.Repeat("the tool returned {\"path\": \"a/b.go\"}; ", 6)
	g, err := cold.Generate(context.Background(), tok.Encode(prompt), prefill.GenerateOptions{MaxTokens: 16, Stop: [][]uint32{{266}}})
	if err != nil {
		t.Fatal(err)
	}
	want := string([]rune(string(tok.Decode(g.Tokens))))
	for _, method := range []string{prefill.SpeculateNgram, prefill.SpeculateDraft} {
		pn := startPrefillNode(t, "", nil, func(o *Options) {
			o.Prefill = PrefillOptions{ModelDir: dir, Model: prefill.Config{BlockTokens: 16}, Speculative: method, SpeculativeTokens: 3}
			if method == prefill.SpeculateDraft {
				o.Prefill.DraftDir = draft
			}
		}, nil)
		req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 16, "temperature": 0}
		call := callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", req)
		if got := parseCompletion(t, call, false); got.Text != want || got.Compl != len(g.Tokens) {
			t.Errorf("%s: %+v, want %q (%d tokens)", method, got, want, len(g.Tokens))
		}
		var r struct {
			Usage struct {
				Details *struct {
					Accepted int `json:"accepted_prediction_tokens"`
					Rejected int `json:"rejected_prediction_tokens"`
				} `json:"completion_tokens_details"`
			}
		}
		if err := json.Unmarshal(call.body, &r); err != nil || r.Usage.Details == nil {
			t.Fatalf("%s: no completion_tokens_details in %s (%v)", method, call.body, err)
		}
		proposed, _ := strconv.Atoi(call.header.Get("X-Kvmesh-Proposed-Tokens"))
		accepted, _ := strconv.Atoi(call.header.Get("X-Kvmesh-Accepted-Tokens"))
		if call.header.Get("X-Kvmesh-Speculative") != method || proposed == 0 || accepted != r.Usage.Details.Accepted ||
			proposed != accepted+r.Usage.Details.Rejected {
			t.Errorf("%s: headers %v, usage %+v", method, call.header, *r.Usage.Details)
		}
		metrics := string(callAPI(t, "GET", apiURL(pn.Node, "/metrics"), "", nil).body)
		line := `kvmesh_speculative_proposed_tokens_total{proposer="` + method + `"} ` + strconv.Itoa(proposed)
		if !strings.Contains(metrics, line) {
			t.Errorf("%s: no %q in the metrics", method, line)
		}
	}
}

// TestSpeculativeDraftRefused: a draft directory whose tokenizer or
// vocabulary is not the model's is refused at start, naming the difference.
func TestSpeculativeDraftRefused(t *testing.T) {
	dir, _, _ := writeModelDir(t)
	otherTok := writeDraftDir(t, dir)
	// The same tokenizer but for two tokens whose ids are swapped.
	var tj map[string]any
	b, _ := os.ReadFile(filepath.Join(otherTok, "tokenizer.json"))
	if err := json.Unmarshal(b, &tj); err != nil {
		t.Fatal(err)
	}
	vocab := tj["model"].(map[string]any)["vocab"].(map[string]any)
	vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
	b, _ = json.Marshal(tj)
	if err := os.WriteFile(filepath.Join(otherTok, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	otherVocab := writeDraftDir(t, dir)
	var c map[string]any
	b, _ = os.ReadFile(filepath.Join(otherVocab, "config.json"))
	json.Unmarshal(b, &c)
	c["vocab_size"] = 300
	b, _ = json.Marshal(c)
	if err := os.WriteFile(filepath.Join(otherVocab, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for draft, want := range map[string]string{otherTok: "tokenizer.json differs", otherVocab: "vocabulary has 300 tokens"} {
		opts := Options{DataDir: t.TempDir(), Listen: ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
			Tiers:   TierOptions{DRAMBytes: 64 * MiB, NVMeBytes: 64 * MiB},
			Prefill: PrefillOptions{ModelDir: dir, Model: prefill.Config{BlockTokens: 16}, Speculative: prefill.SpeculateDraft, DraftDir: draft}}
		n, err := New(opts, newFakeCache(1<<20))
		if err == nil {
			n.Close()
		}
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Field != "Prefill.DraftDir" || !strings.Contains(err.Error(), want) {
			t.Errorf("draft %s: %v, want an OptionError of Prefill.DraftDir saying %q", filepath.Base(draft), err, want)
		}
	}
}

// writeSeededDraftDir writes a model directory for the seeded model of c:
// one layer of c's shape, no tokenizer.json (byte tokens, as the seeded
// model's).
func writeSeededDraftDir(t *testing.T, c prefill.Config) string {
	t.Helper()
	dir := t.TempDir()
	c.Layers = 1
	j, _ := json.Marshal(map[string]any{"model_type": "llama", "hidden_size": c.Dim, "num_hidden_layers": c.Layers,
		"num_attention_heads": c.Heads, "num_key_value_heads": c.KVHeads, "intermediate_size": c.FFNDim,
		"vocab_size": c.Vocab, "rope_theta": c.RopeTheta, "rms_norm_eps": c.NormEps, "max_position_embeddings": c.MaxContext})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), j, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := prefill.SaveWeights(filepath.Join(dir, "model.safetensors"), c, prefill.SeededWeights(c, 9)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRouterSpeculativeDecode: through kvmesh route with a prefill-role
// and a decode-role node, the decode node speculates — with a draft model
// (K=5, whole answer) and with prompt lookup (K=8, streamed) — and the
// text is that of a cold engine without speculation; with a draft, the
// draft's blocks of the prompt are in the cluster under the draft's
// namespace (the prefill-only path that publishes them is
// prefill.TestSpeculationDraftPrefilled's).
func TestRouterSpeculativeDecode(t *testing.T) {
	c := tinyModel()
	draft := writeSeededDraftDir(t, c)
	prompt := longText(rand.New(rand.NewPCG(8, 8)), 300)
	want := coldText(t, c, prompt, prefill.GenerateOptions{MaxTokens: 20})
	for _, tc := range []struct {
		method string
		k      int
		stream bool
	}{{prefill.SpeculateDraft, 5, false}, {prefill.SpeculateNgram, 8, true}} {
		roles := []string{gossip.RolePrefill, gossip.RoleDecode}
		nodes := startClusterNodes(t, 2, func(i int, o *Options) {
			o.Prefill.Model, o.Prefill.Role = c, roles[i]
			o.Prefill.Speculative, o.Prefill.SpeculativeTokens = tc.method, tc.k
			if tc.method == prefill.SpeculateDraft {
				o.Prefill.DraftDir = draft
			}
		})
		r := startRouter(t, nodes[0].GossipAddr(), router.PolicyTokens)
		waitRouterNodes(t, r, 2)
		req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 20, "temperature": 0, "stream": tc.stream}
		got := callAPI(t, "POST", "http://"+r.HTTPAddr()+"/v1/completions", "", req)
		var res completion
		if tc.stream {
			res = parseStream(t, got, false)
		} else {
			res = parseCompletion(t, got, false)
		}
		if res.Text != want {
			t.Errorf("%s: speculative split text %q, cold %q", tc.method, res.Text, want)
		}
		if got.header.Get("X-Kvmesh-Prefill-Node") != nodes[0].ID() || got.header.Get("X-Kvmesh-Node") != nodes[1].ID() {
			t.Fatalf("%s: prefill on %q, decode on %q", tc.method, got.header.Get("X-Kvmesh-Prefill-Node"), got.header.Get("X-Kvmesh-Node"))
		}
		if s := nodes[1].Node.prefill.engine.Stats(); s.Proposed == 0 {
			t.Errorf("%s: the decode node proposed nothing: %+v", tc.method, s)
		}
		if tc.method != prefill.SpeculateDraft {
			continue
		}
		dns, ok := nodes[0].Node.prefill.engine.DraftNamespace()
		if !ok {
			t.Fatal("the prefill node has no draft")
		}
		tokens := prefill.TokenizeBytes(prompt)
		full := len(tokens) / c.BlockTokens
		cache := engineCache{c: nodes[0].Node.cache, blockTokens: c.BlockTokens}
		testkit.WaitFor(t, "the draft's blocks of the prompt in the cluster", func() bool {
			n, err := cache.LongestPrefix(context.Background(), prefixhash.Keys(dns, tokens[:full*c.BlockTokens]))
			return err == nil && n == full
		})
	}
}
