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
	"unicode/utf8"

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
	callbackWorkers  = 8                // deliveries at once, all tenants
	callbackTenant   = 2                // deliveries at once, one tenant's
)

// callbacks POSTs {"request_id", "status"} of each finished batch that
// asked for it to its callback_url, signed, retried with backoff up to
// callbackAttempts times. Only URLs whose host and port the operator
// allowed are accepted, at submission (allowed) and again at each
// delivery, whose connection goes to the address the host resolved to
// then (pinned: no second lookup between the check and the connection),
// never to a loopback, link-local, multicast or unspecified address unless
// the allowlist names it; so the node cannot be pointed at an internal
// address, by the URL or by the host's DNS. Deliveries wait in a bounded
// queue, one list per tenant; callbackWorkers goroutines send them, taking
// the tenants in turn and at most callbackTenant of one tenant's at once,
// so one tenant's slow endpoint delays no other tenant's. A delivery is
// durable: the batch store writes its pending mark with the answer that
// finishes the batch, and forgets it (done) once it was delivered or given
// up on, so one pending when the node stops or crashes is sent after the
// restart (pending reloads them at start, and whenever the queue
// overflowed).
type callbacks struct {
	allow  []string // HOST (its scheme's default port) or HOST:PORT, lower case
	key    []byte   // the cluster's callback secret; a tenant's key derives from it
	client *http.Client
	log    *slog.Logger
	sent   prometheus.Counter
	failed prometheus.Counter
	// pending returns the deliveries stored and not yet done; done forgets
	// one. Both are the batch store's (batches.pendingCallbacks,
	// batches.callbackDone).
	pending func() []batchMeta
	done    func(id string)
	// resolve looks a host up at delivery (net.DefaultResolver's; tests
	// replace it).
	resolve func(ctx context.Context, host string) ([]net.IP, error)

	mu struct {
		sync.Mutex
		queued   map[string]bool        // waiting or being delivered
		waiting  map[string][]batchMeta // by tenant
		tenants  []string               // with deliveries waiting, in turn order
		busy     map[string]int         // deliveries in flight, by tenant
		n        int                    // waiting, all tenants
		overflow bool                   // some were left out of a full queue: reload from pending
		changed  chan struct{}          // closed (and replaced) when a delivery can start
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
	c := &callbacks{key: secret, log: log,
		resolve: func(ctx context.Context, host string) ([]net.IP, error) {
			return net.DefaultResolver.LookupIP(ctx, "ip", host)
		},
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
	c.mu.waiting, c.mu.busy = make(map[string][]batchMeta), make(map[string]int)
	c.mu.changed = make(chan struct{})
	// Each attempt dials the address deliver resolved and checked, pinned
	// in its context: never a second lookup.
	c.client.Transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			pinned, ok := ctx.Value(pinnedKey{}).(string)
			if !ok {
				return nil, errors.New("openai: a callback's address was not resolved and checked")
			}
			return (&net.Dialer{Timeout: callbackTimeout}).DialContext(ctx, network, pinned)
		},
		DisableKeepAlives: true, // a kept connection would skip the next attempt's check
	}
	reg.MustRegister(c.sent, c.failed)
	return c
}

type pinnedKey struct{}

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
// and port the operator allowed (an entry without a port allows the
// scheme's default port only).
func (c *callbacks) allowed(raw string) error {
	_, _, err := c.check(raw)
	return err
}

// check is allowed's check; it returns the URL's host and port.
func (c *callbacks) check(raw string) (host, port string, err error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "", "", fmt.Errorf("not a URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", "", errors.New("the scheme must be http or https")
	case u.User != nil:
		return "", "", errors.New("credentials in the URL are not accepted")
	case u.Host == "":
		return "", "", errors.New("no host")
	}
	host, port = strings.ToLower(u.Hostname()), u.Port()
	def := map[string]string{"http": "80", "https": "443"}[u.Scheme]
	if port == "" {
		port = def
	}
	if (port == def && slices.Contains(c.allow, host)) || slices.Contains(c.allow, net.JoinHostPort(host, port)) {
		return host, port, nil
	}
	if len(c.allow) == 0 {
		return "", "", errors.New("this node accepts no callback hosts (kvmesh serve --callback-allow)")
	}
	return "", "", fmt.Errorf("the host %s is not among the hosts this node may call (--callback-allow: a host alone allows its scheme's default port only)", net.JoinHostPort(host, port))
}

// pin resolves an allowed URL's host, at delivery, and returns the address
// to dial: the first address it resolved to that is not loopback,
// link-local, multicast or unspecified (unless the allowlist names that
// address itself), so that a host's DNS cannot point a callback inside.
func (c *callbacks) pin(ctx context.Context, raw string) (string, error) {
	host, port, err := c.check(raw)
	if err != nil {
		return "", err
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else if ips, err = c.resolve(ctx, host); err != nil {
		return "", fmt.Errorf("resolve %s: %w", host, err)
	}
	for _, ip := range ips {
		named := slices.Contains(c.allow, ip.String()) || slices.Contains(c.allow, net.JoinHostPort(ip.String(), port))
		if named || !(ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified()) {
			return net.JoinHostPort(ip.String(), port), nil
		}
	}
	return "", fmt.Errorf("%s resolves to %v, none of which a callback may reach (name the address in --callback-allow to allow it)", host, ips)
}

// enqueue hands a finished batch to the senders, once. A full queue leaves
// it stored: the senders reload it once the queue has drained.
func (c *callbacks) enqueue(m batchMeta) {
	if m.Callback == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.queued[m.ID] {
		return
	}
	if c.mu.n >= callbackQueue {
		if !c.mu.overflow {
			c.log.Warn("queue: too many callbacks waiting; the rest are sent once these are", "waiting", c.mu.n)
		}
		c.mu.overflow = true
		return
	}
	t := m.Owner.Tenant
	if len(c.mu.waiting[t]) == 0 {
		c.mu.tenants = append(c.mu.tenants, t)
	}
	c.mu.waiting[t] = append(c.mu.waiting[t], m)
	c.mu.queued[m.ID] = true
	c.mu.n++
	c.changedLocked()
}

func (c *callbacks) changedLocked() {
	close(c.mu.changed)
	c.mu.changed = make(chan struct{})
}

// nextLocked takes the next delivery to start: the first tenant in turn
// with one waiting and fewer than callbackTenant in flight, which then
// goes to the back of the turn order.
func (c *callbacks) nextLocked() (batchMeta, bool) {
	for i, t := range c.mu.tenants {
		if c.mu.busy[t] >= callbackTenant {
			continue
		}
		m := c.mu.waiting[t][0]
		if c.mu.waiting[t] = c.mu.waiting[t][1:]; len(c.mu.waiting[t]) == 0 {
			delete(c.mu.waiting, t)
			c.mu.tenants = slices.Delete(c.mu.tenants, i, i+1)
		} else {
			c.mu.tenants = append(slices.Delete(c.mu.tenants, i, i+1), t)
		}
		c.mu.busy[t]++
		c.mu.n--
		return m, true
	}
	return batchMeta{}, false
}

// run sends the stored callbacks, then those of batches that finish, with
// callbackWorkers senders, until ctx ends; it returns once they stopped.
func (c *callbacks) run(ctx context.Context) {
	c.reload()
	var wg sync.WaitGroup
	for range callbackWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.send(ctx)
		}()
	}
	wg.Wait()
}

// send is one sender: it delivers what nextLocked gives it until ctx ends.
func (c *callbacks) send(ctx context.Context) {
	for {
		c.mu.Lock()
		m, ok := c.nextLocked()
		changed := c.mu.changed
		c.mu.Unlock()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				continue
			}
		}
		delivered := c.deliver(ctx, m)
		if delivered && c.done != nil {
			c.done(m.ID)
		}
		c.mu.Lock()
		c.mu.busy[m.Owner.Tenant]--
		if c.mu.busy[m.Owner.Tenant] == 0 {
			delete(c.mu.busy, m.Owner.Tenant)
		}
		delete(c.mu.queued, m.ID)
		reload := c.mu.overflow && c.mu.n == 0
		c.changedLocked()
		c.mu.Unlock()
		if !delivered {
			return // stopped: it stays stored and is sent after a restart
		}
		if reload {
			c.reload()
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
// was delivered or given up on. Each attempt checks the URL against the
// allowlist in force and dials the address it resolves to then (pin).
func (c *callbacks) deliver(ctx context.Context, m batchMeta) bool {
	body := mustJSON(batchStatus{RequestID: m.ID, Status: m.State})
	sig := Sign(CallbackKey(c.key, m.Owner.Tenant), body)
	wait := callbackBackoff
	var last string
	for attempt := 1; attempt <= callbackAttempts; attempt++ {
		addr, err := c.pin(ctx, m.Callback)
		if err != nil {
			last = err.Error()
			break // refused: no retry changes the allowlist
		}
		req, err := http.NewRequestWithContext(context.WithValue(ctx, pinnedKey{}, addr), http.MethodPost, m.Callback, bytes.NewReader(body))
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
	c.log.Warn("queue: callback not delivered", "id", m.ID, "url", clip(m.Callback), "last", last)
	return true
}

// clip returns what a caller sent as a log line or an error message may
// repeat it: valid UTF-8, at most 256 bytes, saying how much was cut.
func clip(s string) string { return clipTo(s, 256) }

// clipTo is clip to n bytes.
func clipTo(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes cut)", len(s)-cut)
}
