package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ardanlabs/jinja"
)

// ErrTemplate is wrapped by the errors of a chat template: one that does
// not compile, and one that refuses a conversation (raise_exception) or
// fails while rendering it. The message is the template's.
var ErrTemplate = errors.New("tokenizer: chat template")

// Message is one message of a chat, as a template reads it.
type Message struct {
	Role    string
	Content string
}

// Dir is a model directory's tokenizer: tokenizer.json, and from
// tokenizer_config.json (or chat_template.jinja) the chat template and the
// BOS and EOS tokens. It is safe for concurrent use.
type Dir struct {
	*BPE
	template *jinja.Template // nil: the directory has none
	// vars are the special tokens a template may name (bos_token,
	// eos_token, unk_token, pad_token), as text.
	vars   map[string]any
	eos    []uint32
	addBOS bool // add_bos_token, when the post-processor adds no BOS
}

// LoadDir reads the tokenizer of a Hugging Face model directory. A
// directory without tokenizer_config.json has no chat template.
func LoadDir(dir string) (*Dir, error) {
	bpe, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	d := &Dir{BPE: bpe, vars: map[string]any{}}
	path := filepath.Join(dir, "tokenizer_config.json")
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var cfg map[string]json.RawMessage
	if err == nil {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrFormat, path, err)
		}
	}
	for _, key := range []string{"bos_token", "eos_token", "unk_token", "pad_token"} {
		if s, ok := tokenText(cfg[key]); ok {
			d.vars[key] = s
		}
	}
	if s, ok := d.vars["eos_token"].(string); ok {
		if id, ok := bpe.Token(s); ok {
			d.eos = []uint32{id}
		}
	}
	if bos, ok := d.vars["bos_token"].(string); ok && field(cfg, "add_bos_token", false) && len(bpe.promptPre) == 0 {
		if id, ok := bpe.Token(bos); ok {
			bpe.promptPre, d.addBOS = []uint32{id}, true
		}
	}
	src, err := chatTemplate(dir, cfg)
	if err != nil {
		return nil, err
	}
	if src != "" {
		if d.template, err = jinja.Compile(src); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrTemplate, path, err)
		}
	}
	return d, nil
}

// tokenText reads a special token of tokenizer_config.json: a string, or
// an AddedToken object with its content.
func tokenText(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var o struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Content != nil {
		return *o.Content, true
	}
	return "", false
}

// chatTemplate returns the directory's chat template: chat_template.jinja
// (where newer transformers save it), else tokenizer_config.json's
// chat_template, a string or a list of named templates ("default" wins).
func chatTemplate(dir string, cfg map[string]json.RawMessage) (string, error) {
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		return string(b), nil
	}
	raw, ok := cfg["chat_template"]
	if !ok || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || len(named) == 0 {
		return "", fmt.Errorf("%w: chat_template is neither a string nor a list of {name, template}", ErrFormat)
	}
	for _, t := range named {
		if t.Name == "default" {
			return t.Template, nil
		}
	}
	return named[0].Template, nil
}

// HasChatTemplate reports whether the directory has a chat template.
func (d *Dir) HasChatTemplate() bool { return d.template != nil }

// EOS returns the id of tokenizer_config.json's eos_token, if it is one.
func (d *Dir) EOS() []uint32 { return d.eos }

// RenderChat renders msgs with the chat template as transformers'
// apply_chat_template does (messages, add_generation_prompt, the special
// tokens; trim_blocks and lstrip_blocks; raise_exception). Errors wrap
// ErrTemplate; so does a directory without a template.
func (d *Dir) RenderChat(msgs []Message, addGenerationPrompt bool) (string, error) {
	if d.template == nil {
		return "", fmt.Errorf("%w: the model directory has none (tokenizer_config.json: chat_template)", ErrTemplate)
	}
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	vars := map[string]any{"messages": list, "add_generation_prompt": addGenerationPrompt}
	for k, v := range d.vars {
		vars[k] = v
	}
	s, err := d.template.Render(vars)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	return s, nil
}

// EncodeChat returns the tokens of msgs rendered with the chat template,
// the generation prompt added: the template's text encoded as it is, with
// nothing added around it (the template writes the BOS it wants).
func (d *Dir) EncodeChat(msgs []Message) ([]uint32, error) {
	s, err := d.RenderChat(msgs, true)
	if err != nil {
		return nil, err
	}
	return d.Encode(s), nil
}

// SpecialText returns the text of a special token tokenizer_config.json
// names (bos_token, eos_token, unk_token, pad_token), or "".
func (d *Dir) SpecialText(name string) string {
	s, _ := d.vars[name].(string)
	return s
}

// Chatter is a tokenizer that renders chats itself (Dir).
type Chatter interface {
	Tokenizer
	// HasChatTemplate reports whether EncodeChat can render.
	HasChatTemplate() bool
	// EncodeChat returns the tokens of msgs with the generation prompt
	// added; errors wrap ErrTemplate.
	EncodeChat(msgs []Message) ([]uint32, error)
}

var _ Chatter = (*Dir)(nil)

// EncodePrompt encodes text as a whole prompt: with what the tokenizer's
// post-processor adds around it (a BOS; BPE.Prompt), else as Encode.
func EncodePrompt(tok Tokenizer, text string) []uint32 {
	if p, ok := tok.(interface{ Prompt(string) []uint32 }); ok {
		return p.Prompt(text)
	}
	return tok.Encode(text)
}
