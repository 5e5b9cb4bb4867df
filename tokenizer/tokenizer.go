// Package tokenizer turns text into token ids and back for the bundled
// engine: Bytes, the default (each UTF-8 byte one token id), and BPE, a
// Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2, Llama 3,
// Qwen): bytes mapped to printable characters, a GPT-2-style split into
// words, ranked merges within each word, and special tokens matched
// verbatim in the text. It imports nothing of kvmesh's.
//
// What BPE does not do: normalizers, a pre-tokenizer other than GPT-2's
// split (Llama 3's regex differs in digits and case-insensitive
// contractions), and tokenizer_config.json's Jinja chat templates; a
// chat template is chosen by the caller (ChatML when the vocabulary has
// <|im_start|> and <|im_end|>).
package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
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

// ErrFormat is wrapped by the errors of a tokenizer.json Load cannot use.
var ErrFormat = errors.New("tokenizer: unsupported tokenizer.json")

// BPE is a byte-level BPE tokenizer read from a tokenizer.json. It is safe
// for concurrent use.
type BPE struct {
	vocab   map[string]uint32
	byID    map[uint32]string
	ranks   map[[2]string]int
	special map[string]uint32 // content → id
	isSpec  map[uint32]bool
	// specials sorted longest first, so that a special token that
	// contains another wins.
	specials []string

	mu    sync.Mutex
	cache map[string][]uint32 // word → ids, bounded by maxCache
}

var _ Tokenizer = (*BPE)(nil)

const maxCache = 1 << 16

// Load reads a tokenizer.json of model type BPE with a ByteLevel
// pre-tokenizer or decoder.
func Load(path string) (*BPE, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return Parse(b)
}

// Parse is Load of the file's bytes.
func Parse(b []byte) (*BPE, error) {
	var f struct {
		AddedTokens []struct {
			ID      uint32 `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		PreTokenizer json.RawMessage `json:"pre_tokenizer"`
		Decoder      json.RawMessage `json:"decoder"`
		Model        struct {
			Type   string            `json:"type"`
			Vocab  map[string]uint32 `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	if f.Model.Type != "BPE" {
		return nil, fmt.Errorf("%w: model type %q, want BPE", ErrFormat, f.Model.Type)
	}
	if !bytes.Contains(f.PreTokenizer, []byte(`"ByteLevel"`)) && !bytes.Contains(f.Decoder, []byte(`"ByteLevel"`)) {
		return nil, fmt.Errorf("%w: not byte-level (no ByteLevel pre-tokenizer or decoder)", ErrFormat)
	}
	t := &BPE{vocab: f.Model.Vocab, byID: make(map[uint32]string, len(f.Model.Vocab)), ranks: make(map[[2]string]int, len(f.Model.Merges)),
		special: map[string]uint32{}, isSpec: map[uint32]bool{}, cache: map[string][]uint32{}}
	for s, id := range t.vocab {
		t.byID[id] = s
	}
	for i, m := range f.Model.Merges {
		var pair [2]string
		var s string
		var arr []string
		switch {
		case json.Unmarshal(m, &s) == nil:
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("%w: merge %d %q is not two symbols", ErrFormat, i, s)
			}
			pair = [2]string{a, b}
		case json.Unmarshal(m, &arr) == nil && len(arr) == 2:
			pair = [2]string{arr[0], arr[1]}
		default:
			return nil, fmt.Errorf("%w: merge %d is neither \"a b\" nor [a, b]", ErrFormat, i)
		}
		if _, dup := t.ranks[pair]; !dup {
			t.ranks[pair] = i
		}
	}
	for _, a := range f.AddedTokens {
		t.byID[a.ID] = a.Content
		t.vocab[a.Content] = a.ID
		if a.Special {
			t.special[a.Content] = a.ID
			t.isSpec[a.ID] = true
			t.specials = append(t.specials, a.Content)
		}
	}
	sort.Slice(t.specials, func(i, j int) bool { return len(t.specials[i]) > len(t.specials[j]) })
	for b := range 256 {
		if _, ok := t.vocab[string(byteRune[b])]; !ok {
			return nil, fmt.Errorf("%w: the vocabulary lacks byte %#x (%q): not byte-level", ErrFormat, b, byteRune[b])
		}
	}
	return t, nil
}

// Special implements Tokenizer.
func (t *BPE) Special(content string) (uint32, bool) {
	id, ok := t.special[content]
	return id, ok
}

// Encode implements Tokenizer.
func (t *BPE) Encode(text string) []uint32 {
	var out []uint32
	for len(text) > 0 {
		// The next special token, if any, ends this stretch of text.
		at, which := len(text), ""
		for _, s := range t.specials {
			if i := strings.Index(text, s); i >= 0 && i < at {
				at, which = i, s
			}
		}
		for _, w := range split(text[:at]) {
			out = append(out, t.word(w)...)
		}
		if which == "" {
			break
		}
		out = append(out, t.special[which])
		text = text[at+len(which):]
	}
	return out
}

// word returns the ids of one pre-tokenized word.
func (t *BPE) word(w string) []uint32 {
	t.mu.Lock()
	ids, ok := t.cache[w]
	t.mu.Unlock()
	if ok {
		return ids
	}
	syms := make([]string, len(w))
	for i := range len(w) {
		syms[i] = string(byteRune[w[i]])
	}
	for len(syms) > 1 {
		best, at := -1, -1
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := t.ranks[[2]string{syms[i], syms[i+1]}]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		a, b := syms[at], syms[at+1]
		merged := syms[:0:0]
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && syms[i] == a && syms[i+1] == b {
				merged = append(merged, a+b)
				i++
				continue
			}
			merged = append(merged, syms[i])
		}
		syms = merged
	}
	ids = make([]uint32, 0, len(syms))
	for _, s := range syms {
		if id, ok := t.vocab[s]; ok {
			ids = append(ids, id)
			continue
		}
		for _, r := range s { // a merge result missing from the vocabulary: its bytes
			ids = append(ids, t.vocab[string(r)])
		}
	}
	t.mu.Lock()
	if len(t.cache) < maxCache {
		t.cache[w] = ids
	}
	t.mu.Unlock()
	return ids
}

// Decode implements Tokenizer.
func (t *BPE) Decode(ids []uint32) []byte {
	var out []byte
	for _, id := range ids {
		s, ok := t.byID[id]
		if !ok || t.isSpec[id] {
			continue
		}
		for _, r := range s {
			if b, ok := runeByte[r]; ok {
				out = append(out, b)
			} else {
				out = utf8.AppendRune(out, r) // an added token written as plain text
			}
		}
	}
	return out
}

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
