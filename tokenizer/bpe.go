package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// ErrFormat is wrapped by the errors of a tokenizer.json Load cannot use.
var ErrFormat = errors.New("tokenizer: unsupported tokenizer.json")

// BPE is a Hugging Face tokenizer.json with a BPE model, in either of its
// two common shapes: byte-level (GPT-2, Llama 3, Qwen: bytes mapped to
// printable characters, a regex split into words) or SentencePiece-style
// (Llama 2, Mistral: spaces as the ▁ metaspace, merges over Unicode
// characters, bytes as <0xXX> tokens for what the vocabulary lacks). It
// runs the file's pipeline: added tokens matched verbatim first, then on
// the text between them the normalizer (Sequence, Prepend, Replace, NFC),
// the pre-tokenizer (Sequence, Split, ByteLevel, Metaspace, Digits) and the
// model (ranked merges, ignore_merges, byte_fallback, unk), and back the
// decoder (ByteLevel, Replace, ByteFallback, Fuse, Strip). Prompt adds what
// the post-processor puts around a single sequence (a BOS). It is safe for
// concurrent use.
type BPE struct {
	vocab map[string]uint32
	byID  map[uint32]string
	ranks map[[2]string]int
	// added are the added tokens, longest first, so that one that contains
	// another wins at the same position.
	added   []string
	addedID map[string]uint32
	special map[uint32]bool

	norm         []normStep
	pre          []preStep
	byteLevel    bool // symbols are bytes mapped by byteRune
	byteFallback bool
	ignoreMerges bool
	unk          *uint32
	fuseUnk      bool
	// prompt is the post-processor's single-sequence template: ids before
	// and after the text.
	promptPre, promptPost []uint32

	mu    sync.Mutex
	cache map[string][]uint32 // word → ids, bounded by maxCache
}

var _ Tokenizer = (*BPE)(nil)

const maxCache = 1 << 16

// Load reads a tokenizer.json.
func Load(path string) (*BPE, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return t, nil
}

type normStep struct {
	kind          string // prepend, replace, nfc
	from, to, pre string
}

type preStep struct {
	kind    string // split, bytelevel, metaspace, digits
	re      *regexp2.Regexp
	behave  string // Split: Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous
	invert  bool
	prefix  bool   // ByteLevel add_prefix_space
	regex   bool   // ByteLevel use_regex
	repl    string // Metaspace replacement
	prepend string // Metaspace prepend_scheme: always, first, never
	split   bool   // Metaspace split
}

type jsonAny = map[string]json.RawMessage

func field[T any](m jsonAny, key string, def T) T {
	v := def
	if raw, ok := m[key]; ok && string(raw) != "null" {
		_ = json.Unmarshal(raw, &v)
	}
	return v
}

func typeOf(m jsonAny) string { return field(m, "type", "") }

// Parse is Load of the file's bytes.
func Parse(b []byte) (*BPE, error) {
	var f struct {
		AddedTokens []struct {
			ID      uint32 `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Normalizer    jsonAny `json:"normalizer"`
		PreTokenizer  jsonAny `json:"pre_tokenizer"`
		Decoder       jsonAny `json:"decoder"`
		PostProcessor jsonAny `json:"post_processor"`
		Model         struct {
			Type         string            `json:"type"`
			Vocab        map[string]uint32 `json:"vocab"`
			Merges       []json.RawMessage `json:"merges"`
			ByteFallback bool              `json:"byte_fallback"`
			IgnoreMerges bool              `json:"ignore_merges"`
			FuseUnk      bool              `json:"fuse_unk"`
			UnkToken     *string           `json:"unk_token"`
		} `json:"model"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	if f.Model.Type != "BPE" {
		return nil, fmt.Errorf("%w: model type %q, want BPE", ErrFormat, f.Model.Type)
	}
	t := &BPE{vocab: f.Model.Vocab, byID: make(map[uint32]string, len(f.Model.Vocab)), ranks: make(map[[2]string]int, len(f.Model.Merges)),
		addedID: map[string]uint32{}, special: map[uint32]bool{}, cache: map[string][]uint32{},
		byteFallback: f.Model.ByteFallback, ignoreMerges: f.Model.IgnoreMerges, fuseUnk: f.Model.FuseUnk}
	if t.vocab == nil {
		t.vocab = map[string]uint32{}
	}
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
		if a.Content == "" {
			return nil, fmt.Errorf("%w: added token %d is empty", ErrFormat, a.ID)
		}
		t.byID[a.ID] = a.Content
		t.vocab[a.Content] = a.ID
		t.addedID[a.Content] = a.ID
		t.added = append(t.added, a.Content)
		if a.Special {
			t.special[a.ID] = true
		}
	}
	sort.Slice(t.added, func(i, j int) bool { return len(t.added[i]) > len(t.added[j]) })
	if f.Model.UnkToken != nil {
		if id, ok := t.vocab[*f.Model.UnkToken]; ok {
			t.unk = &id
		}
	}
	var err error
	if t.norm, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	for _, p := range t.pre {
		t.byteLevel = t.byteLevel || p.kind == "bytelevel"
	}
	if !t.byteLevel && containsType(f.Decoder, "ByteLevel") {
		t.byteLevel = true // a ByteLevel decoder alone: the words are mapped as GPT-2's
		t.pre = append(t.pre, preStep{kind: "bytelevel"})
	}
	if t.byteLevel {
		for b := range 256 {
			if _, ok := t.vocab[string(byteRune[b])]; !ok {
				return nil, fmt.Errorf("%w: the vocabulary lacks byte %#x (%q): not byte-level", ErrFormat, b, byteRune[b])
			}
		}
	} else if !t.byteFallback && t.unk == nil {
		return nil, fmt.Errorf("%w: neither byte-level, nor byte_fallback, nor an unk_token: some text has no tokens", ErrFormat)
	}
	if t.byteFallback {
		for b := range 256 {
			if _, ok := t.vocab[fmt.Sprintf("<0x%02X>", b)]; !ok {
				return nil, fmt.Errorf("%w: byte_fallback without the byte token <0x%02X>", ErrFormat, b)
			}
		}
	}
	if t.promptPre, t.promptPost, err = parsePostProcessor(f.PostProcessor, t.vocab); err != nil {
		return nil, err
	}
	return t, nil
}

// containsType reports whether the component m, or one of a Sequence's,
// has type typ.
func containsType(m jsonAny, typ string) bool {
	if typeOf(m) == typ {
		return true
	}
	for _, key := range []string{"normalizers", "pretokenizers", "decoders", "processors"} {
		for _, sub := range field[[]jsonAny](m, key, nil) {
			if containsType(sub, typ) {
				return true
			}
		}
	}
	return false
}

func parseNormalizer(m jsonAny) ([]normStep, error) {
	switch typ := typeOf(m); typ {
	case "":
		return nil, nil
	case "Sequence":
		var out []normStep
		for _, sub := range field[[]jsonAny](m, "normalizers", nil) {
			steps, err := parseNormalizer(sub)
			if err != nil {
				return nil, err
			}
			out = append(out, steps...)
		}
		return out, nil
	case "Prepend":
		return []normStep{{kind: "prepend", pre: field(m, "prepend", "")}}, nil
	case "Replace":
		pat := field[jsonAny](m, "pattern", nil)
		from, ok := pat["String"]
		if !ok {
			return nil, fmt.Errorf("%w: a Replace normalizer with a regex pattern", ErrFormat)
		}
		var s string
		_ = json.Unmarshal(from, &s)
		return []normStep{{kind: "replace", from: s, to: field(m, "content", "")}}, nil
	case "NFC":
		return []normStep{{kind: "nfc"}}, nil
	default:
		return nil, fmt.Errorf("%w: normalizer %s", ErrFormat, typ)
	}
}

func parsePreTokenizer(m jsonAny) ([]preStep, error) {
	switch typ := typeOf(m); typ {
	case "":
		return nil, nil
	case "Sequence":
		var out []preStep
		for _, sub := range field[[]jsonAny](m, "pretokenizers", nil) {
			steps, err := parsePreTokenizer(sub)
			if err != nil {
				return nil, err
			}
			out = append(out, steps...)
		}
		return out, nil
	case "Split":
		pat := field[jsonAny](m, "pattern", nil)
		var expr string
		if raw, ok := pat["Regex"]; ok {
			_ = json.Unmarshal(raw, &expr)
		} else if raw, ok := pat["String"]; ok {
			var s string
			_ = json.Unmarshal(raw, &s)
			expr = regexp2.Escape(s)
		}
		re, err := regexp2.Compile(expr, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("%w: Split pattern %q: %w", ErrFormat, expr, err)
		}
		behave := field(m, "behavior", "Isolated")
		switch behave {
		case "Isolated", "Removed", "MergedWithPrevious", "MergedWithNext":
		default:
			return nil, fmt.Errorf("%w: Split behavior %s", ErrFormat, behave)
		}
		return []preStep{{kind: "split", re: re, behave: behave, invert: field(m, "invert", false)}}, nil
	case "ByteLevel":
		return []preStep{{kind: "bytelevel", prefix: field(m, "add_prefix_space", false), regex: field(m, "use_regex", true)}}, nil
	case "Metaspace":
		scheme := field(m, "prepend_scheme", "")
		if scheme == "" {
			scheme = "never"
			if field(m, "add_prefix_space", true) {
				scheme = "always"
			}
		}
		return []preStep{{kind: "metaspace", repl: field(m, "replacement", "▁"), prepend: scheme, split: field(m, "split", true)}}, nil
	case "Digits":
		if !field(m, "individual_digits", false) {
			return nil, fmt.Errorf("%w: Digits without individual_digits", ErrFormat)
		}
		return []preStep{{kind: "digits"}}, nil
	default:
		return nil, fmt.Errorf("%w: pre-tokenizer %s", ErrFormat, typ)
	}
}

// parsePostProcessor reads the ids a TemplateProcessing puts around a
// single sequence ($A); other post-processors add none.
func parsePostProcessor(m jsonAny, vocab map[string]uint32) (pre, post []uint32, err error) {
	if typeOf(m) == "Sequence" {
		for _, sub := range field[[]jsonAny](m, "processors", nil) {
			if typeOf(sub) == "TemplateProcessing" {
				return parsePostProcessor(sub, vocab)
			}
		}
		return nil, nil, nil
	}
	if typeOf(m) != "TemplateProcessing" {
		return nil, nil, nil
	}
	var single []struct {
		Special  *struct{ ID string } `json:"SpecialToken"`
		Sequence *struct{ ID string } `json:"Sequence"`
	}
	_ = json.Unmarshal(m["single"], &single)
	seen := false
	for _, s := range single {
		switch {
		case s.Sequence != nil:
			seen = true
		case s.Special != nil:
			id, ok := vocab[s.Special.ID]
			if !ok {
				return nil, nil, fmt.Errorf("%w: the post-processor adds %q, which is not a token", ErrFormat, s.Special.ID)
			}
			if seen {
				post = append(post, id)
			} else {
				pre = append(pre, id)
			}
		}
	}
	return pre, post, nil
}

// Special implements Tokenizer: the id of an added token marked special.
func (t *BPE) Special(content string) (uint32, bool) {
	id, ok := t.addedID[content]
	return id, ok && t.special[id]
}

// Token returns the id of a token of the vocabulary, added ones included.
func (t *BPE) Token(content string) (uint32, bool) {
	id, ok := t.vocab[content]
	return id, ok
}

// Prompt encodes text as a whole prompt: Encode, with what the
// post-processor adds around a single sequence (Llama's BOS).
func (t *BPE) Prompt(text string) []uint32 {
	out := append([]uint32(nil), t.promptPre...)
	out = append(out, t.Encode(text)...)
	return append(out, t.promptPost...)
}

// Encode implements Tokenizer: added tokens written in text are their ids;
// nothing is added around it.
func (t *BPE) Encode(text string) []uint32 {
	var out []uint32
	first := true
	for len(text) > 0 {
		at, which := len(text), ""
		for _, s := range t.added {
			if i := strings.Index(text[:min(len(text), at+len(s))], s); i >= 0 && i < at {
				at, which = i, s
			}
		}
		if at > 0 {
			for _, w := range t.words(text[:at], first) {
				out = append(out, t.word(w)...)
			}
		}
		first = false
		if which == "" {
			break
		}
		out = append(out, t.addedID[which])
		text = text[at+len(which):]
	}
	return out
}

// words normalizes and pre-tokenizes one stretch of text between added
// tokens; first says it starts the input (Metaspace's "first" scheme).
func (t *BPE) words(text string, first bool) []string {
	for _, n := range t.norm {
		switch n.kind {
		case "prepend":
			if text != "" {
				text = n.pre + text
			}
		case "replace":
			text = strings.ReplaceAll(text, n.from, n.to)
		case "nfc":
			text = norm.NFC.String(text)
		}
	}
	words := []string{text}
	for _, p := range t.pre {
		var next []string
		for _, w := range words {
			next = append(next, p.apply(w, first)...)
		}
		words = next
	}
	return words
}

func (p preStep) apply(w string, first bool) []string {
	switch p.kind {
	case "split":
		return p.splitRegex(w)
	case "bytelevel":
		parts := []string{w}
		if p.prefix && w != "" && w[0] != ' ' {
			parts[0] = " " + w
		}
		if p.regex {
			parts = split(parts[0])
		}
		for i, s := range parts {
			var b strings.Builder
			for j := range len(s) {
				b.WriteRune(byteRune[s[j]])
			}
			parts[i] = b.String()
		}
		return parts
	case "metaspace":
		w = strings.ReplaceAll(w, " ", p.repl)
		if (p.prepend == "always" || p.prepend == "first" && first) && !strings.HasPrefix(w, p.repl) {
			w = p.repl + w
		}
		if !p.split {
			return []string{w}
		}
		// Cut before each metaspace but a leading one (MergedWithNext).
		var out []string
		start := 0
		for i := 0; i < len(w); {
			j := strings.Index(w[i:], p.repl)
			if j < 0 {
				break
			}
			if at := i + j; at > start {
				out = append(out, w[start:at])
				start = at
			}
			i += j + len(p.repl)
		}
		return append(out, w[start:])
	case "digits":
		var out []string
		start := 0
		for i := range len(w) {
			if isDigit(w[i]) {
				if i > start {
					out = append(out, w[start:i])
				}
				out = append(out, w[i:i+1])
				start = i + 1
			}
		}
		if start < len(w) {
			out = append(out, w[start:])
		}
		return out
	}
	return []string{w}
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }

// splitRegex cuts w at the pattern's matches, as Split's behavior says.
func (p preStep) splitRegex(w string) []string {
	idx, err := p.re.FindAllStringIndex(w, -1)
	if err != nil { // only a timeout, and there is none
		panic(fmt.Sprintf("tokenizer: split: %v", err))
	}
	type piece struct {
		s     string
		match bool
	}
	var pieces []piece
	at := 0
	for _, m := range idx {
		if m[0] > at {
			pieces = append(pieces, piece{w[at:m[0]], false})
		}
		if m[1] > m[0] {
			pieces = append(pieces, piece{w[m[0]:m[1]], true})
		}
		at = m[1]
	}
	if at < len(w) {
		pieces = append(pieces, piece{w[at:], false})
	}
	var out []string
	for i := 0; i < len(pieces); i++ {
		pc := pieces[i]
		delim := pc.match != p.invert
		switch {
		case !delim || p.behave == "Isolated":
			out = append(out, pc.s)
		case p.behave == "Removed":
		case p.behave == "MergedWithPrevious":
			if len(out) > 0 {
				out[len(out)-1] += pc.s
			} else {
				out = append(out, pc.s)
			}
		case p.behave == "MergedWithNext":
			if i+1 < len(pieces) {
				pieces[i+1].s = pc.s + pieces[i+1].s
			} else {
				out = append(out, pc.s)
			}
		}
	}
	return out
}

// word returns the ids of one pre-tokenized word.
func (t *BPE) word(w string) []uint32 {
	if w == "" {
		return nil
	}
	t.mu.Lock()
	ids, ok := t.cache[w]
	t.mu.Unlock()
	if ok {
		return ids
	}
	if id, ok := t.vocab[w]; ok && t.ignoreMerges {
		return []uint32{id}
	}
	syms := make([]string, 0, len(w))
	for _, r := range w {
		syms = append(syms, string(r))
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
	lastUnk := false
	for _, s := range syms {
		if id, ok := t.vocab[s]; ok {
			ids = append(ids, id)
			lastUnk = false
			continue
		}
		switch {
		case t.byteLevel:
			for _, r := range s { // a merge result missing from the vocabulary: its bytes
				ids = append(ids, t.vocab[string(r)])
			}
		case t.byteFallback:
			for i := range len(s) {
				ids = append(ids, t.vocab[fmt.Sprintf("<0x%02X>", s[i])])
			}
		case t.unk != nil && !(t.fuseUnk && lastUnk):
			ids = append(ids, *t.unk)
			lastUnk = true
		}
	}
	t.mu.Lock()
	if len(t.cache) < maxCache {
		t.cache[w] = ids
	}
	t.mu.Unlock()
	return ids
}

// Decode implements Tokenizer: special tokens are left out; the metaspace
// is a space again and <0xXX> tokens their byte. Nothing is stripped, so
// that decoding in pieces gives the bytes of the whole: a SentencePiece
// model's text keeps the space its first word starts with.
func (t *BPE) Decode(ids []uint32) []byte {
	var out []byte
	for _, id := range ids {
		s, ok := t.byID[id]
		if !ok || t.special[id] {
			continue
		}
		if _, added := t.addedID[s]; added {
			out = append(out, s...)
			continue
		}
		if t.byteLevel {
			for _, r := range s {
				if b, ok := runeByte[r]; ok {
					out = append(out, b)
				} else {
					out = utf8.AppendRune(out, r)
				}
			}
			continue
		}
		if len(s) == 6 && strings.HasPrefix(s, "<0x") && s[5] == '>' {
			if b, err := strconv.ParseUint(s[3:5], 16, 8); err == nil {
				out = append(out, byte(b))
				continue
			}
		}
		out = append(out, strings.ReplaceAll(s, "▁", " ")...)
	}
	return out
}
