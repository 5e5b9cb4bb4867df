package prefill

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The safetensors format (https://github.com/huggingface/safetensors):
//
//	8 bytes   N, the header length, little-endian uint64
//	N bytes   a JSON object: tensor name → {"dtype", "shape", "data_offsets": [begin, end]},
//	          plus an optional "__metadata__": {string: string}; may be padded with spaces
//	rest      the data buffer; offsets are relative to its start
//
// The reader accepts only F32 tensors and holds files to the format's rules:
// offsets inside the buffer, end−begin equal to the shape's byte size, no
// overlap and no hole (the buffer is exactly covered), no duplicate names.

// ErrSafetensors is wrapped by every error about a malformed or unsupported
// safetensors file.
var ErrSafetensors = errors.New("prefill: bad safetensors file")

// ErrWeights is wrapped by errors about weights that do not fit the config.
var ErrWeights = errors.New("prefill: weights do not fit the config")

// maxSafetensorsHeader is the format's own limit on the JSON header.
const maxSafetensorsHeader = 100 << 20

const metadataKey = "__metadata__"

// Tensor is a named float32 array as stored in a safetensors file.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32 // row-major; len is the product of Shape
}

type stEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

func badFile(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSafetensors, fmt.Sprintf(format, args...))
}

// WriteSafetensors writes tensors, sorted by name, and metadata to w in the
// safetensors format, as F32. Names must be unique, non-empty and not
// "__metadata__"; len(Data) must match Shape.
func WriteSafetensors(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	ts := slices.Clone(tensors)
	slices.SortFunc(ts, func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) })
	header := make(map[string]any, len(ts)+1)
	if len(metadata) > 0 {
		header[metadataKey] = metadata
	}
	var off int64
	for i, t := range ts {
		switch {
		case t.Name == "" || t.Name == metadataKey:
			return fmt.Errorf("prefill: write safetensors: bad tensor name %q", t.Name)
		case i > 0 && ts[i-1].Name == t.Name:
			return fmt.Errorf("prefill: write safetensors: duplicate tensor %q", t.Name)
		}
		n, ok := shapeElems(t.Shape, math.MaxInt64/4)
		if !ok || n != int64(len(t.Data)) {
			return fmt.Errorf("prefill: write safetensors: tensor %s has %d elements, shape %v", t.Name, len(t.Data), t.Shape)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = stEntry{DType: "F32", Shape: shape, DataOffsets: [2]int64{off, off + 4*n}}
		off += 4 * n
	}
	js, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("prefill: write safetensors: %w", err)
	}
	// Pad with spaces so that the data buffer starts 8-byte aligned.
	if pad := (8 - len(js)%8) % 8; pad > 0 {
		js = append(js, bytes.Repeat([]byte{' '}, pad)...)
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	bw.Write(n[:])
	bw.Write(js)
	var buf []byte
	for _, t := range ts {
		if littleEndian {
			bw.Write(floatBytes(t.Data))
			continue
		}
		buf = slices.Grow(buf[:0], 4*len(t.Data))[:4*len(t.Data)]
		putFloats(buf, t.Data)
		bw.Write(buf)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("prefill: write safetensors: %w", err)
	}
	return nil
}

// shapeElems returns the number of elements of shape, or false if a
// dimension is negative or the product exceeds limit.
func shapeElems(shape []int, limit int64) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		if d == 0 {
			n = 0
			continue
		}
		if n > limit/int64(d) {
			return 0, false
		}
		n *= int64(d)
	}
	return n, n <= limit
}

// ReadSafetensors parses a whole safetensors file held in b and returns its
// tensors by name and its metadata. The tensors' Data are copies: b may be
// reused when it returns. Any violation of the format, and any dtype other
// than F32, is an error wrapping ErrSafetensors that names the tensor.
func ReadSafetensors(b []byte) (map[string]Tensor, map[string]string, error) {
	raw, meta, err := parseSafetensors(b)
	if err != nil {
		return nil, nil, err
	}
	tensors := make(map[string]Tensor, len(raw))
	for name, t := range raw {
		if t.dtype != "F32" {
			return nil, nil, badFile("tensor %s: dtype %s, only F32 is supported", name, t.dtype)
		}
		f := make([]float32, len(t.data)/4)
		getFloats(f, t.data)
		tensors[name] = Tensor{Name: name, Shape: t.shape, Data: f}
	}
	return tensors, meta, nil
}

// stTensor is one tensor of a parsed safetensors file.
type stTensor struct {
	dtype string
	shape []int
	data  []byte // aliases the file
}

// dtypeSizes are the bytes per element of the safetensors dtypes.
var dtypeSizes = map[string]int{
	"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
	"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}

// parseSafetensors checks a whole safetensors file held in b and returns
// its tensors, whose data alias b, and its metadata. Any violation of the
// format is an error wrapping ErrSafetensors that names the tensor; so is
// a dtype the format does not define.
func parseSafetensors(b []byte) (map[string]stTensor, map[string]string, error) {
	if len(b) < 8 {
		return nil, nil, badFile("%d bytes, shorter than the header length", len(b))
	}
	hl := binary.LittleEndian.Uint64(b)
	if hl > maxSafetensorsHeader {
		return nil, nil, badFile("header length %d exceeds %d", hl, maxSafetensorsHeader)
	}
	if hl > uint64(len(b)-8) {
		return nil, nil, badFile("header length %d, but only %d bytes follow", hl, len(b)-8)
	}
	hdr, data := b[8:8+hl], b[8+hl:]
	raw, err := splitHeader(hdr)
	if err != nil {
		return nil, nil, err
	}
	var meta map[string]string
	if m, ok := raw[metadataKey]; ok {
		if err := json.Unmarshal(m, &meta); err != nil {
			return nil, nil, badFile("__metadata__ is not a map of strings: %v", err)
		}
		delete(raw, metadataKey)
	}
	type span struct {
		name       string
		begin, end int64
	}
	spans := make([]span, 0, len(raw))
	tensors := make(map[string]stTensor, len(raw))
	for name, r := range raw {
		var e struct {
			DType       *string  `json:"dtype"`
			Shape       *[]int   `json:"shape"`
			DataOffsets *[]int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(r, &e); err != nil {
			return nil, nil, badFile("tensor %s: %v", name, err)
		}
		switch {
		case e.DType == nil || e.Shape == nil || e.DataOffsets == nil:
			return nil, nil, badFile("tensor %s: dtype, shape and data_offsets are required", name)
		case dtypeSizes[*e.DType] == 0:
			return nil, nil, badFile("tensor %s: dtype %s is not a safetensors dtype", name, *e.DType)
		case len(*e.DataOffsets) != 2:
			return nil, nil, badFile("tensor %s: data_offsets has %d values, want [begin, end]", name, len(*e.DataOffsets))
		}
		size := int64(dtypeSizes[*e.DType])
		begin, end := (*e.DataOffsets)[0], (*e.DataOffsets)[1]
		if begin < 0 || end < begin || end > int64(len(data)) {
			return nil, nil, badFile("tensor %s: data_offsets [%d, %d] outside the %d-byte buffer", name, begin, end, len(data))
		}
		n, ok := shapeElems(*e.Shape, int64(len(data))/size)
		if !ok || size*n != end-begin {
			return nil, nil, badFile("tensor %s: shape %v does not match its %d bytes", name, *e.Shape, end-begin)
		}
		spans = append(spans, span{name, begin, end})
		tensors[name] = stTensor{dtype: *e.DType, shape: *e.Shape, data: data[begin:end]}
	}
	slices.SortFunc(spans, func(a, b span) int {
		if a.begin != b.begin {
			return int(a.begin - b.begin)
		}
		return int(a.end - b.end)
	})
	var at int64
	for _, s := range spans {
		if s.begin != at {
			return nil, nil, badFile("tensor %s starts at byte %d, want %d (tensors overlap or leave a hole)", s.name, s.begin, at)
		}
		at = s.end
	}
	if at != int64(len(data)) {
		return nil, nil, badFile("tensors cover %d bytes of a %d-byte buffer", at, len(data))
	}
	return tensors, meta, nil
}

// splitHeader parses the header's top-level JSON object into raw values,
// rejecting duplicate names (which encoding/json would silently merge) and
// anything after the object but padding.
func splitHeader(hdr []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, badFile("header is not a JSON object")
	}
	raw := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, badFile("header: %v", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, badFile("header: key %v is not a string", tok)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, badFile("header: value of %s: %v", name, err)
		}
		if _, dup := raw[name]; dup {
			return nil, badFile("header: duplicate tensor %s", name)
		}
		raw[name] = v
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, badFile("header: unterminated object")
	}
	rest := hdr[dec.InputOffset():]
	if len(bytes.TrimRight(rest, " ")) != 0 {
		return nil, badFile("header: %d bytes after the JSON object", len(rest))
	}
	return raw, nil
}

// LoadWeights reads the weights of c from a safetensors file with Hugging
// Face Llama tensor names. Every tensor c needs must be present with its exact
// shape; a file without lm_head.weight ties it to model.embed_tokens.weight.
// Other tensors in the file are ignored.
func LoadWeights(path string, c Config) (*Weights, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("prefill: load weights: %w", err)
	}
	ts, _, err := ReadSafetensors(b)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return weightsFrom(c, ts)
}

func weightsFrom(c Config, ts map[string]Tensor) (*Weights, error) {
	w := &Weights{Layers: make([]LayerWeights, c.Layers)}
	for _, t := range c.tensors(w) {
		ft, ok := ts[t.name]
		if !ok && t.name == "lm_head.weight" {
			ft, ok = ts["model.embed_tokens.weight"]
		}
		if !ok {
			return nil, fmt.Errorf("%w: tensor %s is missing", ErrWeights, t.name)
		}
		if !slices.Equal(ft.Shape, t.shape) {
			return nil, fmt.Errorf("%w: tensor %s has shape %v, the config needs %v", ErrWeights, t.name, ft.Shape, t.shape)
		}
		*t.data = ft.Data
	}
	return w, nil
}

// SaveWeights writes w, the weights of c, to path as a safetensors file with
// Hugging Face Llama tensor names. It writes a temporary file and renames it,
// so path never holds a partial file.
func SaveWeights(path string, c Config, w *Weights) error {
	if err := w.Check(c); err != nil {
		return err
	}
	var ts []Tensor
	for _, t := range c.tensors(w) {
		ts = append(ts, Tensor{Name: t.name, Shape: t.shape, Data: *t.data})
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("prefill: save weights: %w", err)
	}
	defer os.Remove(f.Name()) // no-op after the rename
	if err := WriteSafetensors(f, ts, map[string]string{"format": "pt"}); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("prefill: save weights: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("prefill: save weights: %w", err)
	}
	return nil
}
