package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/openai"
)

// complete routes a completion: on the node chosen by the policy, or, with
// nodes in the prefill and decode roles, split between two.
func (r *Router) complete(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, openai.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			openai.WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over %d bytes", tooBig.Limit), "invalid_request_error", "", "request_too_large")
			return
		}
		openai.WriteError(w, http.StatusBadRequest, "reading the request body: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	c := completion{req: req, body: body, path: req.URL.Path, session: req.Header.Get(openai.SessionHeader)}
	if c.session != "" {
		r.hints.Inc()
	}
	began := time.Now()
	all := r.backends()
	var prefillers, decoders, both []backend
	for _, b := range all {
		switch b.role {
		case gossip.RolePrefill:
			prefillers = append(prefillers, b)
		case gossip.RoleDecode:
			decoders = append(decoders, b)
		default:
			both = append(both, b)
		}
	}
	if len(all) == 0 {
		openai.WriteError(w, http.StatusServiceUnavailable, "no node serves the API: none has joined, or all are down", "server_error", "", "no_backend")
		return
	}
	// The cost of the prompt, from one node's lookup; that node also
	// checks the request, so a bad one is refused here, with the node's
	// error, before any work.
	var lerr *routerError
	if c.look, lerr = r.lookup(req, body, c.path, all); lerr != nil {
		lerr.write(w)
		return
	}
	if len(prefillers) == 0 || len(decoders) == 0 {
		r.overhead.Observe(time.Since(began).Seconds())
		r.forward(w, c, slices.Concat(both, prefillers, decoders), c.look, false, nil)
		return
	}
	r.split(w, c, began, slices.Concat(prefillers, both), slices.Concat(decoders, both))
}

// completion is a completion request the router sends on: the client's
// request and body, and what the lookup found.
type completion struct {
	req           *http.Request
	body          []byte
	path, session string
	look          openai.LookupResult
}

// split runs c's prompt on one of prefillers (max_tokens 1, not streamed,
// published before it answers), then decodes on one of decoders, which
// loads the prefix from the cache; the client is told the prefill node's
// cached tokens.
func (r *Router) split(w http.ResponseWriter, c completion, began time.Time, prefillers, decoders []backend) {
	pre, err := prefillBody(c.body)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, err.Error(), "invalid_request_error", "", "")
		return
	}
	r.overhead.Observe(time.Since(began).Seconds())
	rec := &captureWriter{header: http.Header{}}
	pc := c
	pc.req, pc.body = c.req.Clone(c.req.Context()), pre
	pc.req.Header.Set(openai.PublishHeader, "wait")
	t0 := time.Now()
	r.forward(rec, pc, prefillers, openai.LookupResult{PromptTokens: c.look.PromptTokens, CachedTokens: c.look.CachedTokens, MaxTokens: 1},
		false, nil)
	preTook := time.Since(t0)
	if rec.code != http.StatusOK {
		copyHeader(w.Header(), rec.header)
		w.WriteHeader(rec.code)
		w.Write(rec.body.Bytes())
		return
	}
	var pu struct {
		Usage openai.Usage `json:"usage"`
	}
	json.Unmarshal(rec.body.Bytes(), &pu)
	w.Header().Set("X-Kvmesh-Prefill-Node", rec.header.Get("X-Kvmesh-Node"))
	w.Header().Set("X-Kvmesh-Prefill-Node-Ms", strconv.FormatFloat(ms(preTook), 'f', 3, 64))
	w.Header().Set("X-Kvmesh-Prefill-Cached-Tokens", strconv.Itoa(pu.Usage.PromptTokensDetails.CachedTokens))
	rewrite := func(u *openai.Usage) { u.PromptTokensDetails.CachedTokens = pu.Usage.PromptTokensDetails.CachedTokens }
	r.forward(w, c, decoders, openai.LookupResult{PromptTokens: c.look.PromptTokens,
		CachedTokens: c.look.PromptTokens, MaxTokens: c.look.MaxTokens}, true, rewrite)
}

// routerError is an answer the router passes on as is.
type routerError struct {
	code   int
	header http.Header
	body   []byte
}

func (e *routerError) write(w http.ResponseWriter) {
	copyHeader(w.Header(), e.header)
	w.WriteHeader(e.code)
	w.Write(e.body)
}

// lookup asks a node for the prompt's cost; a node that cannot answer is
// skipped, and when none can the cost is the whole prompt, unknown.
func (r *Router) lookup(req *http.Request, body []byte, path string, cands []backend) (openai.LookupResult, *routerError) {
	order := rand.Perm(len(cands))
	for _, i := range order[:min(len(order), 3)] {
		b := cands[i]
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		up, err := http.NewRequestWithContext(ctx, http.MethodPost, r.scheme()+b.addr+openai.LookupPath+strings.TrimPrefix(path, "/v1"), bytes.NewReader(body))
		if err != nil {
			cancel()
			continue
		}
		copyRequestHeader(up.Header, req.Header)
		resp, err := r.client.Do(up)
		if err != nil {
			cancel()
			r.markDown(b.id)
			continue
		}
		rb, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		cancel()
		switch {
		case err != nil || resp.StatusCode >= 500:
			continue
		case resp.StatusCode != http.StatusOK:
			return openai.LookupResult{}, &routerError{code: resp.StatusCode, header: resp.Header, body: rb}
		}
		var lr openai.LookupResult
		if json.Unmarshal(rb, &lr) == nil {
			return lr, nil
		}
	}
	return openai.LookupResult{}, nil
}

// forward sends the request to the best of cands, and on a failure before
// the first byte of the answer to the next best, until one answers or none
// is left. decode charges the node by tokens to generate, else by uncached
// prompt tokens. rewrite, when set, edits the usage of the answer.
func (r *Router) forward(w http.ResponseWriter, c completion, cands []backend, look openai.LookupResult, decode bool, rewrite func(*openai.Usage)) {
	cands = slices.Clone(cands)
	for len(cands) > 0 {
		i := r.pick(cands, decode, c.session)
		b := cands[i]
		cands = slices.Delete(cands, i, i+1)
		prefilled, done := r.charge(b.id, max(0, look.PromptTokens-look.CachedTokens), look.MaxTokens)
		sent, err := r.try(w, c.req, c.body, c.path, b, prefilled, rewrite)
		done()
		if err == nil || c.req.Context().Err() != nil {
			return
		}
		r.log.Warn("router: node failed", "node", b.id, "addr", b.addr, "answered", sent, "err", err)
		if sent {
			return // the client has bytes already: the response ends here
		}
		r.markDown(b.id)
		r.retries.WithLabelValues(b.id).Inc()
	}
	openai.WriteError(w, http.StatusServiceUnavailable, "every node failed this request; retry", "server_error", "", "no_backend")
}

// forwardAny sends a request that needs no choice to any live node, with
// the same retries.
func (r *Router) forwardAny(w http.ResponseWriter, req *http.Request, body []byte) {
	if req.Body != nil && body == nil {
		var err error
		if body, err = io.ReadAll(http.MaxBytesReader(w, req.Body, openai.MaxBodyBytes)); err != nil {
			openai.WriteError(w, http.StatusRequestEntityTooLarge, "the request body is too large or unreadable", "invalid_request_error", "", "")
			return
		}
	}
	cands := r.backends()
	for len(cands) > 0 {
		i := rand.IntN(len(cands))
		b := cands[i]
		cands = slices.Delete(cands, i, i+1)
		sent, err := r.try(w, req, body, req.URL.Path, b, func() {}, nil)
		if err == nil || sent {
			return
		}
		r.markDown(b.id)
		r.retries.WithLabelValues(b.id).Inc()
	}
	openai.WriteError(w, http.StatusServiceUnavailable, "no node serves the API: none has joined, or all are down", "server_error", "", "no_backend")
}

// try sends the request to b and streams its answer to w. It reports
// whether anything reached w; an error with nothing sent may be retried.
// firstByte is called when the node's answer starts (its prefill is done).
func (r *Router) try(w http.ResponseWriter, req *http.Request, body []byte, path string, b backend, firstByte func(), rewrite func(*openai.Usage)) (sent bool, err error) {
	t0 := time.Now()
	up, err := http.NewRequestWithContext(req.Context(), req.Method, r.scheme()+b.addr+path, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	copyRequestHeader(up.Header, req.Header)
	resp, err := r.client.Do(up)
	if err != nil {
		r.requests.WithLabelValues(b.id, "0").Inc()
		return false, err
	}
	defer resp.Body.Close()
	r.requests.WithLabelValues(b.id, strconv.Itoa(resp.StatusCode)).Inc()
	if resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	// Read the first bytes before answering: a node that dies before
	// them is retried elsewhere.
	br := make([]byte, 32<<10)
	n, rerr := resp.Body.Read(br)
	if n == 0 && rerr != nil && rerr != io.EOF {
		return false, rerr
	}
	r.upstream.WithLabelValues(b.id).Observe(time.Since(t0).Seconds())
	firstByte()
	copyHeader(w.Header(), resp.Header)
	if rewrite != nil { // the client's cached tokens are the prefill node's
		w.Header().Set("X-Kvmesh-Cached-Tokens", w.Header().Get("X-Kvmesh-Prefill-Cached-Tokens"))
		w.Header().Set("X-Kvmesh-Decode-Node", b.id)
	}
	w.Header().Set("X-Kvmesh-Node", b.id)
	w.Header().Set("X-Kvmesh-Router-Node", b.id)
	if !stream {
		rest, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return false, err
		}
		all := append(br[:n], rest...)
		if rewrite != nil && resp.StatusCode == http.StatusOK {
			all = rewriteUsage(all, rewrite)
			w.Header().Set("X-Kvmesh-Decode-Node-Ms", strconv.FormatFloat(ms(time.Since(t0)), 'f', 3, 64))
		}
		w.Header().Del("Content-Length")
		w.Header().Set("Content-Length", strconv.Itoa(len(all)))
		w.WriteHeader(resp.StatusCode)
		w.Write(all)
		return true, nil
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	var pending []byte // an event not yet complete (rewrite only)
	out := func(p []byte) error {
		if rewrite != nil {
			pending = append(pending, p...)
			cut := bytes.LastIndex(pending, []byte("\n\n"))
			if cut < 0 {
				return nil
			}
			p = rewriteEvents(pending[:cut+2], rewrite)
			pending = append(pending[:0], pending[cut+2:]...)
		}
		if _, err := w.Write(p); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := out(br[:n]); err != nil {
		return true, nil // the client left
	}
	for rerr == nil {
		n, rerr = resp.Body.Read(br)
		if n > 0 {
			if err := out(br[:n]); err != nil {
				return true, nil
			}
		}
	}
	if rerr != io.EOF {
		return true, rerr
	}
	return true, nil
}

// rewriteUsage applies f to the usage of a JSON answer; an answer without
// usage is returned as is.
func rewriteUsage(b []byte, f func(*openai.Usage)) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || m["usage"] == nil || string(m["usage"]) == "null" {
		return b
	}
	var u openai.Usage
	if json.Unmarshal(m["usage"], &u) != nil {
		return b
	}
	f(&u)
	m["usage"], _ = json.Marshal(u)
	out, err := json.Marshal(m)
	if err != nil {
		return b
	}
	return out
}

// rewriteEvents applies f to the usage of each complete event in b.
func rewriteEvents(b []byte, f func(*openai.Usage)) []byte {
	var out []byte
	for ev := range bytes.SplitSeq(b, []byte("\n\n")) {
		if len(ev) == 0 {
			continue
		}
		if data, ok := bytes.CutPrefix(ev, []byte("data: {")); ok && bytes.Contains(data, []byte(`"usage"`)) {
			ev = append([]byte("data: "), rewriteUsage(append([]byte("{"), data...), f)...)
		}
		out = append(append(out, ev...), '\n', '\n')
	}
	return out
}

// prefillBody is the request body of the prefill step: the client's, not
// streamed, generating one token.
func prefillBody(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("the request body is not a JSON object: %w", err)
	}
	m["stream"] = json.RawMessage("false")
	delete(m, "stream_options")
	delete(m, "max_completion_tokens")
	m["max_tokens"] = json.RawMessage("1")
	return json.Marshal(m)
}

// hopHeaders are not forwarded (RFC 9110 §7.6.1), nor is Content-Length,
// which the transport sets.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true}

func copyRequestHeader(dst, src http.Header) {
	for k, vs := range src {
		if !hopHeaders[k] {
			dst[k] = slices.Clone(vs)
		}
	}
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		if !hopHeaders[k] {
			dst[k] = slices.Clone(vs)
		}
	}
}

// captureWriter is an http.ResponseWriter that keeps the answer.
type captureWriter struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (c *captureWriter) Header() http.Header { return c.header }

func (c *captureWriter) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}
}

func (c *captureWriter) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return c.body.Write(b)
}

// scheme is how the router reaches the nodes' HTTP addresses.
func (r *Router) scheme() string {
	if r.opts.NodeTLS != nil {
		return "https://"
	}
	return "http://"
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
