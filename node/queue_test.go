package node

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

func testQueueOptions() queueOptions {
	return queueOptions{capacity: 4, maxBytes: 1 << 20, maxResults: 8, ttl: time.Hour, maxRuns: 3, now: time.Now, log: slog.New(slog.DiscardHandler)}
}

func openTestQueue(t *testing.T, dir string, opts queueOptions) *queue {
	t.Helper()
	q, err := openQueue(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestQueueRecordRoundTrip(t *testing.T) {
	t0 := time.Unix(1700000000, 123456789)
	for _, r := range []*queueRecord{
		{ID: "a", Seq: 1, State: kvmeshv1.PrefillState_PREFILL_STATE_QUEUED, Enqueued: t0, Tokens: []uint32{1, 2, 300000}},
		{ID: "b", Seq: 1 << 40, State: kvmeshv1.PrefillState_PREFILL_STATE_RUNNING, Enqueued: t0, Started: t0.Add(time.Second),
			Runs: 3, Session: "sess", WantLogits: true, Tokens: []uint32{0}},
		{ID: "c", Seq: 7, State: kvmeshv1.PrefillState_PREFILL_STATE_DONE, Enqueued: t0, Started: t0, Finished: t0.Add(time.Minute),
			Runs: 1, WantLogits: true, PromptTokens: 100, CachedTokens: 64, TTFT: 1234 * time.Microsecond,
			TopTokens: []uint32{5, 4, 3, 2, 1}, Logits: []float32{-1.5, 0, 3.25}},
		{ID: "d", Seq: 8, State: kvmeshv1.PrefillState_PREFILL_STATE_FAILED, Enqueued: t0, Finished: t0, Err: "boom"},
	} {
		got, err := decodeQueueRecord(encodeQueueRecord(nil, r))
		if err != nil {
			t.Fatalf("%s: %v", r.ID, err)
		}
		if !recordsEqual(got, r) {
			t.Errorf("%s: round trip gave %+v, want %+v", r.ID, got, r)
		}
	}
	good := encodeQueueRecord(nil, &queueRecord{ID: "x", State: kvmeshv1.PrefillState_PREFILL_STATE_QUEUED, Tokens: []uint32{1, 2, 3}})
	for name, b := range map[string][]byte{
		"empty":       nil,
		"version":     append([]byte{9}, good[1:]...),
		"state":       append([]byte{good[0], 0}, good[2:]...),
		"truncated":   good[:len(good)-1],
		"trailing":    append(append([]byte(nil), good...), 0),
		"huge tokens": append(append([]byte(nil), good[:len(good)-8]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
	} {
		if _, err := decodeQueueRecord(b); !errors.Is(err, errQueueRecord) {
			t.Errorf("%s: %v, want errQueueRecord", name, err)
		}
	}
}

func recordsEqual(a, b *queueRecord) bool {
	ta := []time.Time{a.Enqueued, a.Started, a.Finished}
	tb := []time.Time{b.Enqueued, b.Started, b.Finished}
	for i := range ta {
		if !ta[i].Equal(tb[i]) {
			return false
		}
	}
	a2, b2 := *a, *b
	a2.Enqueued, a2.Started, a2.Finished = time.Time{}, time.Time{}, time.Time{}
	b2.Enqueued, b2.Started, b2.Finished = time.Time{}, time.Time{}, time.Time{}
	return reflect.DeepEqual(a2, b2)
}

// FuzzQueueRecord: the decoder of records read from disk never panics, and
// what it accepts encodes back to a record that decodes the same.
func FuzzQueueRecord(f *testing.F) {
	f.Add(encodeQueueRecord(nil, &queueRecord{ID: "a", State: kvmeshv1.PrefillState_PREFILL_STATE_QUEUED, Tokens: []uint32{1, 2}}))
	f.Add(encodeQueueRecord(nil, &queueRecord{ID: "c", State: kvmeshv1.PrefillState_PREFILL_STATE_DONE, TopTokens: []uint32{1},
		Logits: []float32{1, 2}, Finished: time.Unix(5, 0), Err: "x"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeQueueRecord(b)
		if err != nil {
			return
		}
		enc := encodeQueueRecord(nil, r)
		r2, err := decodeQueueRecord(enc)
		if err != nil || !bytes.Equal(encodeQueueRecord(nil, r2), enc) {
			t.Fatalf("re-encoded record: %v; %+v vs %+v", err, r, r2)
		}
	})
}

// TestQueueReopen: a restart keeps the order, queues the interrupted
// request again ahead of the others, drops a corrupt record, and keeps
// results.
func TestQueueReopen(t *testing.T) {
	dir := t.TempDir()
	q := openTestQueue(t, dir, testQueueOptions())
	var ids []string
	for i := range 4 {
		r, err := q.enqueue([]uint32{uint32(i)}, "s", false, queueOwner{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	if _, err := q.enqueue([]uint32{9}, "", false, queueOwner{}); !errors.Is(err, errQueueFull) {
		t.Fatalf("fifth request into a queue of 4: %v", err)
	}
	ctx := context.Background()
	r0, err := q.take(ctx)
	if err != nil || r0.ID != ids[0] || r0.Runs != 1 || r0.Tokens[0] != 0 {
		t.Fatalf("take: %+v, %v", r0, err)
	}
	q.finish(r0, &queueOutcome{PromptTokens: 1, TopTokens: []uint32{7}}, nil)
	r1, err := q.take(ctx) // interrupted by the "restart" below
	if err != nil || r1.ID != ids[1] {
		t.Fatalf("take: %+v, %v", r1, err)
	}
	if err := q.db.Set(queueKey(ids[2]), []byte("garbage"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := q.close(); err != nil {
		t.Fatal(err)
	}

	q = openTestQueue(t, dir, testQueueOptions())
	defer q.close()
	if pending, kept := q.depth(); pending != 2 || kept != 1 {
		t.Fatalf("reopened: %d pending, %d results; want 2 (one corrupt record dropped) and 1", pending, kept)
	}
	if r, ok, err := q.get(ids[0]); !ok || err != nil || r.State != kvmeshv1.PrefillState_PREFILL_STATE_DONE || r.TopTokens[0] != 7 {
		t.Errorf("finished request after reopen: %+v %v %v", r, ok, err)
	}
	if _, ok, _ := q.get(ids[2]); ok {
		t.Errorf("the corrupt record is still known")
	}
	r, err := q.take(ctx)
	if err != nil || r.ID != ids[1] || r.Runs != 2 || r.Tokens[0] != 1 {
		t.Fatalf("first take after reopen: %+v, %v; want the interrupted request, second run", r, err)
	}
	q.finish(r, nil, errors.New("engine says no"))
	if r, _, _ := q.get(ids[1]); r.State != kvmeshv1.PrefillState_PREFILL_STATE_FAILED || r.Err != "engine says no" || r.Tokens != nil {
		t.Errorf("failed request: %+v", r)
	}
	if r, err := q.take(ctx); err != nil || r.ID != ids[3] {
		t.Fatalf("second take: %+v, %v", r, err)
	}
}

// TestQueueGivesUp: a request interrupted on every run fails after maxRuns.
func TestQueueGivesUp(t *testing.T) {
	dir := t.TempDir()
	opts := testQueueOptions()
	q := openTestQueue(t, dir, opts)
	r, err := q.enqueue([]uint32{1}, "", false, queueOwner{})
	if err != nil {
		t.Fatal(err)
	}
	id := r.ID
	for run := 1; run <= int(opts.maxRuns); run++ {
		if r, err := q.take(context.Background()); err != nil || r.Runs != uint32(run) {
			t.Fatalf("run %d: %+v, %v", run, r, err)
		}
		q.close()
		q = openTestQueue(t, dir, opts)
	}
	defer q.close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.take(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("take: %v, want nothing left to run", err)
	}
	if r, _, _ := q.get(id); r.State != kvmeshv1.PrefillState_PREFILL_STATE_FAILED || !strings.Contains(r.Err, "interrupted 3 times") {
		t.Errorf("after %d interrupted runs: %+v", opts.maxRuns, r)
	}
}

// TestQueueModel runs random operations against the queue and a map-based
// model of it, reopening now and then: states, order and capacity agree.
func TestQueueModel(t *testing.T) {
	dir := t.TempDir()
	opts := testQueueOptions()
	opts.maxRuns = 1000
	q := openTestQueue(t, dir, opts)
	defer func() { q.close() }()
	type modelReq struct {
		state  kvmeshv1.PrefillState
		tokens []uint32
	}
	model := map[string]*modelReq{}
	var order []string // pending ids, oldest first
	r := rand.New(rand.NewPCG(37, 37))
	ctx := context.Background()
	for step := range 300 {
		switch op := r.IntN(10); {
		case op < 4:
			tokens := []uint32{uint32(step), uint32(r.IntN(100))}
			rec, err := q.enqueue(tokens, "", false, queueOwner{})
			if full := len(order) >= opts.capacity; full != errors.Is(err, errQueueFull) {
				t.Fatalf("step %d: enqueue with %d pending: %v", step, len(order), err)
			}
			if err == nil {
				model[rec.ID] = &modelReq{kvmeshv1.PrefillState_PREFILL_STATE_QUEUED, tokens}
				order = append(order, rec.ID)
			}
		case op < 7:
			next := slices.IndexFunc(order, func(id string) bool { return model[id].state == kvmeshv1.PrefillState_PREFILL_STATE_QUEUED })
			if next < 0 {
				break // take would wait
			}
			id := order[next]
			rec, err := q.take(ctx)
			if err != nil || rec.ID != id || !reflect.DeepEqual(rec.Tokens, model[id].tokens) {
				t.Fatalf("step %d: take %+v, %v; want %s", step, rec, err, id)
			}
			if r.IntN(4) == 0 {
				model[id].state = kvmeshv1.PrefillState_PREFILL_STATE_RUNNING // left running: a reopen queues it again
				break
			}
			q.finish(rec, &queueOutcome{PromptTokens: len(rec.Tokens)}, nil)
			model[id].state = kvmeshv1.PrefillState_PREFILL_STATE_DONE
			order = slices.Delete(order, next, next+1)
		case op < 8:
			q.close()
			q = openTestQueue(t, dir, opts)
			for _, m := range model {
				if m.state == kvmeshv1.PrefillState_PREFILL_STATE_RUNNING {
					m.state = kvmeshv1.PrefillState_PREFILL_STATE_QUEUED
				}
			}
		default:
			for id, m := range model {
				rec, ok, err := q.get(id)
				if m.state == kvmeshv1.PrefillState_PREFILL_STATE_DONE && !ok {
					delete(model, id) // past MaxResults
					continue
				}
				if !ok || err != nil || rec.State != m.state {
					t.Fatalf("step %d: get %s: %+v %v %v; model says %s", step, id, rec, ok, err, m.state)
				}
			}
		}
		if pending, _ := q.depth(); pending != len(order) {
			t.Fatalf("step %d: %d pending, model %d", step, pending, len(order))
		}
	}
}
