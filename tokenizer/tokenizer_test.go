package tokenizer_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/tokenizer"
	"github.com/kvmesh/kvmesh/tokenizer/tokenizertest"
)

func TestBPE(t *testing.T) {
	tok, err := tokenizer.Parse(tokenizertest.File())
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode("hello world<|im_end|>!")
	end, _ := tok.Special("<|im_end|>")
	if want := []uint32{259, 264, end, '!'}; !slices.Equal(ids, want) {
		t.Errorf("Encode = %v, want %v (hello, Ġworld, <|im_end|>, !)", ids, want)
	}
	if got := string(tok.Decode(ids)); got != "hello world!" {
		t.Errorf("Decode = %q: special tokens are left out", got)
	}
	r := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"hello", " world", "  ", "\n\n", "héllo", "日本", "'s", "'ll", "42", "!?", " ", "\t", "\xff", "ld"}
	for range 300 {
		var s string
		for range 1 + r.IntN(8) {
			s += pieces[r.IntN(len(pieces))]
		}
		ids := tok.Encode(s)
		if got := string(tok.Decode(ids)); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
		// Decoding in pieces gives the same bytes.
		var b []byte
		for _, id := range ids {
			b = append(b, tok.Decode([]uint32{id})...)
		}
		if string(b) != s {
			t.Fatalf("piecewise decode of %q = %q", s, b)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"not json":     `{`,
		"wordpiece":    `{"model": {"type": "WordPiece"}}`,
		"no bytelevel": `{"model": {"type": "BPE", "vocab": {}}, "pre_tokenizer": {"type": "Whitespace"}}`,
		"no bytes":     `{"model": {"type": "BPE", "vocab": {"a": 0}}, "decoder": {"type": "ByteLevel"}}`,
	} {
		if _, err := tokenizer.Parse([]byte(doc)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}
