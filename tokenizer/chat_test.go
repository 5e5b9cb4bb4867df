package tokenizer_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/tokenizer"
)

// chatDir writes a model directory with testdata's tokenizer.json of tok
// and a tokenizer_config.json with the chat template of testdata/chat.
func chatDir(t *testing.T, tok, template, bos, eos string) string {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join("testdata", tok, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join("testdata", "chat", template+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"chat_template": string(src), "bos_token": bos,
		"eos_token": map[string]any{"content": eos, "special": true}, "add_bos_token": true})
	for name, data := range map[string][]byte{"tokenizer.json": b, "tokenizer_config.json": cfg} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestChatTemplatesMatchJinja2: chat templates in the styles of Llama 3,
// Qwen2.5, Mistral and Llama 2, and one with namespace() and tojson,
// render each conversation as Python's jinja2 renders it the way
// transformers does (testdata/render.py), raise_exception included, and
// EncodeChat is exactly the tokens of that text.
func TestChatTemplatesMatchJinja2(t *testing.T) {
	py := "/usr/bin/python3"
	if exec.Command(py, "-c", "import jinja2").Run() != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no python3 with jinja2: apt-get install python3-jinja2 (.ci/run does)")
		}
		t.Skip("no python3 with jinja2")
	}
	type msg = tokenizer.Message
	chats := [][]msg{
		{{Role: "user", Content: "Hello!"}},
		{{Role: "system", Content: "  Be brief.\n"}, {Role: "user", Content: "What is \"kvmesh\"? Ünïcode ok?"}},
		{{Role: "system", Content: "sys"}, {Role: "user", Content: "one"}, {Role: "assistant", Content: " two "}, {Role: "user", Content: "three"}},
		{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}},
		{{Role: "assistant", Content: "first"}},
	}
	dirs := map[string]*tokenizer.Dir{}
	templates := map[string]string{}
	for _, c := range []struct{ name, tok, bos, eos string }{
		{"llama3", "llama3", "<|begin_of_text|>", "<|eot_id|>"},
		{"qwen2", "qwen2", "<|endoftext|>", "<|im_end|>"},
		{"mistral", "mistral", "<s>", "</s>"},
		{"llama2", "llama2", "<s>", "</s>"},
		{"counted", "gpt2", "<|endoftext|>", "<|endoftext|>"},
	} {
		d, err := tokenizer.LoadDir(chatDir(t, c.tok, c.name, c.bos, c.eos))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !d.HasChatTemplate() || len(d.EOS()) != 1 {
			t.Fatalf("%s: template %v, EOS %v", c.name, d.HasChatTemplate(), d.EOS())
		}
		dirs[c.name] = d
		src, _ := os.ReadFile(filepath.Join("testdata", "chat", c.name+".jinja"))
		templates[c.name] = string(src)
	}
	var pyChats [][]map[string]string
	for _, c := range chats {
		var ms []map[string]string
		for _, m := range c {
			ms = append(ms, map[string]string{"role": m.Role, "content": m.Content})
		}
		pyChats = append(pyChats, ms)
	}
	// Every template gets the same special tokens; each names only its own.
	vars := map[string]string{"bos_token": "", "eos_token": ""}
	spec := map[string]any{"templates": templates, "chats": pyChats, "vars": vars}
	out := map[string][]json.RawMessage{}
	for name := range templates {
		vars["bos_token"], vars["eos_token"] = tokenText(t, dirs[name], "bos"), tokenText(t, dirs[name], "eos")
		spec["templates"] = map[string]string{name: templates[name]}
		b, _ := json.Marshal(spec)
		path := filepath.Join(t.TempDir(), "spec.json")
		os.WriteFile(path, b, 0o644)
		res, err := exec.Command(py, filepath.Join("testdata", "render.py"), path).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("render.py: %v\n%s", err, stderr)
		}
		var one map[string][]json.RawMessage
		if err := json.Unmarshal(res, &one); err != nil {
			t.Fatal(err)
		}
		out[name] = one[name]
	}
	for name, d := range dirs {
		for i, c := range chats {
			var want string
			var raised struct{ Error string }
			if json.Unmarshal(out[name][i], &want) != nil {
				json.Unmarshal(out[name][i], &raised)
			}
			got, err := d.RenderChat(c, true)
			switch {
			case raised.Error != "":
				if !errors.Is(err, tokenizer.ErrTemplate) || !strings.Contains(err.Error(), raised.Error) {
					t.Errorf("%s, chat %d: got %q, %v; jinja2 raised %q", name, i, got, err, raised.Error)
				}
				if _, err := d.EncodeChat(c); !errors.Is(err, tokenizer.ErrTemplate) {
					t.Errorf("%s, chat %d: EncodeChat: %v", name, i, err)
				}
			case err != nil || got != want:
				t.Errorf("%s, chat %d: got %q, %v\njinja2 gave %q", name, i, got, err, want)
			default:
				ids, err := d.EncodeChat(c)
				if err != nil || !slices.Equal(ids, d.Encode(want)) {
					t.Errorf("%s, chat %d: EncodeChat = %v, %v; want the tokens of jinja2's text", name, i, ids, err)
				}
			}
		}
	}
}

// tokenText returns the text of the directory's BOS or EOS.
func tokenText(t *testing.T, d *tokenizer.Dir, which string) string {
	t.Helper()
	return d.SpecialText(which + "_token")
}
