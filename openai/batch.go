package openai

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// batches is the durable store of the asynchronous API's batches (POST
// /v1/queue), kept in the prefill queue's pebble database under keys of
// their own (the queue reads only its 'r' records):
//
//	"B"+id            the batch's meta (batchMeta, JSON)
//	"Q"+id+"/"+index  request index's body: 'c' (chat) or 't' (completion), then its JSON
//	"P"+id+"/"+index  response index: an OpenAI response, or {"error": {...}}
//	"K"+id            present while the finished batch's callback is not yet delivered
//
// A batch runs its requests in order. A response is written with the meta
// that counts it (Done) in one synced pebble batch, so after a crash a
// request has either its response or none and runs again from its start:
// no request completes twice. A batch found running when the store opens
// stays "running" and is taken first. Metas live in memory too (all of
// them: pending ones are bounded by MaxQueued requests, finished ones by
// maxBatchResults and the TTL); mu guards that index. life guards the
// database's lifetime: every database operation holds it for reading, close
// for writing, so none runs on a closed database.
type batches struct {
	db    *pebble.DB
	opts  BatchOptions
	now   func() time.Time
	log   *slog.Logger
	ready chan struct{} // a token when a batch was submitted
	// cancelled, when set, counts requests cancelled before they started.
	cancelled func(n int)
	// finished, when set, is called (without locks held) with the meta of
	// each batch that finished, once.
	finished func(batchMeta)
	// idSuffix ends the ids of the batches submitted here: "_" and the
	// node's owner tag (ownerTag), so that any node finds the owner.
	idSuffix string

	life struct {
		sync.RWMutex
		closed bool
	}
	mu struct {
		sync.Mutex
		seq      uint64
		pending  []*batchMeta // queued or running, by seq
		finished []*batchMeta // completed or cancelled, in the order they finished
		all      map[string]*batchMeta
		queued   map[string]int // tenant → requests not yet answered
		total    int            // requests not yet answered, all tenants
	}
}

// maxBatchResults bounds the finished batches kept; past it the oldest go
// before their TTL.
const maxBatchResults = 1 << 16

// States of a batch, as GET /v1/queue/{id} says them.
const (
	batchQueued    = "queued"
	batchRunning   = "running"
	batchCompleted = "completed"
	batchCancelled = "cancelled"
)

// batchMeta is a batch's record without its requests and responses.
type batchMeta struct {
	ID       string     `json:"id"`
	Seq      uint64     `json:"seq"`
	Owner    queueOwner `json:"owner"`
	State    string     `json:"state"`
	N        int        `json:"n"`      // requests
	Done     int        `json:"done"`   // responses stored: those of requests 0..Done-1
	Failed   int        `json:"failed"` // of them, error objects
	Enqueued time.Time  `json:"enqueued"`
	Started  time.Time  `json:"started,omitzero"`
	Finished time.Time  `json:"finished,omitzero"`
	Runs     int        `json:"runs"` // times it was taken; more than one after a restart
	// Callback is where the node POSTs the batch's status once it finished
	// (callback.go); empty: nowhere.
	Callback string `json:"callback,omitempty"`

	active bool // taken by a worker (or leased to a peer) since the store opened
	cancel bool // DELETE while it runs: the requests not started are cancelled
	// lease names the peer that claimed the batch (steal.go), "" when a
	// worker of this node runs it; the claim lapses at leaseUntil, and the
	// batch can then be taken again. writing is set while the lessee's
	// answer is being stored, so the lease cannot lapse under it.
	lease      string
	leaseUntil time.Time
	writing    bool
}

// takeable says whether a worker or a peer may take m now: not taken, or
// leased to a peer whose lease lapsed.
func (m *batchMeta) takeable(now time.Time) bool {
	return !m.active || (m.lease != "" && !m.writing && !now.Before(m.leaseUntil))
}

func (m *batchMeta) finishedState() bool {
	return m.State == batchCompleted || m.State == batchCancelled
}

// Errors of the store.
var (
	errBatchTenantFull = errors.New("openai: the tenant's queued requests are at their limit")
	errBatchFull       = errors.New("openai: the node's queued requests are at their limit")
	errBatchClosed     = errors.New("openai: batch store closed")
	errBatchNotFound   = errors.New("openai: no such batch")
	errBatchDone       = errors.New("openai: the batch has finished")
)

const (
	batchMetaPrefix     = 'B'
	batchRequestPrefix  = 'Q'
	batchResponsePrefix = 'P'
	batchCallbackPrefix = 'K'
)

func batchCallbackKey(id string) []byte { return append([]byte{batchCallbackPrefix}, id...) }

func batchMetaKey(id string) []byte { return append([]byte{batchMetaPrefix}, id...) }

func batchItemKey(prefix byte, id string, i int) []byte {
	return fmt.Appendf([]byte{prefix}, "%s/%06d", id, i)
}

// batchItems returns the bounds of id's keys under prefix.
func batchItems(prefix byte, id string) (lo, hi []byte) {
	lo = fmt.Appendf([]byte{prefix}, "%s/", id)
	hi = fmt.Appendf([]byte{prefix}, "%s0", id) // '0' follows '/'
	return lo, hi
}

// openBatches loads the batches stored in db (the prefill queue's).
func openBatches(db *pebble.DB, opts BatchOptions, now func() time.Time, log *slog.Logger) (*batches, error) {
	b := &batches{db: db, opts: opts, now: now, log: log, ready: make(chan struct{}, 1)}
	b.mu.all = make(map[string]*batchMeta)
	b.mu.queued = make(map[string]int)
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{batchMetaPrefix}, UpperBound: []byte{batchMetaPrefix + 1}})
	if err != nil {
		return nil, fmt.Errorf("openai: batches: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		m := new(batchMeta)
		if err := json.Unmarshal(it.Value(), m); err != nil || m.ID != string(it.Key()[1:]) || m.Done > m.N {
			log.Warn("batches: skipping a corrupt batch record", "key", fmt.Sprintf("%q", it.Key()), "err", err)
			continue
		}
		b.mu.all[m.ID] = m
		b.mu.seq = max(b.mu.seq, m.Seq)
		if m.finishedState() {
			b.mu.finished = append(b.mu.finished, m)
		} else {
			b.mu.pending = append(b.mu.pending, m)
			b.mu.queued[m.Owner.Tenant] += m.N - m.Done
			b.mu.total += m.N - m.Done
		}
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("openai: batches: %w", err)
	}
	slices.SortFunc(b.mu.pending, func(x, y *batchMeta) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(b.mu.finished, func(x, y *batchMeta) int { return x.Finished.Compare(y.Finished) })
	if n := len(b.mu.pending); n > 0 {
		log.Info("batches: to run from before the restart", "batches", n, "requests", b.mu.total)
	}
	b.expire()
	return b, nil
}

// submit stores a batch of requests (each a kind byte and its JSON; the
// store keeps its own copy) durably and returns its meta.
// errBatchTenantFull or errBatchFull when it does not fit.
func (b *batches) submit(owner queueOwner, reqs [][]byte, callback string) (batchMeta, error) {
	m := &batchMeta{ID: newID("batch_") + b.idSuffix, Owner: owner, State: batchQueued, N: len(reqs), Enqueued: b.now(), Callback: callback}
	b.life.RLock()
	defer b.life.RUnlock()
	if b.life.closed {
		return batchMeta{}, errBatchClosed
	}
	b.mu.Lock()
	switch {
	case b.mu.queued[owner.Tenant]+len(reqs) > b.opts.TenantQueued:
		n := b.mu.queued[owner.Tenant]
		b.mu.Unlock()
		return batchMeta{}, fmt.Errorf("%w: %d queued, %d more asked, the limit is %d", errBatchTenantFull, n, len(reqs), b.opts.TenantQueued)
	case b.mu.total+len(reqs) > b.opts.MaxQueued:
		n := b.mu.total
		b.mu.Unlock()
		return batchMeta{}, fmt.Errorf("%w: %d queued, %d more asked, the limit is %d", errBatchFull, n, len(reqs), b.opts.MaxQueued)
	}
	b.mu.seq++
	m.Seq = b.mu.seq
	b.mu.queued[owner.Tenant] += len(reqs)
	b.mu.total += len(reqs)
	b.mu.Unlock()

	wb := b.db.NewBatch()
	for i, r := range reqs {
		wb.Set(batchItemKey(batchRequestPrefix, m.ID, i), r, nil)
	}
	wb.Set(batchMetaKey(m.ID), encodeBatchMeta(m), nil)
	err := wb.Commit(pebble.Sync)
	wb.Close()

	b.mu.Lock()
	if err != nil {
		b.mu.queued[owner.Tenant] -= len(reqs)
		b.mu.total -= len(reqs)
	} else {
		b.mu.all[m.ID] = m
		i, _ := slices.BinarySearchFunc(b.mu.pending, m.Seq, func(x *batchMeta, seq uint64) int { return cmp.Compare(x.Seq, seq) })
		b.mu.pending = slices.Insert(b.mu.pending, i, m)
	}
	snap := *m
	b.mu.Unlock()
	if err != nil {
		return batchMeta{}, fmt.Errorf("openai: batches: store a batch: %w", err)
	}
	b.signal()
	return snap, nil
}

func encodeBatchMeta(m *batchMeta) []byte {
	v, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("openai: encoding a batch meta: %v", err)) // plain fields always encode
	}
	return v
}

// take waits up to wait for the oldest batch not taken (one interrupted by
// a restart first, since it is older; or one whose peer's lease lapsed),
// claims it for this node and returns a copy of its meta; it stays queued
// until start. ok is false when none came within wait. It returns ctx's
// error when ctx ends first.
func (b *batches) take(ctx context.Context, wait time.Duration) (_ batchMeta, ok bool, _ error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		m, next := b.claimLocked("", 0)
		if m != nil {
			return *m, true, nil
		}
		var (
			lapse <-chan time.Time
			lt    *time.Timer
		)
		if !next.IsZero() {
			lt = time.NewTimer(max(next.Sub(b.now()), time.Millisecond))
			lapse = lt.C
		}
		var err error
		timeout := false
		select {
		case <-b.ready:
		case <-lapse:
		case <-t.C:
			timeout = true
		case <-ctx.Done():
			err = ctx.Err()
		}
		if lt != nil {
			lt.Stop()
		}
		if timeout || err != nil {
			return batchMeta{}, false, err
		}
	}
}

// claimLocked takes the oldest takeable batch for lessee ("" for this
// node's own worker, else a peer's id, for ttl) and returns a copy of its
// meta, or nil and when the next lease lapses (zero: none).
func (b *batches) claimLocked(lessee string, ttl time.Duration) (_ *batchMeta, next time.Time) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.mu.pending {
		if m.takeable(now) {
			if m.lease != "" {
				b.log.Info("queue: a peer's lease on a batch lapsed; it runs again from its first unanswered request", "id", m.ID, "peer", m.lease)
			}
			m.active, m.lease, m.leaseUntil = true, lessee, time.Time{}
			if lessee != "" {
				m.leaseUntil = now.Add(ttl)
			}
			snap := *m
			return &snap, time.Time{}
		}
		if m.lease != "" && (next.IsZero() || m.leaseUntil.Before(next)) {
			next = m.leaseUntil
		}
	}
	return nil, next
}

// start marks the claimed batch id running, durably, and returns its meta;
// ok is false when it was cancelled meanwhile: the canceller finishes a
// batch that had not started, start one cancelled while it ran (its runner
// stopped or its lease lapsed before it saw the cancel).
func (b *batches) start(id string) (_ batchMeta, ok bool) {
	b.mu.Lock()
	m := b.mu.all[id]
	if m.cancel {
		running := m.State == batchRunning
		b.mu.Unlock()
		if running {
			if err := b.cancelRest(id); err != nil {
				b.log.Error("batches: cannot cancel a batch", "id", id, "err", err)
			}
		}
		return batchMeta{}, false
	}
	m.State, m.Runs, m.Started = batchRunning, m.Runs+1, b.now()
	snap := *m
	b.mu.Unlock()
	// Synced: a client told "running" is told so after a crash too.
	if err := b.write(func(wb *pebble.Batch) { wb.Set(batchMetaKey(id), encodeBatchMeta(&snap), nil) }); err != nil {
		b.log.Error("batches: cannot record a batch as running", "id", id, "err", err)
	}
	return snap, true
}

// write commits what fill puts in a pebble batch, synced.
func (b *batches) write(fill func(*pebble.Batch)) error {
	b.life.RLock()
	defer b.life.RUnlock()
	if b.life.closed {
		return errBatchClosed
	}
	wb := b.db.NewBatch()
	defer wb.Close()
	fill(wb)
	return wb.Commit(pebble.Sync)
}

// request returns request i of batch id: its kind byte and JSON.
func (b *batches) request(id string, i int) ([]byte, error) {
	b.life.RLock()
	defer b.life.RUnlock()
	if b.life.closed {
		return nil, errBatchClosed
	}
	v, closer, err := b.db.Get(batchItemKey(batchRequestPrefix, id, i))
	if err != nil {
		return nil, fmt.Errorf("openai: batches: read request %d of %s: %w", i, id, err)
	}
	defer closer.Close()
	return slices.Clone(v), nil
}

// answer stores the response of request i of batch id (the next one) and
// returns whether the batch goes on: false once it finished, or when it
// was cancelled meanwhile (then the rest are answered as cancelled).
func (b *batches) answer(id string, i int, resp []byte, failed bool) (more bool, err error) {
	b.mu.Lock()
	m := b.mu.all[id]
	if m == nil || m.Done != i {
		b.mu.Unlock()
		panic(fmt.Sprintf("openai: batches: answer %d of %s out of order", i, id)) // one worker answers in order
	}
	next := *m
	next.Done++
	if failed {
		next.Failed++
	}
	cancel := m.cancel && next.Done < next.N
	if next.Done == next.N {
		next.State, next.Finished = batchCompleted, b.now()
	}
	b.mu.Unlock()
	err = b.write(func(wb *pebble.Batch) {
		wb.Set(batchItemKey(batchResponsePrefix, id, i), resp, nil)
		wb.Delete(batchItemKey(batchRequestPrefix, id, i), nil)
		wb.Set(batchMetaKey(id), encodeBatchMeta(&next), nil)
		if next.finishedState() && next.Callback != "" {
			wb.Set(batchCallbackKey(id), nil, nil) // delivered even after a crash
		}
	})
	if err != nil {
		// Not recorded: it runs again after a restart, as if interrupted.
		return false, fmt.Errorf("openai: batches: store response %d of %s: %w", i, id, err)
	}
	b.mu.Lock()
	m.Done, m.Failed, m.State, m.Finished = next.Done, next.Failed, next.State, next.Finished
	b.mu.queued[m.Owner.Tenant]--
	b.mu.total--
	done := m.finishedState()
	if done {
		b.finishLocked(m)
	}
	snap := *m
	b.mu.Unlock()
	if done && b.finished != nil {
		b.finished(snap)
	}
	if cancel {
		return false, b.cancelRest(id)
	}
	return !next.finishedState(), nil
}

// Errors of a peer's lease (steal.go).
var errLeaseLost = errors.New("openai: the batch is not leased to this peer (its lease lapsed, it finished, or the index is not the next)")

// answerLeased stores the answer of request i of batch id from lessee, the
// peer that holds its lease, and renews the lease for ttl. errLeaseLost
// when lessee does not hold it or i is not the next request: the answer is
// dropped, and the batch's current runner answers it.
func (b *batches) answerLeased(id, lessee string, i int, resp []byte, failed bool, ttl time.Duration) (more bool, err error) {
	b.mu.Lock()
	m := b.mu.all[id]
	if m == nil || !m.active || m.lease != lessee || lessee == "" || m.writing || m.Done != i || m.finishedState() || i >= m.N {
		b.mu.Unlock()
		return false, errLeaseLost
	}
	m.writing, m.leaseUntil = true, b.now().Add(ttl)
	b.mu.Unlock()
	more, err = b.answer(id, i, resp, failed)
	b.mu.Lock()
	m.writing = false
	b.mu.Unlock()
	return more, err
}

// renewLease extends lessee's lease on batch id for ttl; errLeaseLost when
// it does not hold it.
func (b *batches) renewLease(id, lessee string, ttl time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.mu.all[id]
	if m == nil || !m.active || m.lease != lessee || lessee == "" || m.finishedState() {
		return errLeaseLost
	}
	m.leaseUntil = b.now().Add(ttl)
	return nil
}

// releaseLease gives batch id back from lessee: it can be taken at once.
func (b *batches) releaseLease(id, lessee string) error {
	b.mu.Lock()
	m := b.mu.all[id]
	if m == nil || !m.active || m.lease != lessee || lessee == "" || m.writing || m.finishedState() {
		b.mu.Unlock()
		return errLeaseLost
	}
	m.active, m.lease, m.leaseUntil = false, "", time.Time{}
	b.mu.Unlock()
	b.signal()
	return nil
}

func (b *batches) signal() {
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

func (b *batches) finishLocked(m *batchMeta) {
	if n := b.mu.queued[m.Owner.Tenant]; n <= 0 {
		delete(b.mu.queued, m.Owner.Tenant)
	}
	b.mu.pending = slices.DeleteFunc(b.mu.pending, func(p *batchMeta) bool { return p == m })
	b.mu.finished = append(b.mu.finished, m)
}

// cancelledResponse is what a request cancelled before it started gets.
var cancelledResponse = mustJSON(struct {
	Error apiError `json:"error"`
}{apiError{Message: "the batch was cancelled before this request started", Type: "invalid_request_error", Code: nullable("cancelled")}})

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// cancel cancels batch id for owner: a queued batch at once (it keeps no
// responses), a running one once its current request is answered. It
// returns the batch's state after it. errBatchNotFound for an unknown id or
// another owner's; errBatchDone for a finished batch.
func (b *batches) cancel(id string, owner queueOwner) (string, error) {
	b.mu.Lock()
	m := b.mu.all[id]
	switch {
	case m == nil || m.Owner.Tenant != owner.Tenant:
		b.mu.Unlock()
		return "", errBatchNotFound
	case m.finishedState():
		s := m.State
		b.mu.Unlock()
		return s, errBatchDone
	case m.active && m.State == batchRunning:
		m.cancel = true // the worker cancels the rest after its current request
		b.mu.Unlock()
		return batchRunning, nil
	}
	// Not started: claim it from the worker (start sees cancel), then
	// cancel every request.
	m.active, m.cancel = true, true
	b.mu.Unlock()
	return batchCancelled, b.cancelRest(id)
}

// cancelRest answers the requests of batch id not yet answered as
// cancelled and finishes it as cancelled. The caller has claimed it.
func (b *batches) cancelRest(id string) error {
	b.mu.Lock()
	m := b.mu.all[id]
	next := *m
	from := m.Done
	next.Done, next.Failed = m.N, m.Failed+m.N-m.Done
	next.State, next.Finished = batchCancelled, b.now()
	b.mu.Unlock()
	err := b.write(func(wb *pebble.Batch) {
		for i := from; i < next.N; i++ {
			wb.Set(batchItemKey(batchResponsePrefix, id, i), cancelledResponse, nil)
		}
		lo, hi := batchItems(batchRequestPrefix, id)
		wb.DeleteRange(lo, hi, nil)
		wb.Set(batchMetaKey(id), encodeBatchMeta(&next), nil)
		if next.Callback != "" {
			wb.Set(batchCallbackKey(id), nil, nil)
		}
	})
	b.mu.Lock()
	if err != nil {
		m.active, m.cancel = false, false // still queued on disk: runs (or is cancelled) later
		b.mu.Unlock()
		return fmt.Errorf("openai: batches: cancel %s: %w", id, err)
	}
	b.mu.queued[m.Owner.Tenant] -= next.N - from
	b.mu.total -= next.N - from
	if b.cancelled != nil {
		b.cancelled(next.N - from)
	}
	m.Done, m.Failed, m.State, m.Finished = next.Done, next.Failed, next.State, next.Finished
	b.finishLocked(m)
	snap := *m
	b.mu.Unlock()
	if b.finished != nil {
		b.finished(snap)
	}
	return nil
}

// get returns a copy of batch id's meta and, once it finished, its
// responses in order. errBatchNotFound for an unknown, expired or another
// owner's id.
func (b *batches) get(id string, owner queueOwner) (batchMeta, []json.RawMessage, error) {
	b.mu.Lock()
	m := b.mu.all[id]
	var snap batchMeta
	if m != nil {
		snap = *m
	}
	b.mu.Unlock()
	if m == nil || snap.Owner.Tenant != owner.Tenant || b.expired(&snap, b.now()) {
		return batchMeta{}, nil, errBatchNotFound
	}
	if !snap.finishedState() {
		return snap, nil, nil
	}
	b.life.RLock()
	defer b.life.RUnlock()
	if b.life.closed {
		return batchMeta{}, nil, errBatchClosed
	}
	lo, hi := batchItems(batchResponsePrefix, id)
	it, err := b.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return batchMeta{}, nil, fmt.Errorf("openai: batches: read %s: %w", id, err)
	}
	resps := make([]json.RawMessage, 0, snap.N)
	for it.First(); it.Valid(); it.Next() {
		resps = append(resps, slices.Clone(it.Value()))
	}
	if err := it.Close(); err != nil {
		return batchMeta{}, nil, fmt.Errorf("openai: batches: read %s: %w", id, err)
	}
	if len(resps) != snap.N {
		return batchMeta{}, nil, errBatchNotFound // expired and deleted meanwhile
	}
	return snap, resps, nil
}

func (b *batches) expired(m *batchMeta, now time.Time) bool {
	return m.finishedState() && !now.Before(m.Finished.Add(b.opts.ResultTTL))
}

// expire deletes the batches finished more than ResultTTL ago, and the
// oldest beyond maxBatchResults.
func (b *batches) expire() {
	now := b.now()
	var gone []string
	b.mu.Lock()
	n := 0
	for n < len(b.mu.finished) && (len(b.mu.finished)-n > maxBatchResults || b.expired(b.mu.finished[n], now)) {
		gone = append(gone, b.mu.finished[n].ID)
		delete(b.mu.all, b.mu.finished[n].ID)
		n++
	}
	b.mu.finished = slices.Delete(b.mu.finished, 0, n)
	b.mu.Unlock()
	for _, id := range gone {
		err := b.write(func(wb *pebble.Batch) {
			lo, hi := batchItems(batchResponsePrefix, id)
			wb.DeleteRange(lo, hi, nil)
			lo, hi = batchItems(batchRequestPrefix, id)
			wb.DeleteRange(lo, hi, nil)
			wb.Delete(batchMetaKey(id), nil)
			wb.Delete(batchCallbackKey(id), nil)
		})
		if err != nil {
			b.log.Warn("batches: cannot delete an expired batch", "id", id, "err", err)
			return
		}
	}
}

// pendingCallbacks returns copies of the metas of the finished batches
// whose callback is not yet delivered (or given up on), oldest first.
func (b *batches) pendingCallbacks() []batchMeta {
	b.life.RLock()
	defer b.life.RUnlock()
	if b.life.closed {
		return nil
	}
	it, err := b.db.NewIter(&pebble.IterOptions{LowerBound: []byte{batchCallbackPrefix}, UpperBound: []byte{batchCallbackPrefix + 1}})
	if err != nil {
		b.log.Warn("batches: cannot read the pending callbacks", "err", err)
		return nil
	}
	var ids []string
	for it.First(); it.Valid(); it.Next() {
		ids = append(ids, string(it.Key()[1:]))
	}
	if err := it.Close(); err != nil {
		b.log.Warn("batches: cannot read the pending callbacks", "err", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []batchMeta
	for _, id := range ids {
		if m := b.mu.all[id]; m != nil && m.finishedState() && m.Callback != "" {
			out = append(out, *m)
		}
	}
	slices.SortFunc(out, func(x, y batchMeta) int { return x.Finished.Compare(y.Finished) })
	return out
}

// callbackDone forgets batch id's pending callback: delivered or given up.
func (b *batches) callbackDone(id string) {
	if err := b.write(func(wb *pebble.Batch) { wb.Delete(batchCallbackKey(id), nil) }); err != nil && !errors.Is(err, errBatchClosed) {
		b.log.Warn("batches: cannot record a callback as delivered; it is sent again after a restart", "id", id, "err", err)
	}
}

// list returns copies of owner's batches: pending ones in order, then the
// most recent finished ones, at most limit in all.
func (b *batches) list(owner queueOwner, limit int) []batchMeta {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []batchMeta
	for _, m := range b.mu.pending {
		if len(out) < limit && m.Owner.Tenant == owner.Tenant {
			out = append(out, *m)
		}
	}
	for i := len(b.mu.finished) - 1; i >= 0 && len(out) < limit; i-- {
		if m := b.mu.finished[i]; m.Owner.Tenant == owner.Tenant {
			out = append(out, *m)
		}
	}
	return out
}

// counts returns the requests not yet answered of batches queued and of
// batches running.
func (b *batches) counts() (queued, running int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.mu.pending {
		if m.State == batchRunning {
			running += m.N - m.Done
		} else {
			queued += m.N - m.Done
		}
	}
	return queued, running
}

// lendable returns how many batches a peer could claim now: not started,
// or leased to a peer whose lease lapsed.
func (b *batches) lendable() int {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, m := range b.mu.pending {
		if m.takeable(now) {
			n++
		}
	}
	return n
}

// close makes every later operation fail with errBatchClosed; the database
// is the queue's, which closes it.
func (b *batches) close() {
	b.life.Lock()
	b.life.closed = true
	b.life.Unlock()
}
