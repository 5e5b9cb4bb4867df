package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Event tags: vLLM's msgspec tagged union names its classes.
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

// Event is one KV event as vLLM's kv_events.py defines it (a BlockStored,
// BlockRemoved or AllBlocksCleared): Tag says which, and the fields of the
// others are zero.
//
// Hashes are vLLM's ExternalBlockHash: bytes (kvmesh publishes a block's
// key under the kvmesh scheme, vLLM's own 32-byte hash under the vllm
// scheme), or an integer from a vLLM that publishes int hashes, which Decode
// turns into its 8 bytes, big-endian.
type Event struct {
	Tag         string
	BlockHashes [][]byte
	// BlockStored only.
	ParentBlockHash []byte // nil: the block starts its chain
	TokenIDs        []uint32
	BlockSize       int
	LoRAID          *int
	LoRAName        *string
	// ExtraKeys holds per block its extra keys (as vLLM's tuples, each
	// item as msgpack decoded it), nil when no block has any.
	ExtraKeys [][]any
	// KVCacheSpecKind and KVCacheSpecSlidingWindow classify a hybrid
	// model's group (vLLM's 2026 fields); empty and nil when none.
	KVCacheSpecKind          string
	KVCacheSpecSlidingWindow *int
	// BlockStored and BlockRemoved.
	Medium   string // "GPU", "CPU", "DISK"; empty: not said
	GroupIdx *int   // the KV-cache group; nil: none
}

// Batch is vLLM's KVEventBatch: a timestamp (seconds since the epoch) and
// events, in order. DataParallelRank is nil when not said.
type Batch struct {
	TS               float64
	Events           []Event
	DataParallelRank *int
}

// Encode appends b as vLLM's publisher sends it: msgspec's array_like
// encoding with omit_defaults (every field positional, trailing fields
// at their default left out; a struct of a tagged union starts with its
// tag). The batch always has its three fields, the data-parallel rank nil
// when not set: vLLM's publisher always sets it (its rank, 0 without data
// parallelism), and llm-d's indexer decodes the batch as exactly three.
func Encode(dst []byte, b *Batch) ([]byte, error) {
	var buf bytes.Buffer
	buf.Write(dst)
	e := msgpack.NewEncoder(&buf)
	must := func(err error) {
		if err != nil {
			panic(err) // a bytes.Buffer does not fail
		}
	}
	must(e.EncodeArrayLen(3))
	must(e.EncodeFloat64(b.TS))
	must(e.EncodeArrayLen(len(b.Events)))
	for k := range b.Events {
		if err := encodeEvent(e, &b.Events[k]); err != nil {
			return dst, fmt.Errorf("kvevents: event %d: %w", k, err)
		}
	}
	if b.DataParallelRank != nil {
		must(e.EncodeInt(int64(*b.DataParallelRank)))
	} else {
		must(e.EncodeNil())
	}
	return buf.Bytes(), nil
}

func encodeEvent(e *msgpack.Encoder, ev *Event) error {
	hashes := func() {
		_ = e.EncodeArrayLen(len(ev.BlockHashes))
		for _, h := range ev.BlockHashes {
			_ = e.EncodeBytes(h)
		}
	}
	optInt := func(v *int) {
		if v == nil {
			_ = e.EncodeNil()
		} else {
			_ = e.EncodeInt(int64(*v))
		}
	}
	optStr := func(s string, set bool) {
		if !set {
			_ = e.EncodeNil()
		} else {
			_ = e.EncodeString(s)
		}
	}
	switch ev.Tag {
	case TagBlockStored:
		// Fields after lora_name have defaults: encode up to the last set.
		n := 8
		switch {
		case ev.KVCacheSpecSlidingWindow != nil:
			n = 12
		case ev.KVCacheSpecKind != "":
			n = 11
		case ev.GroupIdx != nil:
			n = 10
		case ev.ExtraKeys != nil:
			n = 9
		}
		_ = e.EncodeArrayLen(n)
		_ = e.EncodeString(TagBlockStored)
		hashes()
		if ev.ParentBlockHash == nil {
			_ = e.EncodeNil()
		} else {
			_ = e.EncodeBytes(ev.ParentBlockHash)
		}
		_ = e.EncodeArrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			_ = e.EncodeUint(uint64(t))
		}
		_ = e.EncodeInt(int64(ev.BlockSize))
		optInt(ev.LoRAID)
		optStr(ev.Medium, ev.Medium != "")
		if ev.LoRAName == nil {
			_ = e.EncodeNil()
		} else {
			_ = e.EncodeString(*ev.LoRAName)
		}
		if n > 8 {
			if ev.ExtraKeys == nil {
				_ = e.EncodeNil()
			} else {
				_ = e.EncodeArrayLen(len(ev.ExtraKeys))
				for _, k := range ev.ExtraKeys {
					if k == nil {
						_ = e.EncodeNil()
						continue
					}
					if err := e.Encode(k); err != nil {
						return err
					}
				}
			}
		}
		if n > 9 {
			optInt(ev.GroupIdx)
		}
		if n > 10 {
			optStr(ev.KVCacheSpecKind, ev.KVCacheSpecKind != "")
		}
		if n > 11 {
			optInt(ev.KVCacheSpecSlidingWindow)
		}
	case TagBlockRemoved:
		n := 3
		if ev.GroupIdx != nil {
			n = 4
		}
		_ = e.EncodeArrayLen(n)
		_ = e.EncodeString(TagBlockRemoved)
		hashes()
		optStr(ev.Medium, ev.Medium != "")
		if n > 3 {
			optInt(ev.GroupIdx)
		}
	case TagAllBlocksCleared:
		_ = e.EncodeArrayLen(1)
		_ = e.EncodeString(TagAllBlocksCleared)
	default:
		return fmt.Errorf("unknown event tag %q", ev.Tag)
	}
	return nil
}

// ErrMalformed is wrapped by every error Decode returns.
var ErrMalformed = errors.New("kvevents: malformed event batch")

// MaxPayload bounds the payload Decode takes.
const MaxPayload = 64 << 20

// Decode parses a batch as vLLM's subscribers do: positional fields with
// length guards, so that a batch from an older vLLM (fewer trailing fields)
// or a newer one (more) decodes. An unknown event tag is an error.
func Decode(payload []byte) (Batch, error) {
	var b Batch
	if len(payload) > MaxPayload {
		return b, fmt.Errorf("%w: %d bytes", ErrMalformed, len(payload))
	}
	if err := checkShape(payload); err != nil {
		return b, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	top, err := d.DecodeInterface()
	if err != nil {
		return b, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	fields, ok := top.([]any)
	if !ok || len(fields) < 2 {
		return b, fmt.Errorf("%w: not an array of at least 2 fields", ErrMalformed)
	}
	if b.TS, ok = toFloat(fields[0]); !ok {
		return b, fmt.Errorf("%w: ts is %T", ErrMalformed, fields[0])
	}
	evs, ok := fields[1].([]any)
	if !ok {
		return b, fmt.Errorf("%w: events is %T", ErrMalformed, fields[1])
	}
	if len(fields) > 2 && fields[2] != nil {
		r, ok := toInt(fields[2])
		if !ok {
			return b, fmt.Errorf("%w: data_parallel_rank is %T", ErrMalformed, fields[2])
		}
		b.DataParallelRank = &r
	}
	b.Events = make([]Event, 0, len(evs))
	for k, raw := range evs {
		ev, err := decodeEvent(raw)
		if err != nil {
			return b, fmt.Errorf("%w: event %d: %w", ErrMalformed, k, err)
		}
		b.Events = append(b.Events, ev)
	}
	return b, nil
}

// maxDepth bounds the nesting of a payload's arrays and maps: a batch
// nests five deep (batch, events, event, extra keys, a key's tuple).
const maxDepth = 32

// checkShape walks the msgpack value of payload without building it and
// fails when an array or map claims more elements than bytes are left
// (each takes one at least), or nests past maxDepth. msgpack's
// DecodeInterface allocates what a length claims before reading an
// element (a 5-byte array or map header could ask for gigabytes) and
// recurses once per level, so Decode checks first.
func checkShape(payload []byte) error {
	r := bytes.NewReader(payload)
	d := msgpack.NewDecoder(r)
	var walk func(depth int) error
	walk = func(depth int) error {
		c, err := d.PeekCode()
		if err != nil {
			return err
		}
		var n int
		switch {
		case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
			n, err = d.DecodeArrayLen()
		case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
			n, err = d.DecodeMapLen()
			n *= 2
		default:
			return d.Skip()
		}
		switch {
		case err != nil:
			return err
		case depth >= maxDepth:
			return fmt.Errorf("nested deeper than %d", maxDepth)
		case n > r.Len():
			return fmt.Errorf("%d elements claimed with %d bytes left", n, r.Len())
		}
		for range n {
			if err := walk(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(0)
}

func decodeEvent(raw any) (Event, error) {
	var ev Event
	f, ok := raw.([]any)
	if !ok || len(f) < 1 {
		return ev, errors.New("not a tagged array")
	}
	if ev.Tag, ok = f[0].(string); !ok {
		return ev, fmt.Errorf("tag is %T", f[0])
	}
	at := func(i int) any {
		if i < len(f) {
			return f[i]
		}
		return nil
	}
	var err error
	switch ev.Tag {
	case TagBlockStored:
		if len(f) < 5 {
			return ev, fmt.Errorf("BlockStored of %d fields", len(f))
		}
		if ev.BlockHashes, err = hashes(f[1]); err != nil {
			return ev, err
		}
		if f[2] != nil {
			if ev.ParentBlockHash, err = hashOf(f[2]); err != nil {
				return ev, fmt.Errorf("parent_block_hash: %w", err)
			}
		}
		toks, ok := f[3].([]any)
		if !ok {
			return ev, fmt.Errorf("token_ids is %T", f[3])
		}
		ev.TokenIDs = make([]uint32, len(toks))
		for i, t := range toks {
			v, ok := toInt(t)
			if !ok || v < 0 || v > 1<<32-1 {
				return ev, fmt.Errorf("token_ids[%d] is %v", i, t)
			}
			ev.TokenIDs[i] = uint32(v)
		}
		if ev.BlockSize, ok = toInt(f[4]); !ok {
			return ev, fmt.Errorf("block_size is %T", f[4])
		}
		if ev.LoRAID, err = optInt(at(5), "lora_id"); err != nil {
			return ev, err
		}
		if ev.Medium, err = optStr(at(6), "medium"); err != nil {
			return ev, err
		}
		if v := at(7); v != nil {
			s, ok := v.(string)
			if !ok {
				return ev, fmt.Errorf("lora_name is %T", v)
			}
			ev.LoRAName = &s
		}
		if v := at(8); v != nil {
			ks, ok := v.([]any)
			if !ok {
				return ev, fmt.Errorf("extra_keys is %T", v)
			}
			ev.ExtraKeys = make([][]any, len(ks))
			for i, k := range ks {
				if k == nil {
					continue
				}
				if ev.ExtraKeys[i], ok = k.([]any); !ok {
					return ev, fmt.Errorf("extra_keys[%d] is %T", i, k)
				}
			}
		}
		if ev.GroupIdx, err = optInt(at(9), "group_idx"); err != nil {
			return ev, err
		}
		if ev.KVCacheSpecKind, err = optStr(at(10), "kv_cache_spec_kind"); err != nil {
			return ev, err
		}
		if ev.KVCacheSpecSlidingWindow, err = optInt(at(11), "kv_cache_spec_sliding_window"); err != nil {
			return ev, err
		}
	case TagBlockRemoved:
		if len(f) < 2 {
			return ev, fmt.Errorf("BlockRemoved of %d fields", len(f))
		}
		if ev.BlockHashes, err = hashes(f[1]); err != nil {
			return ev, err
		}
		if ev.Medium, err = optStr(at(2), "medium"); err != nil {
			return ev, err
		}
		if ev.GroupIdx, err = optInt(at(3), "group_idx"); err != nil {
			return ev, err
		}
	case TagAllBlocksCleared:
	default:
		return ev, fmt.Errorf("unknown tag %q", ev.Tag)
	}
	return ev, nil
}

func hashes(v any) ([][]byte, error) {
	hs, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("block_hashes is %T", v)
	}
	out := make([][]byte, len(hs))
	for i, h := range hs {
		var err error
		if out[i], err = hashOf(h); err != nil {
			return nil, fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
	}
	return out, nil
}

// hashOf turns an ExternalBlockHash (bytes, or an int) into bytes.
func hashOf(v any) ([]byte, error) {
	switch h := v.(type) {
	case []byte:
		return h, nil
	case string: // msgpack str from an encoder that wrote bytes as str
		return []byte(h), nil
	}
	if n, ok := toInt64(v); ok {
		return binary.BigEndian.AppendUint64(nil, uint64(n)), nil
	}
	return nil, fmt.Errorf("hash is %T", v)
}

func optInt(v any, name string) (*int, error) {
	if v == nil {
		return nil, nil
	}
	n, ok := toInt(v)
	if !ok {
		return nil, fmt.Errorf("%s is %T", name, v)
	}
	return &n, nil
}

func optStr(v any, name string) (string, error) {
	if v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s is %T", name, v)
	}
	return s, nil
}

func toInt64(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		return int64(n), true
	}
	return 0, false
}

func toInt(v any) (int, bool) {
	n, ok := toInt64(v)
	return int(n), ok
}

func toFloat(v any) (float64, bool) {
	switch f := v.(type) {
	case float64:
		return f, true
	case float32:
		return float64(f), true
	}
	if n, ok := toInt64(v); ok {
		return float64(n), true
	}
	return 0, false
}
