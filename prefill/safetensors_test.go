package prefill

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func sampleTensors() []Tensor {
	return []Tensor{
		{Name: "b", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}},
		{Name: "a", Shape: []int{4}, Data: []float32{-1, 0.5, 7, 1e-8}},
		{Name: "scalar", Shape: []int{}, Data: []float32{42}},
		{Name: "empty", Shape: []int{0, 5}, Data: []float32{}},
	}
}

func encodeSample(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, sampleTensors(), map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSafetensorsRoundTrip(t *testing.T) {
	b := encodeSample(t)
	if hl := binary.LittleEndian.Uint64(b); (8+hl)%8 != 0 {
		t.Errorf("data starts at %d, not 8-byte aligned", 8+hl)
	}
	ts, meta, err := ReadSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	if meta["format"] != "pt" || len(meta) != 1 {
		t.Errorf("metadata %v", meta)
	}
	want := sampleTensors()
	if len(ts) != len(want) {
		t.Fatalf("%d tensors, want %d", len(ts), len(want))
	}
	for _, w := range want {
		g := ts[w.Name]
		if !slices.Equal(g.Shape, w.Shape) || !slices.Equal(g.Data, w.Data) {
			t.Errorf("tensor %s: got %v %v, want %v %v", w.Name, g.Shape, g.Data, w.Shape, w.Data)
		}
	}
	// Writing is deterministic: the same tensors in another order give the
	// same bytes.
	var again bytes.Buffer
	rev := sampleTensors()
	slices.Reverse(rev)
	if err := WriteSafetensors(&again, rev, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), b) {
		t.Error("the same tensors in another order encode differently")
	}
}

// TestSafetensorsReadsHandWritten reads a file built by hand the way other
// writers lay it out (unsorted header, tensors in another order than their
// names, space padding), not by our writer.
func TestSafetensorsReadsHandWritten(t *testing.T) {
	hdr := `{"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"__metadata__":{"k":"v"},"v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}   `
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	b = append(b, hdr...)
	for _, f := range []uint32{0x3f800000, 0x40000000, 0x40400000} { // 1, 2, 3
		b = binary.LittleEndian.AppendUint32(b, f)
	}
	ts, meta, err := ReadSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ts["v"].Data, []float32{1}) || !slices.Equal(ts["w"].Data, []float32{2, 3}) || meta["k"] != "v" {
		t.Errorf("read %v %v", ts, meta)
	}
}

// withHeader returns a file with header hdr and a data buffer of n bytes.
func withHeader(hdr string, n int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	return append(append(b, hdr...), make([]byte, n)...)
}

func TestSafetensorsBadFiles(t *testing.T) {
	good := encodeSample(t)
	hugeHeader := binary.LittleEndian.AppendUint64(nil, 1<<40)
	lyingLength := append(binary.LittleEndian.AppendUint64(nil, uint64(len(good))), good[8:]...)
	for _, tc := range []struct {
		name string
		file []byte
		says string
	}{
		{"empty file", nil, "shorter than the header length"},
		{"huge header length", hugeHeader, "exceeds"},
		{"header length past the end", lyingLength, "only"},
		{"not json", withHeader("hello", 0), "not a JSON object"},
		{"json array", withHeader("[1,2]", 0), "not a JSON object"},
		{"trailing garbage", withHeader(`{} x`, 0), "after the JSON object"},
		{"unterminated", withHeader(`{"a":{}`, 0), ""},
		{"wrong dtype", withHeader(`{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`, 4), "dtype BF16"},
		{"missing dtype", withHeader(`{"a":{"shape":[2],"data_offsets":[0,8]}}`, 8), "required"},
		{"shape too big", withHeader(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), "shape [3]"},
		{"shape too small", withHeader(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}}`, 8), "shape [1]"},
		{"negative dim", withHeader(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, 8), "shape [-2]"},
		{"overflowing shape", withHeader(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, 8), "does not match"},
		{"fractional dim", withHeader(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}`, 8), "tensor a"},
		{"offsets past the end", withHeader(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4), "outside"},
		{"offsets reversed", withHeader(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, 4), "outside"},
		{"three offsets", withHeader(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, 8), "3 values"},
		{"overlap", withHeader(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12), "overlap"},
		{"hole", withHeader(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, 12), "hole"},
		{"unindexed tail", withHeader(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 8), "cover 4 bytes of a 8-byte"},
		{"duplicate name", withHeader(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "duplicate"},
		{"bad metadata", withHeader(`{"__metadata__":{"k":1}}`, 0), "__metadata__"},
	} {
		_, _, err := ReadSafetensors(tc.file)
		if !errors.Is(err, ErrSafetensors) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want ErrSafetensors saying %q", tc.name, err, tc.says)
		}
	}
	// Every truncation of a good file is rejected.
	for n := range len(good) {
		if _, _, err := ReadSafetensors(good[:n]); !errors.Is(err, ErrSafetensors) {
			t.Fatalf("truncated to %d of %d bytes: %v", n, len(good), err)
		}
	}
}

func TestWriteSafetensorsRejects(t *testing.T) {
	for name, ts := range map[string][]Tensor{
		"shape mismatch": {{Name: "a", Shape: []int{3}, Data: []float32{1}}},
		"duplicate":      {{Name: "a", Shape: []int{1}, Data: []float32{1}}, {Name: "a", Shape: []int{1}, Data: []float32{1}}},
		"empty name":     {{Name: "", Shape: []int{1}, Data: []float32{1}}},
		"metadata name":  {{Name: "__metadata__", Shape: []int{1}, Data: []float32{1}}},
	} {
		if err := WriteSafetensors(&bytes.Buffer{}, ts, nil); err == nil {
			t.Errorf("%s: WriteSafetensors accepted it", name)
		}
	}
}

// TestWeightsFileRoundTrip: seeded weights saved to a file and loaded back
// are the same weights, so they give the same digest and namespace.
func TestWeightsFileRoundTrip(t *testing.T) {
	c := tinyConfig()
	w := SeededWeights(c, 3)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := SaveWeights(path, c, w); err != nil {
		t.Fatal(err)
	}
	got, err := LoadWeights(path, c)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest(c) != w.Digest(c) {
		t.Errorf("digest after round trip %#x, want %#x", got.Digest(c), w.Digest(c))
	}
	e := newTinyEngine(t, nil, func(o *Options) { o.Weights = nil; o.WeightsPath = path })
	if want := c.Namespace(w.Digest(c), ""); e.Namespace() != want {
		t.Errorf("engine on the file has namespace %s, want %s", e.Namespace(), want)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("SaveWeights left %d files behind", len(entries))
	}

	// The same file does not fit another shape.
	other := c
	other.FFNDim = 128
	if _, err := LoadWeights(path, other); !errors.Is(err, ErrWeights) || !strings.Contains(err.Error(), "mlp.gate_proj") {
		t.Errorf("load into another shape: %v", err)
	}
	deeper := c
	deeper.Layers = 3
	if _, err := LoadWeights(path, deeper); !errors.Is(err, ErrWeights) || !strings.Contains(err.Error(), "model.layers.2") {
		t.Errorf("load into more layers: %v", err)
	}
	if _, err := LoadWeights(filepath.Join(t.TempDir(), "absent"), c); err == nil {
		t.Error("loading a missing file succeeded")
	}
}

// TestWeightsTiedHead: a checkpoint without lm_head.weight (tied
// embeddings) loads with the head equal to the embedding.
func TestWeightsTiedHead(t *testing.T) {
	c := tinyConfig()
	w := SeededWeights(c, 3)
	var ts []Tensor
	for _, t := range c.tensors(w) {
		if t.name != "lm_head.weight" {
			ts = append(ts, Tensor{Name: t.name, Shape: t.shape, Data: *t.data})
		}
	}
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, ts, nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tied.safetensors")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LoadWeights(path, c)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.LMHead, w.Embed) {
		t.Error("the tied head is not the embedding")
	}
}

func FuzzReadSafetensors(f *testing.F) {
	f.Add(encodeSample(f))
	f.Add(withHeader(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4))
	f.Add(withHeader(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12))
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, meta, err := ReadSafetensors(b)
		if err != nil {
			if !errors.Is(err, ErrSafetensors) {
				t.Fatalf("error %v does not wrap ErrSafetensors", err)
			}
			return
		}
		// What was accepted re-encodes and reads back the same.
		var list []Tensor
		var bytesIn int
		for _, t := range ts {
			list = append(list, t)
			bytesIn += 4 * len(t.Data)
		}
		hl := binary.LittleEndian.Uint64(b)
		if bytesIn != len(b)-8-int(hl) {
			t.Fatalf("tensors hold %d bytes of a %d-byte buffer", bytesIn, len(b)-8-int(hl))
		}
		var buf bytes.Buffer
		if err := WriteSafetensors(&buf, list, meta); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, _, err := ReadSafetensors(buf.Bytes())
		if err != nil || len(again) != len(ts) {
			t.Fatalf("re-read: %d tensors, %v", len(again), err)
		}
		for name, x := range ts {
			y := again[name]
			if !slices.Equal(x.Shape, y.Shape) || len(x.Data) != len(y.Data) {
				t.Fatalf("tensor %s changed shape on a round trip", name)
			}
			for i := range x.Data {
				if x.Data[i] != y.Data[i] && x.Data[i] == x.Data[i] { // NaN payloads compare unequal
					t.Fatalf("tensor %s changed on a round trip", name)
				}
			}
		}
	})
}
