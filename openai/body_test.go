package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCheckDepth: nesting past MaxJSONDepth is refused, brackets inside
// strings (escaped quotes too) do not count.
func TestCheckDepth(t *testing.T) {
	deep := strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth+1)
	ok := strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth)
	for body, want := range map[string]bool{
		deep: false, ok: true, `{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}`: true,
		`{"a": "\"` + strings.Repeat("{", 40) + `"}`: true, `{"a": {"b": {"c": []}}}`: true,
	} {
		if err := checkDepth([]byte(body)); (err == nil) != want {
			t.Errorf("checkDepth(%.40s…) = %v, want ok %v", body, err, want)
		}
	}
}

// TestReadBodyBudget: a body is charged to the budget before it is read
// and while it is held; with no room within bodyWait the request is
// answered 503, and one past its endpoint's limit 413.
func TestReadBodyBudget(t *testing.T) {
	o := &API{inflight: newBudget(1 << 20)}
	req := func(n int) *http.Request {
		r := httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(make([]byte, n)))
		r.ContentLength = int64(n)
		return r
	}
	_, done, err := o.readBody(httptest.NewRecorder(), req(200<<10), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	var he *httpError
	if _, _, err := o.readBody(httptest.NewRecorder(), req(100<<10), 4<<20); !errors.As(err, &he) || he.status != http.StatusServiceUnavailable {
		t.Fatalf("a body with the budget held: %v, want 503", err)
	}
	done()
	if _, done, err := o.readBody(httptest.NewRecorder(), req(100<<10), 4<<20); err != nil {
		t.Fatalf("after the release: %v", err)
	} else {
		done()
	}
	if _, _, err := o.readBody(httptest.NewRecorder(), req(5<<20), 4<<20); !errors.As(err, &he) || he.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over its endpoint's limit: %v, want 413", err)
	}
	if used := o.inflight.mu.used; used != 0 {
		t.Errorf("%d bytes still charged", used)
	}
}

// TestCanonicalRequest: a batch's request is stored with the fields the
// API knows only: a megabyte of unknown fields, at the top or inside a
// message, is not kept, and the request reads back the same.
func TestCanonicalRequest(t *testing.T) {
	junk := strings.Repeat("x", 1<<20)
	raw := `{"model":"kvmesh","junk":"` + junk + `","max_tokens":3,"temperature":0,"stop":"\n",
		"messages":[{"role":"user","content":[{"type":"text","text":"hello","junk":"` + junk + `"}],"name":"` + junk + `"}]}`
	req, kind, err := decodeQueued(json.RawMessage(raw))
	if err != nil || kind != 'c' {
		t.Fatal(kind, err)
	}
	b, err := canonicalRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 200 || strings.Contains(string(b), "xxxx") {
		t.Fatalf("stored %d bytes: %.200s", len(b), b)
	}
	back, kind, err := decodeQueued(b)
	if err != nil || kind != 'c' || *back.MaxTokens != 3 || *back.Temperature != 0 || !strings.Contains(string(back.Messages), "hello") {
		t.Fatalf("read back: %+v %c %v", back, kind, err)
	}
	req, kind, _ = decodeQueued(json.RawMessage(`{"model":"m","prompt":[[1,2,3]],"x":{"y":[1,2]}}`))
	if b, err := canonicalRequest(req); err != nil || kind != 't' || string(b) != `{"model":"m","prompt":[[1,2,3]]}` {
		t.Errorf("a prompt of token ids: %s %v", b, err)
	}
}
