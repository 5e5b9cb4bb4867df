package prefill

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// rawTensor is a tensor as a file holds it.
type rawTensor struct {
	name  string
	dtype string
	shape []int
	data  []byte
}

// writeFile writes tensors as one safetensors file.
func writeFile(t testing.TB, path string, ts []rawTensor) {
	t.Helper()
	sort.Slice(ts, func(i, j int) bool { return ts[i].name < ts[j].name })
	hdr := map[string]any{}
	var off int
	for _, x := range ts {
		hdr[x.name] = map[string]any{"dtype": x.dtype, "shape": x.shape, "data_offsets": []int{off, off + len(x.data)}}
		off += len(x.data)
	}
	js, _ := json.Marshal(hdr)
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	b = append(b, js...)
	for _, x := range ts {
		b = append(b, x.data...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeCheckpoint writes the weights of c to dir in dtype, as one file or
// as shards with an index; without the LM head when tied.
func writeCheckpoint(t testing.TB, dir string, c Config, w *Weights, dtype string, shards int, tied bool) {
	t.Helper()
	var ts []rawTensor
	for _, x := range c.tensors(w) {
		if tied && x.name == "lm_head.weight" {
			continue
		}
		b := make([]byte, dtypeSizes[dtype]*len(*x.data))
		narrow(b, *x.data, dtype)
		ts = append(ts, rawTensor{x.name, dtype, x.shape, b})
	}
	if shards <= 1 {
		writeFile(t, filepath.Join(dir, CheckpointFile), ts)
		return
	}
	weightMap := map[string]string{}
	for s := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, shards)
		var part []rawTensor
		for i := s; i < len(ts); i += shards {
			part = append(part, ts[i])
			weightMap[ts[i].name] = name
		}
		writeFile(t, filepath.Join(dir, name), part)
	}
	js, _ := json.Marshal(map[string]any{"weight_map": weightMap})
	if err := os.WriteFile(filepath.Join(dir, CheckpointIndex), js, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointDTypes: weights written as F32, BF16 or F16, in one file or
// sharded, load as their values rounded to that dtype (F32 exactly, with
// the digest of the weights themselves); a tied head is the embedding.
func TestCheckpointDTypes(t *testing.T) {
	c := tinyConfig()
	c.QKVBias, c.QKNorm = true, true
	w := SeededWeights(c, 5)
	for _, tc := range []struct {
		dtype  string
		shards int
		tied   bool
	}{{"F32", 1, false}, {"BF16", 3, false}, {"F16", 1, true}, {"BF16", 2, true}} {
		t.Run(fmt.Sprintf("%s/%d/tied=%v", tc.dtype, tc.shards, tc.tied), func(t *testing.T) {
			dir := t.TempDir()
			writeCheckpoint(t, dir, c, w, tc.dtype, tc.shards, tc.tied)
			var tie *bool
			if tc.tied && tc.shards == 2 {
				tie = &tc.tied // said by config.json rather than read off the missing head
			}
			got, err := LoadCheckpoint(dir, c, tie)
			if err != nil {
				t.Fatal(err)
			}
			defer got.Release()
			want := c.tensors(w)
			for i, x := range c.tensors(got) {
				src := *want[i].data
				if tc.tied && x.name == "lm_head.weight" {
					src = w.Embed
				}
				b := make([]byte, dtypeSizes[tc.dtype]*len(src))
				narrow(b, src, tc.dtype)
				exp := make([]float32, len(src))
				widen(exp, b, tc.dtype)
				if !slices.Equal(*x.data, exp) {
					t.Fatalf("tensor %s differs from the %s it was written as", x.name, tc.dtype)
				}
			}
			if tc.dtype == "F32" && got.Digest(c) != w.Digest(c) {
				t.Error("an F32 checkpoint's digest is not the weights'")
			}
			if tc.tied && &got.LMHead[0] != &got.Embed[0] {
				t.Error("the tied head is a copy of the embedding")
			}
			// Q, K, V and gate, up were laid out to stack without a copy.
			L := got.Layers[1]
			if q := stacked(L.Q, L.K, L.V); &q[0] != &L.Q[0] {
				t.Error("Q, K and V are not laid out one after the other")
			}
		})
	}
}

func TestHalfConversions(t *testing.T) {
	for h := range 1 << 16 {
		f := halfToFloat(uint16(h))
		if f != f {
			continue
		}
		if back := floatToHalf(f); back != uint16(h) {
			t.Fatalf("half %#04x → %g → %#04x", h, f, back)
		}
	}
	for _, tc := range []struct {
		f    float32
		half uint16
		bf   uint16
	}{{1, 0x3c00, 0x3f80}, {-2, 0xc000, 0xc000}, {65520, 0x7c00, 0x4780}, {1e-8, 0, 0x322c}, {float32(math.Inf(1)), 0x7c00, 0x7f80}} {
		if got := floatToHalf(tc.f); got != tc.half {
			t.Errorf("floatToHalf(%g) = %#04x, want %#04x", tc.f, got, tc.half)
		}
		if got := floatToBF16(tc.f); got != tc.bf {
			t.Errorf("floatToBF16(%g) = %#04x, want %#04x", tc.f, got, tc.bf)
		}
	}
}

// TestCheckpointBadInput: what cannot be loaded is refused with a message
// that names the file and the tensor, and nothing is left mapped.
func TestCheckpointBadInput(t *testing.T) {
	c := tinyConfig()
	w := SeededWeights(c, 5)
	for _, tc := range []struct {
		name   string
		edit   func(t *testing.T, dir string)
		cfg    func(*Config)
		is     error
		saying string
	}{
		{"no checkpoint", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, CheckpointIndex)) }, nil, ErrCheckpoint, "neither"},
		{"missing shard", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors")) }, nil, ErrCheckpoint, "shard"},
		{"truncated shard", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model-00001-of-00002.safetensors")
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-10)
		}, nil, ErrSafetensors, "model-00001-of-00002.safetensors"},
		{"shard outside the directory", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, CheckpointIndex), []byte(`{"weight_map":{"a":"../x.safetensors"}}`), 0o644)
		}, nil, ErrCheckpoint, "not a file of the directory"},
		{"config lies about a shape", nil, func(c *Config) { c.FFNDim = 128 }, ErrWeights, "mlp.gate_proj.weight"},
		{"config has more layers", nil, func(c *Config) { c.Layers = 3 }, ErrWeights, "model.layers.2."},
		{"biases the checkpoint lacks", nil, func(c *Config) { c.QKVBias = true }, ErrWeights, "q_proj.bias"},
		{"a dtype not loaded", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, CheckpointIndex))
			for _, f := range []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} {
				os.Remove(filepath.Join(dir, f))
			}
			var ts []rawTensor
			for _, x := range c.tensors(w) {
				dt, size := "F32", 4
				if x.name == "model.norm.weight" {
					dt, size = "I8", 1
				}
				ts = append(ts, rawTensor{x.name, dt, x.shape, make([]byte, size*x.elems())})
			}
			writeFile(t, filepath.Join(dir, CheckpointFile), ts)
		}, nil, ErrCheckpoint, "model.norm.weight (model.safetensors) has dtype I8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeCheckpoint(t, dir, c, w, "BF16", 2, false)
			if tc.edit != nil {
				tc.edit(t, dir)
			}
			cc := c
			if tc.cfg != nil {
				tc.cfg(&cc)
			}
			_, err := LoadCheckpoint(dir, cc, nil)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.saying) {
				t.Errorf("got %v, want %v saying %q", err, tc.is, tc.saying)
			}
		})
	}
	dir := t.TempDir()
	writeCheckpoint(t, dir, c, w, "F32", 1, true)
	no := false
	if _, err := LoadCheckpoint(dir, c, &no); !errors.Is(err, ErrWeights) || !strings.Contains(err.Error(), "tie_word_embeddings") {
		t.Errorf("untied config, no head: %v", err)
	}
}

func TestConfigJSONArchitectures(t *testing.T) {
	base := `"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":96,"vocab_size":300`
	for _, tc := range []struct {
		doc    string
		check  func(Config, ModelInfo) bool
		saying string
	}{
		{`{"model_type":"qwen2",` + base + `,"tie_word_embeddings":true}`, func(c Config, i ModelInfo) bool {
			return c.QKVBias && !c.QKNorm && i.TieEmbeddings != nil && *i.TieEmbeddings
		}, ""},
		{`{"model_type":"qwen3",` + base + `,"head_dim":32}`, func(c Config, _ ModelInfo) bool { return c.QKNorm && c.HeadDim == 32 }, ""},
		{`{"model_type":"mistral",` + base + `,"sliding_window":4096}`, func(c Config, _ ModelInfo) bool { return c.SlidingWindow == 4096 }, ""},
		{`{"model_type":"mistral",` + base + `,"sliding_window":null}`, func(c Config, _ ModelInfo) bool { return c.SlidingWindow == 0 }, ""},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"llama3","factor":32,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192},"eos_token_id":[1,2]}`,
			func(c Config, i ModelInfo) bool {
				return c.RopeScaling.Type == RopeLlama3 && c.RopeScaling.Factor == 32 && slices.Equal(i.EOS, []uint32{1, 2})
			}, ""},
		{`{"model_type":"qwen2",` + base + `,"max_position_embeddings":32768,"rope_scaling":{"type":"yarn","factor":4}}`, func(c Config, _ ModelInfo) bool {
			r := c.RopeScaling
			return r.Type == RopeYarn && r.OriginalContext == 32768 && r.BetaFast == 32 && math.Abs(r.AttentionFactor-(0.1*math.Log(4)+1)) < 1e-12
		}, ""},
		{`{"model_type":"gemma2",` + base + `}`, nil, `model_type "gemma2" is not supported`},
		{`{"model_type":"llama",` + base + `,"hidden_act":"gelu"}`, nil, `hidden_act "gelu"`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"type":"dynamic","factor":2}}`, nil, `rope_scaling type "dynamic"`},
		{`{"model_type":"qwen2",` + base + `,"use_sliding_window":true,"sliding_window":4096}`, nil, "use_sliding_window"},
		{`{"model_type":"llama",` + base + `,"attention_bias":true}`, nil, "attention_bias"},
		{`{"model_type":"llama",` + base + `,"num_key_value_heads":3}`, nil, "kv_heads"},
	} {
		c, info, err := parseConfigJSON([]byte(tc.doc))
		switch {
		case tc.check != nil && (err != nil || !tc.check(c, info)):
			t.Errorf("%s: %+v %+v %v", tc.doc, c, info, err)
		case tc.check == nil && (err == nil || !strings.Contains(err.Error(), tc.saying)):
			t.Errorf("%s: got %v, want an error saying %q", tc.doc, err, tc.saying)
		}
	}
}

// TestEngineModelDir: an engine over a model directory loads its
// checkpoint and releases it at Close; one over MaxModelBytes is refused
// before anything is loaded.
func TestEngineModelDir(t *testing.T) {
	c := tinyConfig()
	w := SeededWeights(c, 5)
	dir := t.TempDir()
	writeCheckpoint(t, dir, c, w, "F32", 1, false)
	js, _ := json.Marshal(map[string]any{"hidden_size": c.Dim, "num_hidden_layers": c.Layers, "num_attention_heads": c.Heads,
		"num_key_value_heads": c.KVHeads, "head_dim": c.HeadDim, "intermediate_size": c.FFNDim, "vocab_size": c.Vocab})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := New(nil, Options{Config: c, ModelDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if e.WeightsDigest() != w.Digest(c) {
		t.Error("the engine's weights are not the checkpoint's")
	}
	if err := e.Close(); err != nil || e.owned.release != nil {
		t.Errorf("Close: %v; weights released: %v", err, e.owned.release == nil)
	}
	_, err = New(nil, Options{Config: c, ModelDir: dir, MaxModelBytes: c.WeightBytes(false) - 1})
	if !errors.Is(err, ErrModelTooLarge) || !strings.Contains(err.Error(), "--max-model-bytes") {
		t.Errorf("over MaxModelBytes: %v", err)
	}
}

func TestGenerationConfig(t *testing.T) {
	dir := t.TempDir()
	info := ModelInfo{EOS: []uint32{2}}
	if err := LoadGenerationConfig(filepath.Join(dir, "absent.json"), &info); err != nil || !slices.Equal(info.EOS, []uint32{2}) {
		t.Fatalf("a missing file: %v %v", info, err)
	}
	if temp, topP := info.Sampling.Values(); temp != 1 || topP != 0 {
		t.Errorf("no defaults: temperature %g, top_p %g; want OpenAI's 1 and 0 (read as 1)", temp, topP)
	}
	path := filepath.Join(dir, "generation_config.json")
	os.WriteFile(path, []byte(`{"eos_token_id": [128001, 128008, 128009], "temperature": 0.6, "top_p": 0.9, "do_sample": true}`), 0o644)
	if err := LoadGenerationConfig(path, &info); err != nil || !slices.Equal(info.EOS, []uint32{128001, 128008, 128009}) {
		t.Fatalf("%v %v", info, err)
	}
	if temp, topP := info.Sampling.Values(); temp != 0.6 || topP != 0.9 {
		t.Errorf("temperature %g, top_p %g; want the file's 0.6 and 0.9", temp, topP)
	}
	os.WriteFile(path, []byte(`{"eos_token_id": "x"}`), 0o644)
	if err := LoadGenerationConfig(path, &info); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a bad eos_token_id: %v", err)
	}
}
