// Package tokenizertest writes small tokenizer files for tests.
package tokenizertest

import (
	"encoding/json"
	"fmt"

	"github.com/kvmesh/kvmesh/tokenizer"
)

// File returns a small byte-level BPE tokenizer.json: ids 0..255 are the
// bytes, 256..264 are merges that spell "hello" (259) and " world" (264),
// and 265 and 266 are the special tokens <|im_start|> and <|im_end|>.
func File() []byte {
	vocab := map[string]uint32{}
	for b := range 256 {
		vocab[tokenizer.ByteSymbol(byte(b))] = uint32(b)
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"}
	next := uint32(256)
	for _, m := range []string{"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld"} {
		vocab[m] = next
		next++
	}
	doc := map[string]any{
		"version":       "1.0",
		"added_tokens":  []map[string]any{{"id": next, "content": "<|im_start|>", "special": true}, {"id": next + 1, "content": "<|im_end|>", "special": true}},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(fmt.Sprintf("tokenizertest: %v", err))
	}
	return b
}

// Vocab is the size of File's vocabulary.
const Vocab = 267
