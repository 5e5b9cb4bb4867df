// Package tokenizer turns text into token ids and back for the bundled
// engine: Bytes, the default (each UTF-8 byte one token id), and BPE, a
// Hugging Face tokenizer.json with a BPE model, byte-level (GPT-2, Llama 3,
// Qwen) or SentencePiece-style (Llama 2, Mistral: the ▁ metaspace and byte
// fallback). Dir is a model directory's tokenizer: its tokenizer.json,
// and tokenizer_config.json's chat template (rendered by a Jinja engine,
// github.com/ardanlabs/jinja, as transformers renders it), BOS and EOS.
// It imports nothing of kvmesh's.
package tokenizer

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Tokenizer encodes text as token ids and decodes them back to bytes.
type Tokenizer interface {
	// Encode returns text's token ids; special tokens written in text are
	// their ids.
	Encode(text string) []uint32
	// Decode returns the bytes of ids, special tokens and ids it does not
	// know left out. Decoding a sequence in pieces yields the bytes of the
	// whole.
	Decode(ids []uint32) []byte
	// Special returns the id of a special token, if the vocabulary has it.
	Special(content string) (uint32, bool)
}

// Bytes is the byte-level tokenizer: the UTF-8 bytes of text as ids 0..255.
type Bytes struct{}

var _ Tokenizer = Bytes{}

// Encode implements Tokenizer.
func (Bytes) Encode(text string) []uint32 {
	t := make([]uint32, len(text))
	for i := range len(text) {
		t[i] = uint32(text[i])
	}
	return t
}

// Decode implements Tokenizer: ids above 255 are not bytes and are left out.
func (Bytes) Decode(ids []uint32) []byte {
	b := make([]byte, 0, len(ids))
	for _, t := range ids {
		if t < 256 {
			b = append(b, byte(t))
		}
	}
	return b
}

// Special implements Tokenizer: Bytes has none.
func (Bytes) Special(string) (uint32, bool) { return 0, false }

// ByteSymbol returns the vocabulary symbol byte-level BPE writes byte b as
// (GPT-2's bytes_to_unicode): b itself when printable, else a rune from
// U+0100 on ("Ġ" for a space).
func ByteSymbol(b byte) string { return string(byteRune[b]) }

// byteRune maps each byte to the printable rune GPT-2's byte-level BPE
// writes it as; runeByte is its inverse.
var byteRune, runeByte = func() ([256]rune, map[rune]byte) {
	var br [256]rune
	rb := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			br[b] = rune(b)
		} else {
			br[b] = rune(256 + n)
			n++
		}
		rb[br[b]] = byte(b)
	}
	return br, rb
}()

// split is GPT-2's pre-tokenizer, written out instead of its regex (Go's
// regexp has no lookahead):
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func split(text string) []string {
	var words []string
	class := func(r rune) int {
		switch {
		case unicode.IsLetter(r):
			return 1
		case unicode.IsNumber(r):
			return 2
		case unicode.IsSpace(r):
			return 3
		}
		return 4
	}
	runeAt := func(i int) (rune, int) { return utf8.DecodeRuneInString(text[i:]) }
	run := func(i, c int) int { // end of the run of class c from i
		for i < len(text) {
			r, n := runeAt(i)
			if class(r) != c {
				break
			}
			i += n
		}
		return i
	}
	for i := 0; i < len(text); {
		if text[i] == '\'' {
			matched := false
			for _, c := range []string{"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"} {
				if strings.HasPrefix(text[i:], c) {
					words = append(words, c)
					i += len(c)
					matched = true
					break
				}
			}
			if matched {
				continue
			}
		}
		r, n := runeAt(i)
		c := class(r)
		if r == ' ' && i+1 < len(text) {
			if r2, _ := runeAt(i + 1); class(r2) != 3 {
				end := run(i+1, class(r2))
				words = append(words, text[i:end])
				i = end
				continue
			}
		}
		if c != 3 {
			end := run(i, c)
			words = append(words, text[i:end])
			i = end
			continue
		}
		end := run(i, 3)
		if end < len(text) && end-i > n {
			// \s+(?!\S): leave the last space to the word after it.
			_, last := utf8.DecodeLastRuneInString(text[i:end])
			end -= last
		}
		words = append(words, text[i:end])
		i = end
	}
	return slices.Clip(words)
}
