package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefill/prefilltest"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// TestServeCheckpoints: kvmesh serve --prefill-model-dir serves a small
// random checkpoint of each architecture (llama, mistral, qwen2, qwen3,
// bf16 or f16, sharded or not), written by an independent PyTorch
// implementation, and its logits are that implementation's within 1e-3 of
// their scale: for the whole prompt cold, again over its cached blocks,
// and for prefixes of it over a cached prefix; the prefix hits equal the
// cold prefill. The llama directory also has a tokenizer and a chat
// template: a chat completion sends exactly the tokens of the template as
// Python's jinja2 renders it.
func TestServeCheckpoints(t *testing.T) {
	const n, block = 150, 64
	out := t.TempDir()
	models := prefilltest.Archs(n)
	refs := prefilltest.Suite(t, out, models)
	ctx := context.Background()
	for i, m := range models {
		t.Run(m.Name, func(t *testing.T) {
			dir := filepath.Join(out, m.Name)
			switch m.Name {
			case "llama":
				addChatFiles(t, dir, "llama3", "llama3", "<|begin_of_text|>", "<|eot_id|>")
			case "mistral":
				addChatFiles(t, dir, "mistral", "mistral", "<s>", "</s>")
			}
			d := startDaemon(t, t.TempDir(), "--prefill-model-dir", dir, "--prefill-max-context", "1024")
			c, err := client.Dial(d.grpcAddr, client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			prefill := func(k int) client.PrefillResult {
				t.Helper()
				r, err := c.Prefill(ctx, client.PrefillRequest{Tokens: m.Prompt[:k], ReturnLogits: true})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			check := func(what string, r client.PrefillResult, k int) {
				t.Helper()
				if e := prefilltest.MaxRelErr(r.Logits, refs[i][k-1]); e > 1e-3 {
					t.Errorf("%s, %d tokens: logits off PyTorch's by %.2g of their scale", what, k, e)
				}
			}
			cold := prefill(n)
			if cold.Usage.CachedTokens != 0 {
				t.Fatalf("first prefill: %d tokens cached", cold.Usage.CachedTokens)
			}
			check("cold", cold, n)
			var hit client.PrefillResult
			testkit.WaitFor(t, "the prompt's blocks to be published", func() bool {
				hit = prefill(n)
				return hit.Usage.CachedTokens == 2*block
			})
			check("cached prefix", hit, n)
			if e := prefilltest.MaxRelErr(hit.Logits, f64(cold.Logits)); e > 1e-5 {
				t.Errorf("the prefix hit's logits differ from the cold prefill's by %.2g", e)
			}
			for _, k := range []int{100, block + 1, block, 2} {
				r := prefill(k)
				if want := min(k/block*block, k-1); r.Usage.CachedTokens != want {
					t.Errorf("prefix of %d: %d cached, want %d", k, r.Usage.CachedTokens, want)
				}
				check("prefix", r, k)
			}
			switch m.Name {
			case "llama":
				checkChat(t, d, dir, "llama3")
			case "mistral":
				checkChatRefused(t, d, dir)
			}
		})
	}
}

func f64(f []float32) []float64 {
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

// addChatFiles gives a model directory one of package tokenizer's
// tokenizer fixtures, one of its chat templates and a
// generation_config.json.
func addChatFiles(t *testing.T, dir, tok, template, bos, eos string) {
	t.Helper()
	tj, err := os.ReadFile(filepath.Join("..", "..", "tokenizer", "testdata", tok, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join("..", "..", "tokenizer", "testdata", "chat", template+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"chat_template": string(src), "bos_token": bos, "eos_token": eos})
	gen := []byte(`{"eos_token_id": [2], "temperature": 0.6, "top_p": 0.9}`)
	for name, b := range map[string][]byte{"tokenizer.json": tj, "tokenizer_config.json": cfg, "generation_config.json": gen} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkChat: a chat completion's prompt is the tokens of the chat template
// as jinja2 renders it: as many, and, once published, the cache holds
// blocks of exactly those tokens.
func checkChat(t *testing.T, d *daemon, dir, template string) {
	t.Helper()
	msgs := []map[string]string{
		{"role": "system", "content": strings.Repeat("You answer in one word. ", 12)},
		{"role": "user", "content": "What is cached here?"},
	}
	want := renderJinja2(t, dir, template, msgs)
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(want)
	if len(ids) < 64 {
		t.Fatalf("the rendered chat has %d tokens, less than a block", len(ids))
	}
	base := "http://" + d.http
	code, resp := postJSON(t, base+"/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": msgs, "max_tokens": 3, "temperature": 0}, true)
	var got struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(resp, &got); code != 200 || got.Usage.PromptTokens != len(ids) {
		t.Fatalf("chat: %d %s; want %d prompt tokens", code, resp, len(ids))
	}
	code, resp = postJSON(t, base+"/v1/kvmesh/lookup/completions", map[string]any{"model": "kvmesh", "prompt": ids}, false)
	var l struct {
		Cached int `json:"cached_tokens"`
	}
	if json.Unmarshal(resp, &l); code != 200 || l.Cached != len(ids)/64*64 {
		t.Errorf("lookup of jinja2's tokens after the chat: %d %s; want %d cached", code, resp, len(ids)/64*64)
	}
}

// checkChatRefused: a conversation the template raises on is a 400 with
// the template's message; one it accepts is answered.
func checkChatRefused(t *testing.T, d *daemon, dir string) {
	t.Helper()
	base := "http://" + d.http
	code, resp := postJSON(t, base+"/v1/chat/completions", map[string]any{"model": "kvmesh", "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": "a"}, {"role": "user", "content": "b"}}}, false)
	if code != 400 || !strings.Contains(string(resp), "Conversation roles must alternate") {
		t.Errorf("a conversation the template refuses: %d %s", code, resp)
	}
	code, resp = postJSON(t, base+"/v1/chat/completions", map[string]any{"model": "kvmesh",
		"messages": []map[string]string{{"role": "user", "content": strings.Repeat("hello ", 1100)}}}, false)
	if code != 400 || !strings.Contains(string(resp), "context_length_exceeded") {
		t.Errorf("a chat longer than the context: %d %s", code, resp)
	}
	msgs := []map[string]string{{"role": "user", "content": "hello world"}}
	ids := func() []uint32 {
		tok, err := tokenizer.LoadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		return tok.Encode(renderJinja2(t, dir, "mistral", msgs))
	}()
	code, resp = postJSON(t, base+"/v1/chat/completions", map[string]any{"model": "kvmesh", "max_tokens": 1, "messages": msgs}, false)
	if !strings.Contains(string(resp), `"prompt_tokens":`+strconv.Itoa(len(ids))+",") || code != 200 {
		t.Errorf("chat: %d %s; want %d prompt tokens", code, resp, len(ids))
	}
}

// renderJinja2 renders msgs with the directory's chat template in Python's
// jinja2, as transformers does (package tokenizer's testdata/render.py).
func renderJinja2(t *testing.T, dir, template string, msgs []map[string]string) string {
	t.Helper()
	tmpl, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := os.ReadFile(filepath.Join("..", "..", "tokenizer", "testdata", "chat", template+".jinja"))
	spec, _ := json.Marshal(map[string]any{"templates": map[string]string{"t": string(src)}, "chats": [][]map[string]string{msgs},
		"vars": map[string]string{"bos_token": tmpl.SpecialText("bos_token"), "eos_token": tmpl.SpecialText("eos_token")}})
	path := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(path, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := exec.Command("/usr/bin/python3", filepath.Join("..", "..", "tokenizer", "testdata", "render.py"), path).Output()
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no python3 with jinja2: %v", err)
		}
		t.Fatalf("render.py: %v", err)
	}
	var out map[string][]string
	if err := json.Unmarshal(b, &out); err != nil || len(out["t"]) != 1 {
		t.Fatalf("render.py printed %s: %v", b, err)
	}
	return out["t"][0]
}

func postJSON(t *testing.T, url string, body any, publish bool) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if publish {
		req.Header.Set("X-Kvmesh-Publish", "wait")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// TestServeRefusesBadModelDirs: kvmesh serve --prefill-model-dir exits at
// start, with one line that says what is wrong, for a directory it cannot
// serve whole: it never starts half-loaded.
func TestServeRefusesBadModelDirs(t *testing.T) {
	cfg := prefill.Config{Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, HeadDim: 8, FFNDim: 48, Vocab: 300, MaxContext: 512, BlockTokens: 16}
	cfg.EnsureDefaults()
	config := map[string]any{"model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 300}
	good := func(t *testing.T, edit func(map[string]any)) string {
		dir := t.TempDir()
		c := maps.Clone(config)
		if edit != nil {
			edit(c)
		}
		b, _ := json.Marshal(c)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		qk := cfg
		qk.QKNorm = true
		if err := prefill.SaveWeights(filepath.Join(dir, prefill.CheckpointFile), qk, prefill.SeededWeights(qk, 1)); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, tc := range []struct {
		name string
		dir  func(t *testing.T) string
		args []string
		want string
	}{
		{"no config.json", func(t *testing.T) string {
			dir := good(t, nil)
			os.Remove(filepath.Join(dir, "config.json"))
			return dir
		}, nil, "config.json: no such file"},
		{"unsupported architecture", func(t *testing.T) string {
			return good(t, func(c map[string]any) { c["model_type"] = "gemma2" })
		}, nil, `model_type "gemma2" is not supported`},
		{"config.json lies about a shape", func(t *testing.T) string {
			return good(t, func(c map[string]any) { c["intermediate_size"] = 64 })
		}, nil, "mlp.gate_proj.weight"},
		{"missing shard", func(t *testing.T) string {
			dir := good(t, nil)
			os.Rename(filepath.Join(dir, prefill.CheckpointFile), filepath.Join(dir, "model-00001-of-00002.safetensors"))
			os.WriteFile(filepath.Join(dir, prefill.CheckpointIndex), []byte(`{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}`), 0o644)
			return dir
		}, nil, "model-00002-of-00002.safetensors is missing"},
		{"truncated file", func(t *testing.T) string {
			dir := good(t, nil)
			p := filepath.Join(dir, prefill.CheckpointFile)
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()/2)
			return dir
		}, nil, "model.safetensors"},
		{"a template that does not compile", func(t *testing.T) string {
			dir := good(t, nil)
			tok, _ := os.ReadFile(filepath.Join("..", "..", "tokenizer", "testdata", "qwen2", "tokenizer.json"))
			os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644)
			os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"chat_template": "{% for m in messages %}"}`), 0o644)
			return dir
		}, nil, "chat template"},
		{"over --max-model-bytes", func(t *testing.T) string { return good(t, nil) }, []string{"--max-model-bytes", "64KiB"}, "over --max-model-bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
				"--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--prefill-model-dir", tc.dir(t)}, tc.args...)
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want an error saying %q", code, stderr.String(), tc.want)
			}
		})
	}
}
