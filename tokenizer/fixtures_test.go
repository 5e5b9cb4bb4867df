package tokenizer_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/tokenizer"
)

// TestFixtures: for tokenizer.json files in the shapes of GPT-2, Llama 3,
// Qwen2 (byte-level) and Llama 2, Mistral (SentencePiece-style, legacy
// normalizer and Metaspace), Encode gives the ids an independent reference
// tokenizer gave (testdata/gen.py: OpenAI's bpe() and Hugging Face's
// pipeline written out in Python, merges from a tiny trainer), Decode its
// text, and Prompt adds the post-processor's BOS.
func TestFixtures(t *testing.T) {
	for _, name := range []string{"gpt2", "llama3", "qwen2", "llama2", "mistral"} {
		t.Run(name, func(t *testing.T) {
			tok, err := tokenizer.Load(filepath.Join("testdata", name, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join("testdata", name, "expected.json"))
			if err != nil {
				t.Fatal(err)
			}
			var f struct {
				BOS   *uint32
				Cases []struct {
					Text    string
					IDs     []uint32
					Decoded string
				}
			}
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatal(err)
			}
			for _, c := range f.Cases {
				got := tok.Encode(c.Text)
				if !slices.Equal(got, c.IDs) {
					t.Errorf("Encode(%q) = %v, want %v", c.Text, got, c.IDs)
				}
				if d := string(tok.Decode(c.IDs)); d != c.Decoded {
					t.Errorf("Decode(%v) = %q, want %q", c.IDs, d, c.Decoded)
				}
				p := tok.Prompt(c.Text)
				if f.BOS != nil && (len(p) == 0 || p[0] != *f.BOS || !slices.Equal(p[1:], got)) || f.BOS == nil && !slices.Equal(p, got) {
					t.Errorf("Prompt(%q) = %v, want BOS %v then Encode's", c.Text, p, f.BOS)
				}
			}
		})
	}
}
