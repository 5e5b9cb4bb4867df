package openai

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/atomicfile"
)

// SignatureHeader carries a callback's signature: "sha256=" and the hex
// HMAC-SHA256 of the body under the tenant's callback key (CallbackKey).
const SignatureHeader = "X-Kvmesh-Signature"

// Callback delivery: attempts per batch, and the first wait between two
// (doubling).
const (
	callbackAttempts = 5
	callbackBackoff  = time.Second
	callbackTimeout  = 10 * time.Second // one attempt
	callbackQueue    = 1024             // finished batches waiting for delivery
)

// callbacks POSTs {"request_id", "status"} of each finished batch that
// asked for it to its callback_url, signed, retried with backoff up to
// callbackAttempts times. Only URLs whose host (or host:port) the operator
// allowed are accepted at submission (allowed), so the node cannot be
// pointed at an internal address. Deliveries wait in a bounded queue; one
// goroutine (run) sends them. A delivery is durable: the batch store
// writes its pending mark with the answer that finishes the batch, and
// forgets it (done) once it was delivered or given up on, so one pending
// when the node stops or crashes is sent after the restart (pending
// reloads them at start, and whenever the queue overflowed).
type callbacks struct {
	allow  []string // HOST or HOST:PORT, lower case
	key    []byte   // the node's callback secret; a tenant's key derives from it
	client *http.Client
	queue  chan batchMeta
	log    *slog.Logger
	sent   prometheus.Counter
	failed prometheus.Counter
	// pending returns the deliveries stored and not yet done; done forgets
	// one. Both are the batch store's (batches.pendingCallbacks,
	// batches.callbackDone).
	pending func() []batchMeta
	done    func(id string)

	mu struct {
		sync.Mutex
		queued   map[string]bool // in queue or being delivered
		overflow bool            // some were left out of a full queue: reload from pending
	}
}

// loadCallbackSecret reads DataDir/callback-secret, or makes one (32 random
// bytes, 0600), so that the tenants' keys survive restarts.
func loadCallbackSecret(dataDir string) ([]byte, error) {
	path := filepath.Join(dataDir, "callback-secret")
	if b, err := os.ReadFile(path); err == nil && len(b) == 32 {
		return b, nil
	}
	b := make([]byte, 32)
	rand.Read(b)
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("openai: callback secret: %w", err)
	}
	return b, nil
}

func newCallbacks(allow []string, secret []byte, reg prometheus.Registerer, log *slog.Logger) *callbacks {
	c := &callbacks{key: secret, log: log, queue: make(chan batchMeta, callbackQueue),
		client: &http.Client{Timeout: callbackTimeout, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a redirect could lead anywhere
		}},
		sent:   prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_queue_callbacks_sent_total", Help: "Callbacks of finished batches delivered (a 2xx answer)."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_queue_callbacks_failed_total", Help: "Callbacks of finished batches given up on (every attempt failed, or the delivery queue was full)."}),
	}
	for _, a := range allow {
		if a = strings.ToLower(strings.TrimSpace(a)); a != "" {
			c.allow = append(c.allow, a)
		}
	}
	c.mu.queued = make(map[string]bool)
	reg.MustRegister(c.sent, c.failed)
	return c
}

// CallbackKey is the key a tenant's callbacks are signed with: the
// HMAC-SHA256 of its name under the node's callback secret. GET
// /v1/queue/callback-key tells a tenant its own.
func CallbackKey(secret []byte, tenant string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("kvmesh-callback\x00" + tenant))
	return h.Sum(nil)
}

// Sign returns SignatureHeader's value for body under key.
func Sign(key, body []byte) string {
	h := hmac.New(sha256.New, key)
	h.Write(body)
	return "sha256=" + hex.EncodeToString(h.Sum(nil))
}

// allowed checks a callback_url: http or https, no credentials, and a host
// (with its port, or any port) the operator allowed.
func (c *callbacks) allowed(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("not a URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("the scheme must be http or https")
	case u.User != nil:
		return errors.New("credentials in the URL are not accepted")
	case u.Host == "":
		return errors.New("no host")
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if slices.Contains(c.allow, host) || slices.Contains(c.allow, net.JoinHostPort(host, port)) {
		return nil
	}
	if len(c.allow) == 0 {
		return errors.New("this node accepts no callback hosts (kvmesh serve --callback-allow)")
	}
	return fmt.Errorf("the host %s is not among the hosts this node may call (--callback-allow)", net.JoinHostPort(host, port))
}

// enqueue hands a finished batch to the sender, once. A full queue leaves
// it stored: the sender reloads it once the queue has drained.
func (c *callbacks) enqueue(m batchMeta) {
	if m.Callback == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.queued[m.ID] {
		return
	}
	select {
	case c.queue <- m:
		c.mu.queued[m.ID] = true
	default:
		if !c.mu.overflow {
			c.log.Warn("queue: too many callbacks waiting; the rest are sent once these are", "waiting", len(c.queue))
		}
		c.mu.overflow = true
	}
}

// run sends the stored callbacks, then those of batches that finish, until
// ctx ends.
func (c *callbacks) run(ctx context.Context) {
	c.reload()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-c.queue:
			if !c.deliver(ctx, m) {
				return // stopped: it stays stored and is sent after a restart
			}
			if c.done != nil {
				c.done(m.ID)
			}
			c.mu.Lock()
			delete(c.mu.queued, m.ID)
			reload := c.mu.overflow && len(c.queue) == 0
			c.mu.Unlock()
			if reload {
				c.reload()
			}
		}
	}
}

// reload enqueues the stored deliveries not yet done.
func (c *callbacks) reload() {
	if c.pending == nil {
		return
	}
	c.mu.Lock()
	c.mu.overflow = false
	c.mu.Unlock()
	for _, m := range c.pending() {
		c.enqueue(m)
	}
}

// deliver sends m's callback; it reports false when ctx ended before it
// was delivered or given up on.
func (c *callbacks) deliver(ctx context.Context, m batchMeta) bool {
	body := mustJSON(batchStatus{RequestID: m.ID, Status: m.State})
	sig := Sign(CallbackKey(c.key, m.Owner.Tenant), body)
	wait := callbackBackoff
	var last string
	for attempt := 1; attempt <= callbackAttempts; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.Callback, bytes.NewReader(body))
		if err != nil {
			last = err.Error()
			break
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(SignatureHeader, sig)
		resp, err := c.client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				c.sent.Inc()
				return true
			}
			last = resp.Status
		} else {
			if ctx.Err() != nil {
				return false
			}
			last = err.Error()
		}
		if attempt == callbackAttempts {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		wait *= 2
	}
	c.failed.Inc()
	c.log.Warn("queue: callback not delivered", "id", m.ID, "url", m.Callback, "last", last)
	return true
}
