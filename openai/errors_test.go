package openai

import (
	"bytes"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// goWords are what an error message must not show a caller: Go's type
// names and the decoder's own wording.
var goWords = regexp.MustCompile(`Go (struct|value)|json: |\[\]|openai\.|chatMessage|completionRequest|\bint64\b|\bfloat64\b|\*int`)

// TestErrorMessages: each refusal a client can meet says, in the API's
// terms, what is wrong and what to do, as OpenAI's error object with the
// parameter at fault.
func TestErrorMessages(t *testing.T) {
	a := startTestAPI(t)
	user := []map[string]any{{"role": "user", "content": "hi"}}
	for _, c := range []struct {
		name, method, path string
		body               any // marshalled, or raw bytes
		status             int
		param, code, msg   string
	}{
		{"no /v1 in the base URL", "POST", "/chat/completions", map[string]any{"model": "kvmesh"}, 404, "", "unknown_url",
			"no such path: POST /chat/completions; the OpenAI API is under /v1/: set the client's base URL to http://"},
		{"the root", "GET", "/", nil, 404, "", "unknown_url", "the OpenAI API is under /v1/"},
		{"an unknown path under /v1", "GET", "/v1/embeddings", nil, 404, "", "unknown_url", "this node serves /v1/models"},
		{"tools", "POST", "/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": user,
			"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}}, 400,
			"tools", "unsupported_parameter", "tools: this server's model does not call tools; send the request without tools"},
		{"tool_choice", "POST", "/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": user, "tool_choice": "auto"}, 400,
			"tool_choice", "unsupported_parameter", "leave tool_choice out"},
		{"legacy functions", "POST", "/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": user,
			"functions": []any{map[string]any{"name": "f"}}}, 400, "functions", "unsupported_parameter", "does not call tools"},
		{"no tools, tool_choice none", "POST", "/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": user,
			"tools": []any{}, "tool_choice": "none", "max_tokens": 1}, 200, "", "", ""},
		{"messages a string", "POST", "/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": "hi"}, 400,
			"messages", "", `messages must be an array of {"role": string, "content": string or array of text parts}, got a string`},
		{"a message a number", "POST", "/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": []any{5}}, 400,
			"messages[0]", "", "messages[0] must be an object"},
		{"a role a number", "POST", "/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": []any{map[string]any{"role": 5, "content": "x"}}}, 400,
			"messages[0].role", "", "messages[0].role must be a string (system, developer, user, assistant or tool), got a number"},
		{"content a number", "POST", "/v1/chat/completions", map[string]any{"model": "kvmesh", "messages": []any{map[string]any{"role": "user", "content": 5}}}, 400,
			"messages[0].content", "", "messages[0].content: must be a string or an array of text parts"},
		{"max_tokens a string", "POST", "/v1/completions", map[string]any{"model": "kvmesh", "prompt": "x", "max_tokens": "5"}, 400,
			"max_tokens", "", "max_tokens must be an integer, got string"},
		{"temperature a string", "POST", "/v1/completions", map[string]any{"model": "kvmesh", "prompt": "x", "temperature": "hot"}, 400,
			"temperature", "", "temperature must be a number, got string"},
		{"a body that is an array", "POST", "/v1/completions", []byte(`[1, 2]`), 400, "", "", "the request body must be a JSON object, got array"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var body []byte
			switch b := c.body.(type) {
			case nil:
			case []byte:
				body = b
			default:
				var err error
				if body, err = json.Marshal(b); err != nil {
					t.Fatal(err)
				}
			}
			req, err := http.NewRequest(c.method, a.srv.URL+c.path, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got struct {
				Error *struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatalf("%d, not JSON: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != c.status {
				t.Fatalf("%d %+v, want %d", resp.StatusCode, got.Error, c.status)
			}
			if c.status < 400 {
				return
			}
			e := got.Error
			if e == nil || e.Type == "" {
				t.Fatalf("no OpenAI error object")
			}
			param, code := "", ""
			if e.Param != nil {
				param = *e.Param
			}
			if e.Code != nil {
				code = *e.Code
			}
			if !strings.Contains(e.Message, c.msg) || param != c.param || (c.code != "" && code != c.code) {
				t.Errorf("error %q (param %q, code %q); want %q, param %q, code %q", e.Message, param, code, c.msg, c.param, c.code)
			}
			if m := goWords.FindString(e.Message); m != "" {
				t.Errorf("error %q shows the caller %q", e.Message, m)
			}
		})
	}
}
