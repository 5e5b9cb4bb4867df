package node

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/kvmesh/kvmesh/internal/privatefs"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// queue is the persistent queue of prefill requests: a pebble database (in
// DataDir/prefill-queue) of one record per request, keyed by its id, and an
// in-memory index of their states. Records are written with Sync when a
// client was told something it may rely on (enqueued, finished), so a
// request the client saw queued survives a crash; a request found running
// when the queue opens was interrupted and is queued again, ahead of later
// ones. Finished records lose their prompt and are deleted ResultTTL after
// they finished, or earlier when more than MaxResults are kept.
//
// Fairness: the queue is one FIFO per owner (a tenant, or "" for
// node-wide callers), served round-robin: take runs the oldest request of
// the owner after the one it served last, so a tenant with one request
// waits behind at most one request of each other owner, not behind every
// request another tenant queued. What is pending is bounded in requests
// (capacity) and in bytes (maxBytes: the prompts' 4 bytes a token and the
// session ids), and one tenant holds at most half of either, so one tenant
// cannot fill the queue for the others.
//
// Only the index is guarded by mu; reads and writes of records happen
// outside it. One worker takes requests (take) and finishes them (finish).
type queue struct {
	db    *pebble.DB
	opts  queueOptions
	ready chan struct{} // a token when a request was enqueued

	mu struct {
		sync.Mutex
		seq      uint64
		reserved int                    // enqueues between their check and their write
		pending  []*queueEntry          // queued or running, by seq
		finished []*queueEntry          // done or failed, in the order they finished
		entries  map[string]*queueEntry // every record, by id
		owners   map[string]*queueUse   // what each owner has pending (reserved included)
		total    queueUse               // what all have pending (reserved included)
		last     string                 // the owner take served last
		closed   bool
	}
}

// queueUse is what pending requests hold: their count and bytes.
type queueUse struct {
	requests int
	bytes    int64
}

type queueOptions struct {
	capacity   int   // most pending requests
	maxBytes   int64 // most bytes of pending requests (queueBytes)
	maxResults int
	ttl        time.Duration
	maxRuns    uint32 // starts after which an interrupted request fails
	now        func() time.Time
	log        *slog.Logger
}

// queueEntry is what the index keeps of a record (no prompt, no outcome).
type queueEntry struct {
	id                          string
	seq                         uint64
	state                       kvmeshv1.PrefillState
	enqueued, started, finished time.Time
	session                     string
	tenant                      string // the owner's tenant (queueOwner)
	bytes                       int64  // what it holds of maxBytes while pending
}

// queueBytes is what a pending request holds of the queue's byte bound.
func queueBytes(tokens int, session string) int64 { return 4*int64(tokens) + int64(len(session)) }

// Errors of the queue.
var (
	errQueueFull   = errors.New("node: prefill queue full")
	errQueueClosed = errors.New("node: prefill queue closed")
)

// Keys: the format marker, and one record per request.
var queueFormatKey = []byte("format")

const (
	queueFormatV1     = "kvmesh-prefill-queue-v1"
	queueRecordPrefix = 'r'
)

func queueKey(id string) []byte { return append([]byte{queueRecordPrefix}, id...) }

// openQueue opens (or creates) the queue in dir and rebuilds its index.
func openQueue(dir string, opts queueOptions) (*queue, error) {
	// The node's user's alone: 0700, and pebble's files 0600 (privatefs).
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("node: prefill queue: %w", err)
	}
	db, err := pebble.Open(dir, &pebble.Options{Logger: queuePebbleLogger{opts.log}, FS: privatefs.New(nil)})
	if err != nil {
		return nil, fmt.Errorf("node: open prefill queue in %s: %w", dir, err)
	}
	q := &queue{db: db, opts: opts, ready: make(chan struct{}, 1)}
	q.mu.entries = make(map[string]*queueEntry)
	q.mu.owners = make(map[string]*queueUse)
	if err := q.load(); err != nil {
		db.Close()
		return nil, err
	}
	return q, nil
}

func (q *queue) load() error {
	v, closer, err := q.db.Get(queueFormatKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		if err := q.db.Set(queueFormatKey, []byte(queueFormatV1), pebble.Sync); err != nil {
			return fmt.Errorf("node: prefill queue: write format: %w", err)
		}
	case err != nil:
		return fmt.Errorf("node: prefill queue: read format: %w", err)
	default:
		format := string(v)
		closer.Close()
		if format != queueFormatV1 {
			return fmt.Errorf("node: prefill queue: format %q, want %q", format, queueFormatV1)
		}
	}
	it, err := q.db.NewIter(&pebble.IterOptions{LowerBound: []byte{queueRecordPrefix}, UpperBound: []byte{queueRecordPrefix + 1}})
	if err != nil {
		return fmt.Errorf("node: prefill queue: %w", err)
	}
	var corrupt [][]byte
	interrupted := 0
	for it.First(); it.Valid(); it.Next() {
		r, err := decodeQueueRecord(it.Value())
		if err == nil && string(it.Key()[1:]) != r.ID {
			err = fmt.Errorf("%w: id %q under key %q", errQueueRecord, r.ID, it.Key())
		}
		if err != nil {
			q.opts.log.Warn("prefill queue: dropping a corrupt record", "key", fmt.Sprintf("%q", it.Key()), "err", err)
			corrupt = append(corrupt, slices.Clone(it.Key()))
			continue
		}
		e := r.entry()
		if e.state == kvmeshv1.PrefillState_PREFILL_STATE_RUNNING {
			e.state = kvmeshv1.PrefillState_PREFILL_STATE_QUEUED // interrupted: run it again
			interrupted++
		}
		q.mu.entries[e.id] = e
		q.mu.seq = max(q.mu.seq, e.seq)
		if e.done() {
			q.mu.finished = append(q.mu.finished, e)
		} else {
			e.bytes = queueBytes(len(r.Tokens), r.Session)
			q.mu.pending = append(q.mu.pending, e)
			q.useLocked(e.tenant, e.bytes, 1)
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("node: prefill queue: %w", err)
	}
	for _, k := range corrupt {
		if err := q.db.Delete(k, pebble.NoSync); err != nil {
			return fmt.Errorf("node: prefill queue: %w", err)
		}
	}
	slices.SortFunc(q.mu.pending, func(a, b *queueEntry) int { return cmp.Compare(a.seq, b.seq) })
	slices.SortFunc(q.mu.finished, func(a, b *queueEntry) int { return a.finished.Compare(b.finished) })
	if n := len(q.mu.pending); n > 0 {
		q.opts.log.Info("prefill queue: requests to run from before the restart", "pending", n, "interrupted", interrupted)
	}
	q.expire()
	return nil
}

func (r *queueRecord) entry() *queueEntry {
	return &queueEntry{id: r.ID, seq: r.Seq, state: r.State, enqueued: r.Enqueued, started: r.Started, finished: r.Finished, session: r.Session, tenant: r.Owner.Tenant}
}

func (e *queueEntry) done() bool {
	return e.state == kvmeshv1.PrefillState_PREFILL_STATE_DONE || e.state == kvmeshv1.PrefillState_PREFILL_STATE_FAILED
}

// enqueue stores a request durably and returns its record (without the
// prompt's ownership: tokens are copied). errQueueFull when capacity
// requests are pending.
func (q *queue) enqueue(tokens []uint32, session string, wantLogits bool, owner queueOwner) (*queueRecord, error) {
	var raw [12]byte
	rand.Read(raw[:])
	r := &queueRecord{ID: hex.EncodeToString(raw[:]), State: kvmeshv1.PrefillState_PREFILL_STATE_QUEUED,
		Enqueued: q.opts.now(), Session: session, WantLogits: wantLogits, Tokens: slices.Clone(tokens), Owner: owner}
	size := queueBytes(len(tokens), session)
	q.mu.Lock()
	if q.mu.closed {
		q.mu.Unlock()
		return nil, errQueueClosed
	}
	if err := q.fitsLocked(owner.Tenant, size); err != nil {
		q.mu.Unlock()
		return nil, err
	}
	q.mu.seq++
	r.Seq = q.mu.seq
	q.mu.reserved++
	q.useLocked(owner.Tenant, size, 1)
	q.mu.Unlock()

	err := q.db.Set(queueKey(r.ID), encodeQueueRecord(nil, r), pebble.Sync)

	q.mu.Lock()
	q.mu.reserved--
	if err != nil {
		q.useLocked(owner.Tenant, -size, -1)
	} else {
		e := r.entry()
		e.bytes = size
		q.mu.entries[e.id] = e
		i, _ := slices.BinarySearchFunc(q.mu.pending, e.seq, func(x *queueEntry, seq uint64) int { return cmp.Compare(x.seq, seq) })
		q.mu.pending = slices.Insert(q.mu.pending, i, e)
	}
	q.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("node: prefill queue: store request: %w", err)
	}
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return r, nil
}

// fitsLocked returns an errQueueFull error when a request of size bytes
// from tenant ("" for node-wide callers) would take the queue past its
// bounds, or a tenant past half of them.
func (q *queue) fitsLocked(tenant string, size int64) error {
	t := &q.mu.total
	if t.requests >= q.opts.capacity || t.bytes+size > q.opts.maxBytes {
		return fmt.Errorf("%w: %d requests of %d bytes are waiting, the limit is %d requests and %d bytes",
			errQueueFull, t.requests, t.bytes, q.opts.capacity, q.opts.maxBytes)
	}
	if u := q.mu.owners[tenant]; tenant != "" && u != nil && (u.requests >= max(1, q.opts.capacity/2) || u.bytes+size > q.opts.maxBytes/2) {
		return fmt.Errorf("%w: tenant %s has %d requests of %d bytes waiting, its share is half the queue (%d requests, %d bytes)",
			errQueueFull, tenant, u.requests, u.bytes, max(1, q.opts.capacity/2), q.opts.maxBytes/2)
	}
	return nil
}

// useLocked adds n requests of size bytes to tenant's pending use.
func (q *queue) useLocked(tenant string, size int64, n int) {
	u := q.mu.owners[tenant]
	if u == nil {
		u = new(queueUse)
		q.mu.owners[tenant] = u
	}
	u.requests += n
	u.bytes += size
	q.mu.total.requests += n
	q.mu.total.bytes += size
	if u.requests == 0 {
		delete(q.mu.owners, tenant)
	}
}

// nextLocked returns the request take runs next: the oldest queued one of
// the first owner, in name order, after the one served last (wrapping
// around), so owners take turns; nil when none is queued.
func (q *queue) nextLocked() *queueEntry {
	var first, after *queueEntry // oldest of the least owner; of the least owner past last
	for _, p := range q.mu.pending {
		if p.state != kvmeshv1.PrefillState_PREFILL_STATE_QUEUED {
			continue
		}
		if first == nil || p.tenant < first.tenant {
			first = p
		}
		if p.tenant > q.mu.last && (after == nil || p.tenant < after.tenant) {
			after = p
		}
	}
	if after != nil {
		return after
	}
	return first
}

// take waits for the next queued request (nextLocked), marks it running
// and returns its record, prompt included. It returns ctx's error when ctx
// ends first.
func (q *queue) take(ctx context.Context) (*queueRecord, error) {
	for {
		q.mu.Lock()
		e := q.nextLocked()
		if e != nil {
			e.state = kvmeshv1.PrefillState_PREFILL_STATE_RUNNING
			e.started = q.opts.now()
			q.mu.last = e.tenant
		}
		q.mu.Unlock()
		if e == nil {
			select {
			case <-q.ready:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		r, err := q.read(e.id)
		if err == nil {
			r.State, r.Started = kvmeshv1.PrefillState_PREFILL_STATE_RUNNING, e.started
			r.Runs++
			// No sync: a crash before the next write leaves it queued or
			// running on disk, and both run again.
			err = q.db.Set(queueKey(r.ID), encodeQueueRecord(nil, r), pebble.NoSync)
		}
		if err != nil {
			// An unreadable record cannot run: fail it.
			q.opts.log.Error("prefill queue: cannot read a queued request", "id", e.id, "err", err)
			q.finish(&queueRecord{ID: e.id, Seq: e.seq, Enqueued: e.enqueued, Started: e.started, Session: e.session},
				nil, fmt.Errorf("the queued request could not be read back: %w", err))
			continue
		}
		if r.Runs > q.opts.maxRuns {
			// Started that often, it was interrupted every time (or it
			// brings the node down): stop trying.
			q.finish(r, nil, fmt.Errorf("interrupted %d times by restarts; giving up", r.Runs-1))
			continue
		}
		return r, nil
	}
}

// read returns the stored record of id.
func (q *queue) read(id string) (*queueRecord, error) {
	v, closer, err := q.db.Get(queueKey(id))
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return decodeQueueRecord(v)
}

// queueOutcome is what a finished request produced.
type queueOutcome struct {
	PromptTokens, CachedTokens int
	TTFT                       time.Duration
	TopTokens                  []uint32
	Logits                     []float32
}

// finish records r's outcome durably (out, or failure when failure is not
// nil), drops its prompt, and moves it to the finished requests.
func (q *queue) finish(r *queueRecord, out *queueOutcome, failure error) {
	r.Finished = q.opts.now()
	r.Tokens = nil
	if failure != nil {
		r.State, r.Err = kvmeshv1.PrefillState_PREFILL_STATE_FAILED, failure.Error()
	} else {
		r.State = kvmeshv1.PrefillState_PREFILL_STATE_DONE
		r.PromptTokens, r.CachedTokens = uint32(out.PromptTokens), uint32(out.CachedTokens)
		r.TTFT, r.TopTokens = out.TTFT, out.TopTokens
		if r.WantLogits {
			r.Logits = out.Logits
		}
	}
	if err := q.db.Set(queueKey(r.ID), encodeQueueRecord(nil, r), pebble.Sync); err != nil {
		// The index still says running; the request runs again after a
		// restart. Nothing better can be done without the disk.
		q.opts.log.Error("prefill queue: cannot store a result", "id", r.ID, "err", err)
	}
	q.mu.Lock()
	if e := q.mu.entries[r.ID]; e != nil && !e.done() {
		e.state, e.finished = r.State, r.Finished
		q.mu.pending = slices.DeleteFunc(q.mu.pending, func(p *queueEntry) bool { return p == e })
		q.mu.finished = append(q.mu.finished, e)
		q.useLocked(e.tenant, -e.bytes, -1)
	}
	q.mu.Unlock()
	q.expire()
}

// get returns the record of id: from the index while it is pending (no
// prompt), from the database once it finished. ok is false for an unknown
// or expired id.
func (q *queue) get(id string) (*queueRecord, bool, error) {
	q.mu.Lock()
	e := q.mu.entries[id]
	var snap queueEntry
	if e != nil {
		snap = *e
	}
	q.mu.Unlock()
	switch {
	case e == nil:
		return nil, false, nil
	case !snap.done():
		return &queueRecord{ID: snap.id, Seq: snap.seq, State: snap.state, Enqueued: snap.enqueued,
			Started: snap.started, Session: snap.session, Owner: queueOwner{Tenant: snap.tenant}}, true, nil
	case q.expired(&snap, q.opts.now()):
		return nil, false, nil
	}
	r, err := q.read(id)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil // expired and deleted meanwhile
	}
	if err != nil {
		return nil, false, fmt.Errorf("node: prefill queue: read result: %w", err)
	}
	return r, true, nil
}

func (q *queue) expired(e *queueEntry, now time.Time) bool {
	return e.done() && !now.Before(e.finished.Add(q.opts.ttl))
}

// expire deletes the results older than the TTL and those beyond
// MaxResults, oldest first.
func (q *queue) expire() {
	now := q.opts.now()
	var gone []string
	q.mu.Lock()
	n := 0
	for n < len(q.mu.finished) && (len(q.mu.finished)-n > q.opts.maxResults || q.expired(q.mu.finished[n], now)) {
		gone = append(gone, q.mu.finished[n].id)
		delete(q.mu.entries, q.mu.finished[n].id)
		n++
	}
	q.mu.finished = slices.Delete(q.mu.finished, 0, n)
	q.mu.Unlock()
	for _, id := range gone {
		if err := q.db.Delete(queueKey(id), pebble.NoSync); err != nil {
			q.opts.log.Warn("prefill queue: cannot delete an expired result", "id", id, "err", err)
			return
		}
	}
}

// depth returns the number of pending requests and of kept results.
func (q *queue) depth() (pending, results int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.mu.pending), len(q.mu.finished)
}

// close closes the database. The worker must have stopped.
func (q *queue) close() error {
	q.mu.Lock()
	q.mu.closed = true
	q.mu.Unlock()
	if err := q.db.Close(); err != nil {
		return fmt.Errorf("node: close prefill queue: %w", err)
	}
	return nil
}

// queuePebbleLogger sends pebble's messages to slog; pebble's Fatalf must
// not return, so it panics after logging.
type queuePebbleLogger struct{ log *slog.Logger }

func (l queuePebbleLogger) Infof(format string, args ...any) {
	l.log.Debug("prefill queue: pebble: " + fmt.Sprintf(format, args...))
}

func (l queuePebbleLogger) Errorf(format string, args ...any) {
	l.log.Error("prefill queue: pebble: " + fmt.Sprintf(format, args...))
}

func (l queuePebbleLogger) Fatalf(format string, args ...any) {
	msg := "prefill queue: pebble: " + fmt.Sprintf(format, args...)
	l.log.Error(msg)
	panic(msg)
}
