package openai

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestHTTPTimeouts: the API's HTTP server drops a client that is slow to
// send its headers or its body, or that idles between requests; a handler
// that runs longer than the read timeout keeps its context (net/http's
// whole-request ReadTimeout would cancel it), and a response written over
// longer than the write timeout goes through, each write under a deadline
// of its own.
func TestHTTPTimeouts(t *testing.T) {
	const d = 100 * time.Millisecond
	to := Timeouts{ReadHeader: d, Read: d, Write: d, Idle: d}
	long := make(chan string, 4)
	mux := http.NewServeMux()
	mux.HandleFunc("/long", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("first\n"))
		select {
		case <-r.Context().Done():
			long <- "the request's context was canceled"
			return
		case <-time.After(5 * d):
		}
		if _, err := w.Write([]byte("second\n")); err != nil {
			long <- "second write: " + err.Error()
			return
		}
		long <- "ok"
	})
	srv := NewServer(mux, to)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	closedBy := func(name, send string) {
		t.Helper()
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(nc, send); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(nc); err != nil {
			t.Errorf("%s: the server did not close the connection: %v", name, err)
		}
	}
	closedBy("headers never finished", "GET /long HTTP/1.1\r\nHost: x\r\n")
	closedBy("body never finished", "POST /nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
	closedBy("idle after a request", "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")

	for _, req := range []string{
		"GET /long HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /long HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
	} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(20 * time.Second))
		io.WriteString(nc, req)
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		nc.Close()
		if got := <-long; got != "ok" || !strings.Contains(string(body), "second") {
			t.Errorf("%q: a handler longer than the timeouts: %s; body %q", strings.Fields(req)[0], got, body)
		}
	}
}
