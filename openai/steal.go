package openai

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/auth"
)

// Work stealing: a queued batch is stored by the node that accepted it (its
// owner) and run by any node of the cluster with headroom. Every node
// advertises in its gossip metadata, every BatchOptions.StealInterval, how
// many of its batches a peer could take (advertiseBacklog; rounded down to
// a power of two, so that it changes seldom). A worker with nothing of its
// own to run (batches.take found none within StealInterval) waits until
// its engine is idle and asks at most two of the peers that advertise a
// backlog, the two drawn at random and the larger backlog first (the power
// of two choices), to lease it a batch they have not started; an idle
// cluster sends no claims at all, and a claim's cost does not grow with the
// cluster (issue 35: asking every peer in turn cost an idle node N-1 calls
// a second):
//
//	POST /internal/queue/claim         {"node"} → 200 stolenBatch, or 204: none
//	POST /internal/queue/{id}/answer   {"node", "index", "response", "failed"} → {"more"}
//	POST /internal/queue/{id}/renew    {"node"}
//	POST /internal/queue/{id}/release  {"node"}
//
// on the peer's HTTP address, with the cluster credential (the tokens
// file's cluster token; the Cluster scope). The owner marks the batch
// running, durably, and leases it to the claimer for BatchOptions.LeaseTTL;
// the claimer runs the requests in order as its own queued work (yielding
// to its synchronous requests) and posts each answer back, which the owner
// stores as its own worker's (one synced write with the count: no request
// completes twice) and which renews the lease; a long request renews it
// every LeaseTTL/3. The owner accepts an answer only from the lease's
// holder and only for the next request. A claimer that dies or is cut off
// stops renewing: the lease lapses and the batch is taken again (by the
// owner's worker or another peer) from its first unanswered request, and a
// late answer from the old holder is refused (409) and dropped. An owner
// that restarts forgets its leases: the batch, "running" on disk, is taken
// again, and the old holder's answers are refused. The owner keeps the
// results, the callback and the status; GET /v1/queue/{id} on a node that
// does not hold the id asks its peers (queue.go's forwarding), as the
// router does.
const internalQueuePath = "/internal/queue/"

// ForwardedHeader marks a request one node passed to another, so that the
// other does not pass it on again.
const ForwardedHeader = "X-Kvmesh-Forwarded"

// stolenBatch is a claim's answer: what the claimer needs to run the
// batch's requests not yet answered.
type stolenBatch struct {
	RequestID string     `json:"request_id"`
	Owner     queueOwner `json:"owner"`
	N         int        `json:"n"`
	Done      int        `json:"done"`
	Runs      int        `json:"runs"`
	Requests  [][]byte   `json:"requests"` // requests Done..N-1, as stored: kind byte and JSON
	LeaseMs   int64      `json:"lease_ms"`
}

type leaseCall struct {
	Node     string          `json:"node"`
	Index    int             `json:"index"`
	Response json.RawMessage `json:"response,omitempty"`
	Failed   bool            `json:"failed,omitempty"`
}

// internal is the handler of one call of the owner's side of work
// stealing: fn answers a call from the peer with the cluster credential,
// its body decoded, counted as a control request of kind.
func (o *API) internal(kind string, fn func(w http.ResponseWriter, r *http.Request, call leaseCall) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o.batchMetrics.control.WithLabelValues(kind).Inc()
		err := o.internalCall(w, r, fn)
		if err == nil {
			return
		}
		var he *httpError
		if !errors.As(err, &he) {
			he = newHTTPError(http.StatusInternalServerError, "", "", "%v", err)
			o.log.Error("queue: a peer's request failed", "path", clip(r.URL.Path), "err", err)
		}
		WriteJSON(w, he.status, struct {
			Error apiError `json:"error"`
		}{he.apiError})
	}
}

func (o *API) internalCall(w http.ResponseWriter, r *http.Request, fn func(w http.ResponseWriter, r *http.Request, call leaseCall) error) error {
	if o.n.Stopping() {
		return newHTTPError(http.StatusServiceUnavailable, "", "", "this node runs no queue")
	}
	if _, err := o.n.Authorize(r.Header.Values("Authorization"), r.Method+" "+r.URL.Path, auth.Cluster); err != nil {
		return newHTTPError(http.StatusForbidden, "", "insufficient_scope", "the internal queue API needs the cluster credential")
	}
	var call leaseCall
	if err := o.decodeBody(w, r, &call, o.opts.Batch.MaxBodyBytes); err != nil {
		return err
	}
	if call.Node == "" || call.Node == o.n.ID() {
		return badRequest("node", "node: the claimer's id is required, and is not this node's")
	}
	return fn(w, r, call)
}

// answerLeased stores a lessee's answer (POST internalQueuePath{id}/answer).
func (o *API) answerLeased(w http.ResponseWriter, r *http.Request, call leaseCall) error {
	more, err := o.batches.answerLeased(r.PathValue("id"), call.Node, call.Index, call.Response, call.Failed, o.opts.Batch.LeaseTTL)
	if err != nil {
		return leaseError(err)
	}
	WriteJSON(w, http.StatusOK, struct {
		More bool `json:"more"`
	}{more})
	return nil
}

// renewLease extends a lessee's lease (POST internalQueuePath{id}/renew).
func (o *API) renewLease(w http.ResponseWriter, r *http.Request, call leaseCall) error {
	if err := o.batches.renewLease(r.PathValue("id"), call.Node, o.opts.Batch.LeaseTTL); err != nil {
		return leaseError(err)
	}
	WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}

// releaseLease takes a batch back from its lessee (POST
// internalQueuePath{id}/release).
func (o *API) releaseLease(w http.ResponseWriter, r *http.Request, call leaseCall) error {
	id := r.PathValue("id")
	if err := o.batches.releaseLease(id, call.Node); err != nil {
		return leaseError(err)
	}
	o.log.Info("queue: a peer gave a batch back", "id", clip(id), "peer", clip(call.Node))
	WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}

// leaseError is the answer to a lease call the store refused: 409 when the
// caller does not hold the lease.
func leaseError(err error) error {
	if errors.Is(err, errLeaseLost) {
		return newHTTPError(http.StatusConflict, "request_id", "lease_lost", "%v", err)
	}
	return err
}

// lend leases the oldest batch nobody runs to the caller and answers its
// requests not yet answered (POST internalQueuePath+"claim"); 204 when
// there is none.
func (o *API) lend(w http.ResponseWriter, _ *http.Request, call leaseCall) error {
	peer := call.Node
	b := o.batches
	c, _ := b.claimLocked(peer, b.opts.LeaseTTL)
	if c == nil {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	m, ok := b.start(c.ID)
	if !ok { // cancelled meanwhile
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if m.Runs == 1 {
		o.batchMetrics.wait.Observe(m.Started.Sub(m.Enqueued).Seconds())
	}
	// The tenant's name and tag, never its salt: the claimer derives that
	// from its own tokens file (Node.Tenant), so it crosses no network.
	owner := queueOwner{Tenant: m.Owner.Tenant, Tag: m.Owner.Tag}
	out := stolenBatch{RequestID: m.ID, Owner: owner, N: m.N, Done: m.Done, Runs: m.Runs, LeaseMs: b.opts.LeaseTTL.Milliseconds()}
	for i := m.Done; i < m.N; i++ {
		req, err := b.request(m.ID, i)
		if err != nil {
			b.releaseLease(m.ID, peer)
			return err
		}
		out.Requests = append(out.Requests, req)
	}
	o.batchMetrics.steals.WithLabelValues("lent").Inc()
	o.log.Info("queue: lent a batch to a peer", "id", m.ID, "peer", clip(peer), "from", m.Done, "requests", m.N)
	WriteJSON(w, http.StatusOK, out)
	return nil
}

// peerRequest sends a request to a peer's HTTP address with the cluster
// credential.
func (o *API) peerRequest(ctx context.Context, method, addr, path string, body any, header http.Header) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	scheme := "http://"
	if o.opts.PeerHTTPS {
		scheme = "https://"
	}
	req, err := http.NewRequestWithContext(ctx, method, scheme+addr+path, rd)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if tok := o.opts.PeerToken; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	req.Header.Set("Content-Type", "application/json")
	return o.peerHTTP.Do(req)
}

// leaseCallTo posts a lease call to a peer and decodes its answer into
// out (when set). errLeaseLost for 409.
func (o *API) leaseCallTo(ctx context.Context, addr, path string, call leaseCall, out any) error {
	resp, err := o.peerRequest(ctx, http.MethodPost, addr, path, call, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	switch {
	case err != nil:
		return err
	case resp.StatusCode == http.StatusConflict:
		return errLeaseLost
	case resp.StatusCode == http.StatusNoContent:
		return errBatchNotFound
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%s%s: %s: %s", addr, path, resp.Status, bytes.TrimSpace(body))
	}
	if out != nil {
		return json.Unmarshal(body, out)
	}
	return nil
}

// advertiseBacklog advertises, every StealInterval until the service
// stops, how many batches a peer could take from this node, rounded down
// to a power of two.
func (o *API) advertiseBacklog() {
	defer o.wg.Done()
	t := time.NewTicker(o.opts.Batch.StealInterval)
	defer t.Stop()
	for {
		o.n.AdvertiseBacklog(coarseBacklog(o.batches.lendable()))
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// coarseBacklog rounds n down to a power of two (0 stays 0).
func coarseBacklog(n int) int {
	if n <= 0 {
		return 0
	}
	return 1 << (bits.Len(uint(n)) - 1)
}

// pickLenders chooses whom a steal asks: of two lenders drawn at random
// (all of them when there are two or fewer), the larger backlog first.
func pickLenders(ls []Lender, r *rand.Rand) []string {
	if len(ls) > 2 {
		i := r.IntN(len(ls))
		j := r.IntN(len(ls) - 1)
		if j >= i {
			j++
		}
		ls = []Lender{ls[i], ls[j]}
	} else {
		ls = slices.Clone(ls)
		r.Shuffle(len(ls), func(i, j int) { ls[i], ls[j] = ls[j], ls[i] })
	}
	slices.SortStableFunc(ls, func(a, b Lender) int { return cmp.Compare(b.Backlog, a.Backlog) })
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Addr
	}
	return out
}

// steal asks, once the engine is idle, at most two of the peers that
// advertise a backlog (pickLenders) for a batch nobody runs, and runs the
// first one lent.
func (o *API) steal() {
	if err := o.engine.WaitIdle(o.ctx); err != nil {
		return
	}
	self := o.n.ID()
	o.stealRand.Lock()
	asked := pickLenders(o.n.Lenders(), o.stealRand.r)
	o.stealRand.Unlock()
	for _, addr := range asked {
		var sb stolenBatch
		ctx, cancel := context.WithTimeout(o.ctx, 30*time.Second)
		err := o.leaseCallTo(ctx, addr, internalQueuePath+"claim", leaseCall{Node: self}, &sb)
		cancel()
		switch {
		case errors.Is(err, errBatchNotFound):
			o.batchMetrics.claims.WithLabelValues("none").Inc()
			continue
		case err != nil:
			o.batchMetrics.claims.WithLabelValues("error").Inc()
			if o.ctx.Err() == nil {
				o.log.Debug("queue: a peer lent no batch", "peer", addr, "err", err)
			}
			continue
		case len(sb.Requests) != sb.N-sb.Done:
			o.batchMetrics.claims.WithLabelValues("error").Inc()
			o.log.Warn("queue: a peer lent a malformed batch", "peer", addr, "id", sb.RequestID)
			continue
		}
		o.batchMetrics.claims.WithLabelValues("lent").Inc()
		if sb.Owner.Tenant != "" {
			who, ok := o.n.Tenant(sb.Owner.Tenant)
			if !ok || who.Tag != sb.Owner.Tag {
				o.log.Warn("queue: a peer lent a batch of a tenant this node does not know; giving it back", "peer", addr, "id", sb.RequestID)
				ctx, cancel := context.WithTimeout(o.ctx, 2*time.Second)
				o.leaseCallTo(ctx, addr, internalQueuePath+sb.RequestID+"/release", leaseCall{Node: self}, nil)
				cancel()
				continue
			}
			sb.Owner.Salt = who.Salt
		}
		o.batchMetrics.steals.WithLabelValues("borrowed").Inc()
		o.log.Info("queue: running a peer's batch", "id", sb.RequestID, "peer", addr, "from", sb.Done, "requests", sb.N)
		o.runStolen(addr, sb)
		return
	}
}

// runStolen runs the batch a peer lent, posting each answer back, and
// renews the lease meanwhile; it gives the batch back if the node stops.
func (o *API) runStolen(addr string, sb stolenBatch) {
	self := o.n.ID()
	base := internalQueuePath + sb.RequestID
	ttl := time.Duration(sb.LeaseMs) * time.Millisecond
	renewCtx, stopRenew := context.WithCancel(o.ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(max(ttl/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-t.C:
				if err := o.leaseCallTo(renewCtx, addr, base+"/renew", leaseCall{Node: self}, nil); errors.Is(err, errLeaseLost) {
					o.log.Warn("queue: lost the lease on a peer's batch", "id", sb.RequestID, "peer", addr)
					return
				}
			}
		}
	}()
	finished := false
	o.runBatch(batchRun{
		meta: batchMeta{ID: sb.RequestID, Owner: sb.Owner, N: sb.N, Done: sb.Done, Runs: sb.Runs},
		request: func(i int) ([]byte, error) {
			return sb.Requests[i-sb.Done], nil
		},
		answer: func(i int, resp []byte, failed bool) (bool, error) {
			var out struct {
				More bool `json:"more"`
			}
			ctx, cancel := context.WithTimeout(o.ctx, 30*time.Second)
			defer cancel()
			err := o.leaseCallTo(ctx, addr, base+"/answer", leaseCall{Node: self, Index: i, Response: resp, Failed: failed}, &out)
			finished = err == nil && !out.More
			return out.More, err
		},
	})
	stopRenew()
	<-renewed
	if !finished && o.ctx.Err() != nil {
		// Stopping: give it back now rather than when the lease lapses.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		o.leaseCallTo(ctx, addr, base+"/release", leaseCall{Node: self}, nil)
		cancel()
	}
}

// askPeers passes a GET or DELETE of /v1/queue/{id} that this node does
// not hold to the peer that does: the one the id names (OwnsBatch), or,
// for an id that names no owner, every peer in turn. It answers with the
// first answer that is not 404 and reports whether it answered: false
// (the caller answers 404) when the id names this node, when every peer
// asked said 404, and when the request came from a peer or a router
// already; a 404 error when the id names no live peer. A named owner that does not answer is a 503: it
// holds the batch and may answer a retry. The caller's bearer token stays
// here: the peers are called with the cluster credential, this node
// vouching for who (VouchHeader), so a peer sees the caller's tenant and
// scopes, and nothing it could use for anything else.
func (o *API) askPeers(w http.ResponseWriter, r *http.Request, who auth.Principal) (bool, error) {
	if r.Header.Get(ForwardedHeader) != "" {
		return false, nil
	}
	id := r.PathValue("id")
	peers := o.n.Peers()
	tag, named := batchTag(id)
	if named {
		if tag == ownerTag(o.n.ID()) {
			return false, nil // this node's, and gone
		}
		var owner []Peer
		for _, p := range peers {
			if ownerTag(p.ID) == tag {
				owner = append(owner, p)
			}
		}
		if peers = owner; len(peers) == 0 {
			return false, newHTTPError(http.StatusNotFound, "request_id", "not_found",
				"no queued batch %q: the node that accepted it is not in the cluster now", id)
		}
	}
	h := http.Header{ForwardedHeader: {"1"}}
	if v := o.n.Vouch(who, r.Method+" "+r.URL.Path); v != "" {
		h.Set(VouchHeader, v)
	}
	failed := false
	for _, p := range peers {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		resp, err := o.peerRequest(ctx, r.Method, p.Addr, r.URL.Path, nil, h)
		if err != nil {
			cancel()
			failed = true
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
		resp.Body.Close()
		cancel()
		if err != nil || resp.StatusCode == http.StatusServiceUnavailable {
			failed = true
			continue
		}
		if resp.StatusCode == http.StatusNotFound {
			continue
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		w.Write(body)
		return true, nil
	}
	if named && failed {
		he := newHTTPError(http.StatusServiceUnavailable, "request_id", "", "the node that holds the batch %q did not answer; retry", id)
		he.retryAfter = 1
		return false, he
	}
	return false, nil
}
