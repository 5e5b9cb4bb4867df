package openai

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefill"
)

// The asynchronous API, on the HTTP address beside the completions:
//
//	POST   /v1/queue        {"requests": [R, ...]} → 202 {"request_id", "status": "queued"}
//	GET    /v1/queue/{id}   {"request_id", "status"[, "responses"]}
//	DELETE /v1/queue/{id}   cancels what has not started
//
// Each R is a body /v1/chat/completions (it has messages) or
// /v1/completions (it has prompt) accepts, not streamed; it is checked at
// submission, so a bad one refuses the batch with 400 naming requests[i].
// A batch is stored durably (batches) before the 202 and answered in full
// once completed: one OpenAI response per request, in order, or an OpenAI
// error object in place of a request that failed. Workers
// (BatchOptions.Share of the engine's slots) run the batches in order, a
// request at a time, each with Engine.Generate as background work started
// only once the engine is idle (Engine.WaitIdle: no synchronous request
// for the grace period), so synchronous requests keep priority; one that
// arrives preempts the queued request between two chunks or decode steps.
// Limits: BatchOptions (413 for too many
// requests or bytes, 429 with Retry-After only for the tenant's own queue
// quota, 503 for the node's). Another tenant's id, like an unknown one, is
// 404. With callback_url (a host BatchOptions.CallbackAllow allows, else
// 400) the node POSTs {"request_id", "status"} once the batch finished,
// signed (SignatureHeader) with the key GET /v1/queue/callback-key tells
// the tenant (callback.go). Through
// the router (kvmesh route), a batch lives on the node that accepted it and is
// found by asking the nodes; any node with headroom may run it (steal.go).
const QueuePath = "/v1/queue"

// QueueList is GET /v1/queue's answer: the caller's batches, those not
// finished first (in order), then the most recently finished, at most
// maxQueueList.
type QueueList struct {
	Object string       `json:"object"`
	Data   []QueueBatch `json:"data"`
}

// QueueBatch describes one batch of QueueList; times are Unix seconds, 0
// for not yet.
type QueueBatch struct {
	RequestID string `json:"request_id"`
	Status    string `json:"status"`
	Requests  int    `json:"requests"`
	Answered  int    `json:"answered"`
	Failed    int    `json:"failed"`
	Runs      int    `json:"runs"`
	Created   int64  `json:"created"`
	Started   int64  `json:"started"`
	Finished  int64  `json:"finished"`
}

const maxQueueList = 1000

// batchMetrics are the asynchronous API's metrics.
type batchMetrics struct {
	requests *prometheus.CounterVec // outcome: completed, failed, cancelled
	wait     prometheus.Histogram
	steals   *prometheus.CounterVec // direction: lent, borrowed
	claims   *prometheus.CounterVec // answer: lent, none, error
	control  *prometheus.CounterVec // kind: the control requests this node received (controlKinds)
}

// The kinds of kvmesh_control_requests_total: requests a node receives
// from its peers or the router that carry no client's work of their own.
const (
	controlQueueForwarded = "queue_forwarded" // GET or DELETE QueuePath/{id} a peer or the router passed on
	controlLookup         = "lookup"          // LookupPath: a router's probe of a prompt's cost
	controlClaim          = "claim"           // a peer's claim of a queued batch (work stealing)
	controlLease          = "lease"           // a lessee's answer, renewal or release
)

func newBatchMetrics(reg prometheus.Registerer, b *batches) *batchMetrics {
	m := &batchMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_queue_requests_total",
			Help: "Requests of queued batches (POST /v1/queue) answered, by outcome: completed, failed, cancelled.",
		}, []string{"outcome"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvmesh_queue_wait_seconds",
			Help:    "Time from a batch's submission to the start of its first run.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 12),
		}),
	}
	m.steals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_queue_steals_total",
		Help: "Queued batches run by another node than the one that stored them: lent (this node stored it, a peer claimed it) or borrowed (this node claimed a peer's).",
	}, []string{"direction"})
	m.claims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_queue_claims_total",
		Help: "Claims this node sent to its peers for a queued batch (work stealing), by answer: lent, none (the peer had none to lend) or error.",
	}, []string{"answer"})
	m.control = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_control_requests_total",
		Help: "Control requests this node received, by kind: queue_forwarded (GET or DELETE /v1/queue/{id} passed on by a peer or the router), lookup (the prompt-cost lookup a router asks before it routes a completion), claim (a peer asking for a queued batch to run) and lease (a peer's answer, renewal or release of a batch it runs).",
	}, []string{"kind"})
	for _, k := range []string{controlQueueForwarded, controlLookup, controlClaim, controlLease} {
		m.control.WithLabelValues(k) // every kind is a series from the start
	}
	reg.MustRegister(m.requests, m.wait, m.steals, m.claims, m.control,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvmesh_queue_queued_requests",
			Help: "Requests of queued batches waiting for their batch to start.",
		}, func() float64 { q, _ := b.counts(); return float64(q) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvmesh_queue_running_requests",
			Help: "Requests of running batches not yet answered.",
		}, func() float64 { _, r := b.counts(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvmesh_queue_callbacks_pending",
			Help: "Callbacks of finished batches not yet delivered nor given up on; they are kept with the batch and sent after a restart.",
		}, func() float64 { return float64(len(b.pendingCallbacks())) }))
	return m
}

// batchStatus is the answer of the queue's endpoints.
type batchStatus struct {
	RequestID string            `json:"request_id"`
	Status    string            `json:"status"`
	Responses []json.RawMessage `json:"responses,omitempty"`
}

// list answers GET QueuePath: the caller's batches.
func (o *API) list(w http.ResponseWriter, r *http.Request, who auth.Principal) error {
	out := QueueList{Object: "list", Data: []QueueBatch{}}
	for _, m := range o.batches.list(ownerOf(who), maxQueueList) {
		qb := QueueBatch{RequestID: m.ID, Status: m.State, Requests: m.N, Answered: m.Done, Failed: m.Failed,
			Created: m.Enqueued.Unix(), Runs: m.Runs}
		if !m.Started.IsZero() {
			qb.Started = m.Started.Unix()
		}
		if !m.Finished.IsZero() {
			qb.Finished = m.Finished.Unix()
		}
		out.Data = append(out.Data, qb)
	}
	WriteJSON(w, http.StatusOK, out)
	return nil
}

// callbackKey answers GET QueuePath/callback-key: the key this caller's
// callbacks are signed with (Sign).
func (o *API) callbackKey(w http.ResponseWriter, _ *http.Request, who auth.Principal) error {
	WriteJSON(w, http.StatusOK, struct {
		Key string `json:"key"`
	}{hex.EncodeToString(CallbackKey(o.callbacks.key, ownerOf(who).Tenant))})
	return nil
}

// batchNotFound is the answer about a batch no node holds for the caller.
func batchNotFound(id string) error {
	return newHTTPError(http.StatusNotFound, "request_id", "not_found", "no queued batch %q (unknown, expired, or not yours)", id)
}

// status answers GET QueuePath/{id}; a batch this node does not hold is
// asked of its peers.
func (o *API) status(w http.ResponseWriter, r *http.Request, who auth.Principal) error {
	id := r.PathValue("id")
	m, resps, err := o.batches.get(id, ownerOf(who))
	switch {
	case errors.Is(err, errBatchNotFound):
		if ok, err := o.askPeers(w, r, who); ok || err != nil { // a batch another node stored: it answers
			return err
		}
		return batchNotFound(id)
	case err != nil:
		return err
	}
	WriteJSON(w, http.StatusOK, batchStatus{RequestID: m.ID, Status: m.State, Responses: resps})
	return nil
}

// cancelBatch answers DELETE QueuePath/{id}; a batch this node does not hold is
// asked of its peers.
func (o *API) cancelBatch(w http.ResponseWriter, r *http.Request, who auth.Principal) error {
	id := r.PathValue("id")
	state, err := o.batches.cancel(id, ownerOf(who))
	switch {
	case errors.Is(err, errBatchNotFound):
		if ok, err := o.askPeers(w, r, who); ok || err != nil {
			return err
		}
		return batchNotFound(id)
	case errors.Is(err, errBatchDone):
		return newHTTPError(http.StatusConflict, "request_id", "already_finished", "the batch %q is already %s", id, state)
	case err != nil:
		return err
	}
	WriteJSON(w, http.StatusOK, batchStatus{RequestID: id, Status: state})
	return nil
}

// submit answers POST QueuePath: it checks and stores a batch.
func (o *API) submit(w http.ResponseWriter, r *http.Request, who auth.Principal) error {
	owner, lim := ownerOf(who), o.opts.Batch
	var body struct {
		Requests    []json.RawMessage `json:"requests"`
		CallbackURL *string           `json:"callback_url"`
	}
	if err := o.decodeBody(w, r, &body, lim.MaxBodyBytes); err != nil {
		return err
	}
	switch {
	case body.Requests == nil:
		return badRequest("requests", "requests is required: an array of completion or chat completion requests")
	case len(body.Requests) == 0:
		return badRequest("requests", "requests is empty")
	case len(body.Requests) > lim.MaxRequests:
		return newHTTPError(http.StatusRequestEntityTooLarge, "requests", "too_many_requests_in_batch", "requests: %d requests, at most %d per batch", len(body.Requests), lim.MaxRequests)
	}
	var callback string
	if body.CallbackURL != nil {
		if err := o.callbacks.allowed(*body.CallbackURL); err != nil {
			return badRequest("callback_url", "callback_url: %v", err)
		}
		callback = *body.CallbackURL
	}
	stored := make([][]byte, len(body.Requests))
	for i, raw := range body.Requests {
		kind, canon, err := o.checkQueued(raw)
		if err != nil {
			var he *httpError
			if errors.As(err, &he) {
				param := "requests[" + strconv.Itoa(i) + "]"
				if he.Param != nil {
					param += "." + *he.Param
				}
				he.Param, he.Message = &param, "requests["+strconv.Itoa(i)+"]: "+he.Message
			}
			return err
		}
		stored[i] = append([]byte{kind}, canon...)
	}
	m, err := o.batches.submit(owner, stored, callback)
	switch {
	case errors.Is(err, errBatchTenantFull):
		he := newHTTPError(http.StatusTooManyRequests, "", "queue_quota_exceeded", "%v; retry once some have completed", err)
		he.retryAfter = 30
		return he
	case errors.Is(err, errBatchFull):
		return newHTTPError(http.StatusServiceUnavailable, "", "queue_full", "%v; retry later or on another node", err)
	case errors.Is(err, errBatchClosed):
		return newHTTPError(http.StatusServiceUnavailable, "", "", "the node is shutting down; retry on another node")
	case err != nil:
		return err
	}
	WriteJSON(w, http.StatusAccepted, batchStatus{RequestID: m.ID, Status: batchQueued})
	return nil
}

// checkQueued checks one request of a batch as its endpoint would and
// returns its kind, 'c' (chat) or 't' (completion), and the request as it
// is stored (canonicalRequest: what the API knows of it, nothing else).
func (o *API) checkQueued(raw json.RawMessage) (byte, []byte, error) {
	req, kind, err := decodeQueued(raw)
	if err != nil {
		return 0, nil, err
	}
	if req.Stream {
		return 0, nil, badRequest("stream", "stream: a queued request cannot be streamed")
	}
	if _, err := o.check(req, kind == 'c', ""); err != nil {
		return 0, nil, err
	}
	canon, err := canonicalRequest(req)
	if err != nil {
		return 0, nil, badRequest("", "%v", err)
	}
	return kind, canon, nil
}

// decodeQueued decodes a request of a batch and tells its kind by its
// fields: messages for chat, prompt for a completion.
func decodeQueued(raw json.RawMessage) (*completionRequest, byte, error) {
	var req completionRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, 0, badRequest(typeErr.Field, "%s: expected %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return nil, 0, badRequest("", "not a JSON object: %v", err)
	}
	chat, prompt := len(req.Messages) > 0 && string(req.Messages) != "null", len(req.Prompt) > 0 && string(req.Prompt) != "null"
	switch {
	case chat && prompt:
		return nil, 0, badRequest("", "give messages (a chat completion) or prompt (a completion), not both")
	case chat:
		return &req, 'c', nil
	case prompt:
		return &req, 't', nil
	}
	return nil, 0, badRequest("", "a request needs messages (a chat completion) or prompt (a completion)")
}

// runQueued answers one stored request of a batch as owner's: the JSON of
// an OpenAI response, or of an error object (failed). ctx's end
// interrupts it; the caller then records nothing.
func (o *API) runQueued(ctx context.Context, owner queueOwner, stored []byte) (resp []byte, failed bool) {
	began := time.Now()
	fail := func(he *httpError) ([]byte, bool) {
		return mustJSON(struct {
			Error apiError `json:"error"`
		}{he.apiError}), true
	}
	if len(stored) == 0 {
		return fail(newHTTPError(http.StatusInternalServerError, "", "", "the stored request is empty"))
	}
	chat := stored[0] == 'c'
	req, _, err := decodeQueued(stored[1:])
	if err != nil {
		return fail(err.(*httpError))
	}
	j, err := o.check(req, chat, "")
	if err != nil {
		var he *httpError
		if errors.As(err, &he) {
			return fail(he)
		}
		return fail(newHTTPError(http.StatusInternalServerError, "", "", "%v", err))
	}
	opts := j.opts
	opts.Background = true // yields to synchronous requests between chunks and decode steps
	g, err := o.engine.Generate(owner.context(ctx), j.prompt, opts)
	if err != nil {
		if errors.Is(err, prefill.ErrInvalidInput) {
			return fail(badRequest("", "%s", strings.TrimPrefix(err.Error(), prefill.ErrInvalidInput.Error()+": ")))
		}
		return fail(newHTTPError(http.StatusInternalServerError, "", "", "the request failed: %v", err))
	}
	path := "/v1/completions"
	out := responseJSON{ID: newID("cmpl-"), Object: "text_completion", Created: began.Unix(), Model: o.model, SystemFingerprint: o.fingerprint()}
	if chat {
		path = "/v1/chat/completions"
		out.ID, out.Object = newID("chatcmpl-"), "chat.completion"
	}
	o.account(path+" (queued)", j, g, began)
	var dec textDecoder
	return mustJSON(whole(out, chat, dec.text(o.tok.Decode(g.Tokens), true), g)), false
}

// batchRun is one run of a batch by a worker: of this node's own (start
// marks it running) or of a peer's it claimed (steal.go: the owner started
// it, and the answers go back to it).
type batchRun struct {
	meta    batchMeta
	start   func() (batchMeta, bool) // nil: started already
	request func(i int) ([]byte, error)
	answer  func(i int, resp []byte, failed bool) (more bool, err error)
}

// batchWorkers is how many workers run queued batches at once:
// BatchOptions.Share of the engine's Concurrency, at least one; none with
// a negative Share.
func batchWorkers(o Options) int {
	if o.Batch.Share < 0 {
		return 0
	}
	return max(1, int(o.Batch.Share*float64(o.Concurrency)))
}

// workBatches runs the queued batches until the service stops: this
// node's, and, while it has none to run, those it pulls from its peers
// (steal.go). A request interrupted by the stop is not recorded: it runs
// again from its start when the node reopens its data dir (or, for a
// peer's, when its lease lapses).
func (o *API) workBatches() {
	defer o.wg.Done()
	wait := o.batches.opts.StealInterval
	if wait < 0 || o.opts.Alone {
		wait = time.Hour // nobody to pull from: wake on submissions only
	}
	for {
		m, ok, err := o.batches.take(o.ctx, wait)
		switch {
		case err != nil:
			return
		case ok:
			id := m.ID
			o.runBatch(batchRun{meta: m,
				start:   func() (batchMeta, bool) { return o.batches.start(id) },
				request: func(i int) ([]byte, error) { return o.batches.request(id, i) },
				answer:  func(i int, resp []byte, failed bool) (bool, error) { return o.batches.answer(id, i, resp, failed) },
			})
		case wait != time.Hour:
			o.steal()
		}
	}
}

// runBatch answers r's requests in order, each started once the engine is
// idle (Engine.WaitIdle) and run as background work that yields to
// synchronous requests (runQueued).
func (o *API) runBatch(r batchRun) {
	m := r.meta
	for i := m.Done; i < m.N; i++ {
		if err := o.engine.WaitIdle(o.ctx); err != nil {
			return
		}
		if i == m.Done && r.start != nil {
			var ok bool
			if m, ok = r.start(); !ok {
				return
			}
			if m.Runs == 1 {
				o.batchMetrics.wait.Observe(m.Started.Sub(m.Enqueued).Seconds())
			}
		}
		stored, err := r.request(i)
		var (
			resp   []byte
			failed bool
		)
		if err != nil {
			resp, failed = mustJSON(struct {
				Error apiError `json:"error"`
			}{newHTTPError(http.StatusInternalServerError, "", "", "the queued request could not be read back: %v", err).apiError}), true
		} else {
			resp, failed = o.runQueued(o.ctx, m.Owner, stored)
		}
		if o.ctx.Err() != nil {
			o.log.Info("queue: batch interrupted by shutdown; its request runs again after a restart", "id", m.ID, "request", i)
			return
		}
		// Counted before the answer is visible, so a client that sees it
		// sees it counted.
		if failed {
			o.batchMetrics.requests.WithLabelValues("failed").Inc()
		} else {
			o.batchMetrics.requests.WithLabelValues("completed").Inc()
		}
		more, err := r.answer(i, resp, failed)
		if err != nil {
			o.log.Error("queue: cannot record a response", "id", m.ID, "request", i, "err", err)
			return
		}
		if !more {
			break
		}
	}
	o.log.Info("queue: batch done", "id", m.ID, "requests", m.N, "runs", m.Runs)
}

// reapBatches deletes expired batches now and then.
func (o *API) reapBatches() {
	defer o.wg.Done()
	t := time.NewTicker(min(o.batches.opts.ResultTTL/4, time.Minute))
	defer t.Stop()
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
			o.batches.expire()
		}
	}
}
