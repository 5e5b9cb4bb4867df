package kvevents

import (
	"errors"
	"math"
	"unicode/utf8"
)

// vllmExtraValue turns one extra key of a vllm-scheme block, a CBOR item as
// the block's hash covered it (prefixhash.VLLMText, VLLMMultimodalKey, ...),
// back into the value vLLM's engine publishes in extra_keys: a text string
// as a string (a LoRA name, a multimodal identifier), an array as an array
// ([identifier, offset]), bytes as bytes, an integer as an integer, null as
// nil. ok is false for anything else (the caller publishes the raw bytes).
func vllmExtraValue(b []byte) (v any, ok bool) {
	v, n, err := cborValue(b, 0)
	return v, err == nil && n == len(b)
}

var errCBORValue = errors.New("kvevents: not a CBOR item of an extra key")

func cborValue(b []byte, depth int) (any, int, error) {
	if depth > 8 || len(b) == 0 {
		return nil, 0, errCBORValue
	}
	major, info := b[0]>>5, b[0]&31
	if b[0] == 0xf6 {
		return nil, 1, nil
	}
	var arg uint64
	n := 1
	switch {
	case info < 24:
		arg = uint64(info)
	case info <= 27:
		w := 1 << (info - 24)
		if len(b) < 1+w {
			return nil, 0, errCBORValue
		}
		for _, c := range b[1 : 1+w] {
			arg = arg<<8 | uint64(c)
		}
		n += w
	default:
		return nil, 0, errCBORValue
	}
	switch major {
	case 0:
		if arg > math.MaxInt64 {
			return arg, n, nil
		}
		return int64(arg), n, nil
	case 1:
		if arg > math.MaxInt64 {
			return nil, 0, errCBORValue
		}
		return -1 - int64(arg), n, nil
	case 2, 3:
		if arg > uint64(len(b)-n) {
			return nil, 0, errCBORValue
		}
		s := b[n : n+int(arg)]
		if major == 3 {
			if !utf8.Valid(s) {
				return nil, 0, errCBORValue
			}
			return string(s), n + int(arg), nil
		}
		return append([]byte(nil), s...), n + int(arg), nil
	case 4:
		if arg > uint64(len(b)-n) { // every item takes a byte at least
			return nil, 0, errCBORValue
		}
		items := make([]any, 0, arg)
		for range arg {
			v, m, err := cborValue(b[n:], depth+1)
			if err != nil {
				return nil, 0, err
			}
			items, n = append(items, v), n+m
		}
		return items, n, nil
	}
	return nil, 0, errCBORValue
}
