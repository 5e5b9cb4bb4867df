package prefill

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The files of a Hugging Face checkpoint.
const (
	// CheckpointFile is a checkpoint in one file.
	CheckpointFile = "model.safetensors"
	// CheckpointIndex names the shards of a checkpoint in several files:
	// {"weight_map": {tensor name: shard file name}}.
	CheckpointIndex = "model.safetensors.index.json"
)

// ErrCheckpoint is wrapped by errors about a checkpoint directory that
// cannot be loaded: no safetensors files, a missing or malformed shard, a
// tensor of a dtype the engine does not load.
var ErrCheckpoint = errors.New("prefill: bad checkpoint")

// namePrefixes are where checkpoints put the decoder's tensors: Hugging
// Face's "model.", none, and the language model of a multimodal wrapper.
var namePrefixes = []string{"model.", "", "language_model.model.", "model.language_model."}

// headNames are the names a checkpoint may give the LM head.
var headNames = []string{"lm_head.weight", "language_model.lm_head.weight"}

// LoadCheckpoint loads the weights of c from the safetensors files of a
// Hugging Face model directory: CheckpointFile, or the shards that
// CheckpointIndex names. Files are memory-mapped and each tensor c needs
// is widened to float32 (BF16 and F16 exactly) into one anonymous mapping,
// off the Go heap, laid out so that the engine stacks Q, K and V, and gate
// and up, without a copy; the files are unmapped before it returns. The
// weights take c.WeightBytes(tied) bytes until Release.
//
// tie is config.json's tie_word_embeddings: when true the LM head is the
// embedding matrix; when nil, a checkpoint without an LM head is read as
// tied. Tensor names may carry any of the usual prefixes ("model.", none,
// a multimodal wrapper's). Every tensor c needs must be present with its
// exact shape and a dtype of F32, BF16 or F16; others are ignored. Errors
// wrap ErrCheckpoint, ErrSafetensors or ErrWeights and name the file and
// the tensor.
func LoadCheckpoint(dir string, c Config, tie *bool) (_ *Weights, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	files, err := openShards(dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, f := range files {
			err = errors.Join(err, f.close())
		}
	}()
	all := map[string]shardTensor{}
	for _, f := range files {
		for name, t := range f.tensors {
			if prev, dup := all[name]; dup {
				return nil, fmt.Errorf("%w: tensor %s is in both %s and %s", ErrCheckpoint, name, prev.file, f.name)
			}
			all[name] = shardTensor{stTensor: t, file: f.name}
		}
	}
	prefix, ok := "", false
	for _, p := range namePrefixes {
		if _, ok = all[p+"embed_tokens.weight"]; ok {
			prefix = p
			break
		}
	}
	if !ok {
		return nil, fmt.Errorf("%w: no tensor model.embed_tokens.weight (nor under another usual prefix) in %s", ErrWeights, dir)
	}
	head := ""
	for _, h := range headNames {
		if _, ok := all[h]; ok {
			head = h
			break
		}
	}
	tied := tie != nil && *tie || tie == nil && head == ""
	if !tied && head == "" {
		return nil, fmt.Errorf("%w: tensor lm_head.weight is missing and config.json says tie_word_embeddings is false", ErrWeights)
	}

	// Check every tensor before anything is allocated.
	w := &Weights{Layers: make([]LayerWeights, c.Layers)}
	want := c.tensors(w)
	src := make([]shardTensor, len(want))
	total := 0
	for i, t := range want {
		if t.name == "lm_head.weight" && tied {
			continue
		}
		name := prefix + strings.TrimPrefix(t.name, "model.")
		if t.name == "lm_head.weight" {
			name = head
		}
		st, ok := all[name]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: tensor %s is missing", ErrWeights, name)
		case !slices.Equal(st.shape, t.shape):
			return nil, fmt.Errorf("%w: tensor %s (%s) has shape %v, config.json needs %v", ErrWeights, name, st.file, st.shape, t.shape)
		case !slices.Contains(loadableDTypes, st.dtype):
			return nil, fmt.Errorf("%w: tensor %s (%s) has dtype %s; the engine loads %v", ErrCheckpoint, name, st.file, st.dtype, loadableDTypes)
		}
		src[i] = st
		total += t.elems()
	}
	arena, err := mapFloats(total)
	if err != nil {
		return nil, fmt.Errorf("prefill: %d bytes for the weights: %w", 4*total, err)
	}
	w.release = func() error { return unmapFloats(arena) }
	off := 0
	for i, t := range want {
		if src[i].data == nil {
			continue
		}
		*t.data = arena[off : off+t.elems()] // cap reaches on: stacked sees neighbours
		off += t.elems()
	}
	if tied {
		w.LMHead = w.Embed
	}
	widenAll(want, src)
	return w, nil
}

// widenAll converts each src[i] into want[i]'s slice, spread over the cores
// in pieces of about 1M elements.
func widenAll(want []tensor, src []shardTensor) {
	type piece struct {
		dst   []float32
		src   []byte
		dtype string
	}
	const step = 1 << 20
	var pieces []piece
	for i, t := range want {
		if src[i].data == nil {
			continue
		}
		size := dtypeSizes[src[i].dtype]
		for o := 0; o < len(*t.data); o += step {
			n := min(step, len(*t.data)-o)
			pieces = append(pieces, piece{(*t.data)[o : o+n], src[i].data[o*size : (o+n)*size], src[i].dtype})
		}
	}
	var wg sync.WaitGroup
	work := make(chan piece)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for p := range work {
				widen(p.dst, p.src, p.dtype)
			}
		})
	}
	for _, p := range pieces {
		work <- p
	}
	close(work)
	wg.Wait()
}

type shardTensor struct {
	stTensor
	file string
}

// shard is one memory-mapped safetensors file.
type shard struct {
	name    string
	mem     []byte
	tensors map[string]stTensor
}

func (s *shard) close() error {
	if s.mem == nil {
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem = nil
	return err
}

// openShards maps and parses the checkpoint's files: the index's shards,
// or the single file.
func openShards(dir string) (_ []*shard, err error) {
	var names []string
	index := filepath.Join(dir, CheckpointIndex)
	b, err := os.ReadFile(index)
	switch {
	case err == nil:
		var f struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrCheckpoint, index, err)
		}
		if len(f.WeightMap) == 0 {
			return nil, fmt.Errorf("%w: %s has no weight_map", ErrCheckpoint, index)
		}
		for tensor, file := range f.WeightMap {
			if !filepath.IsLocal(file) || filepath.Base(file) != file {
				return nil, fmt.Errorf("%w: %s names shard %q for tensor %s, not a file of the directory", ErrCheckpoint, index, file, tensor)
			}
			names = append(names, file)
		}
		sort.Strings(names)
		names = slices.Compact(names)
	case errors.Is(err, os.ErrNotExist):
		names = []string{CheckpointFile}
		if _, err := os.Stat(filepath.Join(dir, CheckpointFile)); err != nil {
			return nil, fmt.Errorf("%w: %s has neither %s nor %s", ErrCheckpoint, dir, CheckpointFile, CheckpointIndex)
		}
	default:
		return nil, fmt.Errorf("prefill: %w", err)
	}
	var shards []*shard
	defer func() {
		if err != nil {
			for _, s := range shards {
				s.close()
			}
		}
	}()
	for _, name := range names {
		s, err := mapShard(dir, name)
		if err != nil {
			return nil, err
		}
		shards = append(shards, s)
	}
	return shards, nil
}

// mapShard maps one safetensors file read-only and checks it whole (a
// truncated file fails here: its tensors do not cover what the header says).
func mapShard(dir, name string) (*shard, error) {
	path := filepath.Join(dir, name)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: shard %s is missing", ErrCheckpoint, path)
	}
	if err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	s := &shard{name: name}
	if st.Size() > 0 {
		if s.mem, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED); err != nil {
			return nil, fmt.Errorf("prefill: map %s: %w", path, err)
		}
		_ = unix.Madvise(s.mem, unix.MADV_SEQUENTIAL)
	}
	if s.tensors, _, err = parseSafetensors(s.mem); err != nil {
		s.close()
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return s, nil
}

// mapFloats returns n float32s in an anonymous mapping, zeroed.
func mapFloats(n int) ([]float32, error) {
	if n == 0 {
		return nil, nil
	}
	b, err := unix.Mmap(-1, 0, 4*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n), nil
}

func unmapFloats(f []float32) error {
	if len(f) == 0 {
		return nil
	}
	return unix.Munmap(unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f)))
}

// WeightBytes returns the host memory the weights of c take once loaded:
// every parameter in float32, the LM head once more unless tied.
func (c Config) WeightBytes(tied bool) int64 {
	w := &Weights{Layers: make([]LayerWeights, c.Layers)}
	var n int64
	for _, t := range c.tensors(w) {
		if t.name == "lm_head.weight" && tied {
			continue
		}
		n += int64(t.elems())
	}
	return 4 * n
}
