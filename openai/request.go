package openai

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// completionRequest is the body of both completions; fields of the other
// endpoint are ignored, unknown fields too.
type completionRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	N                   *int            `json:"n"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Echo bool `json:"echo"`
	// Tool calling, refused: the engine calls no tools, and answering as
	// if the tools were not there would mislead the caller.
	Tools        json.RawMessage `json:"tools"`
	ToolChoice   json.RawMessage `json:"tool_choice"`
	Functions    json.RawMessage `json:"functions"`
	FunctionCall json.RawMessage `json:"function_call"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// job is a checked completion request.
type job struct {
	chat    bool
	prompt  []uint32
	opts    prefill.GenerateOptions
	stream  bool
	usage   bool // stream_options.include_usage
	session string
}

func (o *API) parse(w http.ResponseWriter, r *http.Request, chat bool) (*job, error) {
	var req completionRequest
	if err := o.decodeBody(w, r, &req, MaxBodyBytes); err != nil {
		return nil, err
	}
	return o.check(&req, chat, r.Header.Get(SessionHeader))
}

// check validates a decoded completion request and makes it a job.
func (o *API) check(req *completionRequest, chat bool, session string) (*job, error) {
	j := &job{chat: chat, stream: req.Stream, usage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	switch {
	case req.Model == "":
		return nil, badRequest("model", "model is required (this node serves %q, also called %q)", o.model, ModelAlias)
	case !o.knows(req.Model):
		return nil, o.unknownModel(req.Model)
	case req.N != nil && *req.N != 1:
		return nil, badRequest("n", "n must be 1: this server generates one choice per request")
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported")
	}
	if err := refuseTools(req); err != nil {
		return nil, err
	}
	var err error
	if chat {
		j.prompt, err = chatPrompt(o.tok, o.chatML, req.Messages)
	} else {
		j.prompt, err = completionPrompt(o.tok, req.Prompt)
	}
	if err != nil {
		return nil, err
	}
	j.opts.MaxTokens = DefaultCompletionTokens
	if chat {
		j.opts.MaxTokens = DefaultChatTokens
		if req.MaxCompletionTokens != nil {
			req.MaxTokens = req.MaxCompletionTokens
		}
	}
	maxParam := "max_tokens"
	if chat && req.MaxCompletionTokens != nil {
		maxParam = "max_completion_tokens"
	}
	if req.MaxTokens != nil {
		if *req.MaxTokens < 1 {
			return nil, badRequest(maxParam, "%s must be at least 1, got %d", maxParam, *req.MaxTokens)
		}
		j.opts.MaxTokens = *req.MaxTokens
	} else if chat {
		// Without a limit, a chat answer stops where the context does.
		j.opts.MaxTokens = max(1, min(j.opts.MaxTokens, o.engine.Config().MaxContext-len(j.prompt)))
	}
	j.opts.Temperature, j.opts.TopP = o.opts.Sampling.Values() // the model's, else OpenAI's
	if req.Temperature != nil {
		j.opts.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		if *req.TopP <= 0 || *req.TopP > 1 {
			return nil, badRequest("top_p", "top_p must be in (0, 1], got %g", *req.TopP)
		}
		j.opts.TopP = *req.TopP
	}
	if req.Seed != nil {
		j.opts.Seed = uint64(*req.Seed)
	} else {
		var b [8]byte
		rand.Read(b[:])
		for _, x := range b {
			j.opts.Seed = j.opts.Seed<<8 | uint64(x)
		}
	}
	if j.opts.Stop, err = stopSequences(o.tok, req.Stop); err != nil {
		return nil, err
	}
	j.opts.Stop = append(j.opts.Stop, o.endOfTurn...)
	if err := o.engine.CheckGenerate(j.prompt, j.opts); err != nil {
		msg := strings.TrimPrefix(err.Error(), prefill.ErrInvalidInput.Error()+": ")
		param := "prompt"
		if chat {
			param = "messages"
		}
		code := ""
		switch {
		case strings.HasPrefix(msg, "max_tokens"):
			param, code = maxParam, "context_length_exceeded"
		case strings.HasPrefix(msg, "temperature"):
			param = "temperature"
		case strings.HasPrefix(msg, "top_p"):
			param = "top_p"
		case strings.HasPrefix(msg, "stop"):
			param = "stop"
		case strings.Contains(msg, "context holds"):
			code = "context_length_exceeded"
		}
		return nil, badRequest(param, "%s", msg).withCode(code)
	}
	j.session = session
	if len(j.session) > MaxSessionBytes {
		return nil, badRequest(SessionHeader, "the %s header has %d bytes; at most %d", SessionHeader, len(j.session), MaxSessionBytes)
	}
	j.opts.Session = j.session
	return j, nil
}

// refuseTools refuses tool calling with 400 unsupported_parameter: the
// engine never calls a tool, so a request that offers tools (or the legacy
// functions) or asks for a tool_choice other than "none" cannot be answered
// as asked. An empty list and "none" are accepted.
func refuseTools(req *completionRequest) error {
	for _, p := range []struct {
		name string
		raw  json.RawMessage
	}{{"tools", req.Tools}, {"functions", req.Functions}} {
		var list []json.RawMessage
		if isNull(p.raw) || json.Unmarshal(p.raw, &list) == nil && len(list) == 0 {
			continue
		}
		return badRequest(p.name, "%s: this server's model does not call tools; send the request without %s", p.name, p.name).withCode("unsupported_parameter")
	}
	for _, p := range []struct {
		name string
		raw  json.RawMessage
	}{{"tool_choice", req.ToolChoice}, {"function_call", req.FunctionCall}} {
		var s string
		if isNull(p.raw) || json.Unmarshal(p.raw, &s) == nil && s == "none" {
			continue
		}
		return badRequest(p.name, "%s: this server's model does not call tools; leave %s out (or \"none\")", p.name, p.name).withCode("unsupported_parameter")
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// jsonKind names what raw holds, in JSON's words: for messages about a
// value of the wrong shape, without Go's.
func jsonKind(raw []byte) string {
	s := strings.TrimSpace(string(raw))
	switch {
	case s == "":
		return "nothing"
	case s == "null":
		return "null"
	case s == "true" || s == "false":
		return "a boolean"
	case s[0] == '"':
		return "a string"
	case s[0] == '[':
		return "an array"
	case s[0] == '{':
		return "an object"
	}
	return "a number"
}

// jsonType names the JSON a Go type reads, for decode errors.
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// completionPrompt reads /v1/completions' prompt: a string, an array of one
// string, an array of token ids, or an array of one array of token ids.
func completionPrompt(tok tokenizer.Tokenizer, raw json.RawMessage) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return tokenizer.EncodePrompt(tok, s), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return nil, badRequest("prompt", "prompt: %d prompts; this server takes one per request", len(ss))
		}
		return tokenizer.EncodePrompt(tok, ss[0]), nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		return ids, nil
	}
	var idss [][]uint32
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 {
			return nil, badRequest("prompt", "prompt: %d prompts; this server takes one per request", len(idss))
		}
		return idss[0], nil
	}
	return nil, badRequest("prompt", "prompt must be a string, an array of one string, or an array of token ids (0..4294967295)")
}

// chatRoles are the roles ChatTemplate knows.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// chatPrompt renders messages with ChatTemplate, or ChatML when chatML,
// and tokenizes them.
func chatPrompt(tok tokenizer.Tokenizer, chatML bool, raw json.RawMessage) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("messages", "messages is required: an array of {role, content}")
	}
	const shape = `{"role": string, "content": string or array of text parts}`
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, badRequest("messages", "messages must be an array of %s, got %s", shape, jsonKind(raw))
	}
	if len(elems) == 0 {
		return nil, badRequest("messages", "messages is empty")
	}
	msgs := make([]chatMessage, len(elems))
	for i, e := range elems {
		var fields map[string]json.RawMessage
		if json.Unmarshal(e, &fields) != nil {
			return nil, badRequest(fmt.Sprintf("messages[%d]", i), "messages[%d] must be an object %s, got %s", i, shape, jsonKind(e))
		}
		if r, ok := fields["role"]; !ok || json.Unmarshal(r, &msgs[i].Role) != nil {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role must be a string (system, developer, user, assistant or tool), got %s", i, jsonKind(r))
		}
		msgs[i].Content = fields["content"]
	}
	var b strings.Builder
	chat, _ := tok.(tokenizer.Chatter)
	var texts []tokenizer.Message
	for i, m := range msgs {
		if !chatRoles[m.Role] {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role: %q is not one of system, developer, user, assistant, tool", i, m.Role)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content: %v", i, err)
		}
		texts = append(texts, tokenizer.Message{Role: m.Role, Content: text})
		if chatML {
			fmt.Fprintf(&b, "<|im_start|>%s\n%s<|im_end|>\n", m.Role, text)
		} else {
			fmt.Fprintf(&b, "<|%s|>\n%s\n", m.Role, text)
		}
	}
	if chat != nil && chat.HasChatTemplate() {
		ids, err := chat.EncodeChat(texts)
		if err != nil {
			return nil, badRequest("messages", "the model's chat template refused the messages: %s", strings.TrimPrefix(err.Error(), tokenizer.ErrTemplate.Error()+": "))
		}
		return ids, nil
	}
	if chatML {
		b.WriteString("<|im_start|>assistant\n")
	} else {
		b.WriteString("<|assistant|>\n")
	}
	return tok.Encode(b.String()), nil
}

// messageText reads a message's content: a string, null, or an array of
// text parts ({"type":"text","text":...}), which are concatenated.
func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf(`must be a string or an array of text parts ({"type": "text", "text": string}), got %s`, jsonKind(raw))
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", fmt.Errorf("a part of type %q: only text parts are supported", p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// stopSequences reads stop: null, a string or an array of strings.
func stopSequences(tok tokenizer.Tokenizer, raw json.RawMessage) ([][]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var ss []string
	var s string
	if json.Unmarshal(raw, &s) == nil {
		ss = []string{s}
	} else if err := json.Unmarshal(raw, &ss); err != nil {
		return nil, badRequest("stop", "stop must be a string or an array of strings")
	}
	if len(ss) > maxAPIStops {
		return nil, badRequest("stop", "stop: %d sequences, at most %d", len(ss), maxAPIStops)
	}
	out := make([][]uint32, 0, len(ss))
	for i, s := range ss {
		if s == "" || len(s) > prefill.MaxStopTokens {
			return nil, badRequest("stop", "stop[%d] has %d bytes; want 1..%d", i, len(s), prefill.MaxStopTokens)
		}
		out = append(out, tok.Encode(s))
	}
	return out, nil
}
