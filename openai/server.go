package openai

import (
	"io"
	"net/http"
	"time"
)

// Timeouts bound what one HTTP client can hold of a server of the API (a
// node's HTTP address, with its metrics and health; a router's): a
// connection that is slow to send its headers (ReadHeader), its body
// (Read, from the request's start), to take each piece of a response
// (Write, per write: a streamed completion writes for as long as it
// generates), or that sits idle between requests (Idle) is closed. Zero
// fields take DefaultTimeouts'.
type Timeouts struct {
	ReadHeader, Read, Write, Idle time.Duration
}

// DefaultTimeouts: a 16 MiB body has a minute at 300 KB/s, and
// /debug/pprof/profile?seconds=30 fits under Write.
var DefaultTimeouts = Timeouts{ReadHeader: 10 * time.Second, Read: time.Minute, Write: time.Minute, Idle: 2 * time.Minute}

func (t *Timeouts) ensureDefaults() {
	d := DefaultTimeouts
	for _, f := range []struct{ v, d *time.Duration }{{&t.ReadHeader, &d.ReadHeader}, {&t.Read, &d.Read}, {&t.Write, &d.Write}, {&t.Idle, &d.Idle}} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
}

// NewServer returns an HTTP server of h under the timeouts t.
func NewServer(h http.Handler, t Timeouts) *http.Server {
	t.ensureDefaults()
	return &http.Server{Handler: withDeadlines(h, t), ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read,
		WriteTimeout: t.Write, IdleTimeout: t.Idle}
}

// withDeadlines turns the server's whole-request deadlines into what a
// long handler needs. net/http's ReadTimeout stays on the connection after
// the body is read, and the background read it starts then (or at once,
// for a request without a body) cancels the request's context when the
// deadline passes: a generation longer than ReadTimeout would be cut. So
// the read deadline is lifted once the body is read to its end (at once
// without a body). WriteTimeout would likewise cut a long response, so it
// is lifted for the handler, and every write of the response gets
// t.Write of its own instead.
func withDeadlines(h http.Handler, t Timeouts) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body == nil || r.Body == http.NoBody {
			rc.SetReadDeadline(time.Time{})
		} else {
			r.Body = &liftAtEOF{ReadCloser: r.Body, lift: func() { rc.SetReadDeadline(time.Time{}) }}
		}
		rc.SetWriteDeadline(time.Time{})
		h.ServeHTTP(&writeDeadlines{ResponseWriter: w, rc: rc, d: t.Write}, r)
	})
}

// liftAtEOF calls lift once its body has been read to its end.
type liftAtEOF struct {
	io.ReadCloser
	lift func()
	done bool
}

func (b *liftAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.lift()
	}
	return n, err
}

// writeDeadlines gives each write of a response a deadline of its own.
// http.ResponseController finds the connection's other methods (Flush,
// deadlines) through Unwrap.
type writeDeadlines struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *writeDeadlines) Write(b []byte) (int, error) {
	w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(b)
}

func (w *writeDeadlines) Unwrap() http.ResponseWriter { return w.ResponseWriter }
