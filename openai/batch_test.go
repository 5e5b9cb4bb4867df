package openai

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// TestBatchesResume: a batch interrupted after its first answer reopens
// running with that answer kept; only the rest run, and its answers come
// back in order. A cancel while it runs answers the rest as cancelled.
func TestBatchesResume(t *testing.T) {
	dir := t.TempDir()
	open := func() (*pebble.DB, *batches) {
		db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := openBatches(db, BatchOptions{MaxRequests: 8, MaxBodyBytes: 1 << 20, TenantQueued: 8, MaxQueued: 16, ResultTTL: time.Hour}, time.Now, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return db, b
	}
	ctx := context.Background()
	owner := queueOwner{Tenant: "acme"}
	db, b := open()
	m, err := b.submit(owner, [][]byte{[]byte("t{}"), []byte("t{}"), []byte("t{}")}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.take(ctx, time.Minute); err != nil || !ok {
		t.Fatal(err)
	}
	if _, ok := b.start(m.ID); !ok {
		t.Fatal("start refused")
	}
	if more, err := b.answer(m.ID, 0, []byte(`{"n":0}`), false); !more || err != nil {
		t.Fatalf("answer 0: %v %v", more, err)
	}
	b.close()
	db.Close() // as a crash after the synced answer

	db, b = open()
	defer db.Close()
	if got, _, err := b.get(m.ID, owner); err != nil || got.State != batchRunning || got.Done != 1 {
		t.Fatalf("after reopening: %+v %v; want running with 1 answer", got, err)
	}
	if _, _, err := b.get(m.ID, queueOwner{Tenant: "beta"}); err != errBatchNotFound {
		t.Errorf("another tenant gets %v, want errBatchNotFound", err)
	}
	again, _, err := b.take(ctx, time.Minute)
	if err != nil || again.ID != m.ID || again.Done != 1 {
		t.Fatalf("take after reopening: %+v %v; want %s from request 1", again, err, m.ID)
	}
	if s, _ := b.start(m.ID); s.Runs != 2 {
		t.Errorf("runs %d, want 2", s.Runs)
	}
	if _, err := b.request(m.ID, 0); err == nil {
		t.Error("the answered request's body is still stored")
	}
	b.answer(m.ID, 1, []byte(`{"n":1}`), false)
	if more, err := b.answer(m.ID, 2, []byte(`{"n":2}`), true); more || err != nil {
		t.Fatalf("last answer: %v %v", more, err)
	}
	got, resps, err := b.get(m.ID, owner)
	if err != nil || got.State != batchCompleted || got.Failed != 1 || len(resps) != 3 || string(resps[0]) != `{"n":0}` || string(resps[2]) != `{"n":2}` {
		t.Fatalf("completed: %+v %q %v", got, resps, err)
	}

	// Cancel while running: the current answer is kept, the rest cancelled.
	m2, _ := b.submit(owner, [][]byte{[]byte("t{}"), []byte("t{}"), []byte("t{}")}, "")
	b.take(ctx, time.Minute)
	b.start(m2.ID)
	if s, err := b.cancel(m2.ID, owner); s != batchRunning || err != nil {
		t.Fatalf("cancel a running batch: %s %v", s, err)
	}
	if more, err := b.answer(m2.ID, 0, []byte(`{"n":0}`), false); more || err != nil {
		t.Fatalf("answer after cancel: %v %v", more, err)
	}
	got, resps, err = b.get(m2.ID, owner)
	if err != nil || got.State != batchCancelled || len(resps) != 3 || string(resps[0]) != `{"n":0}` || !strings.Contains(string(resps[1]), "cancelled") {
		t.Fatalf("cancelled: %+v %q %v", got, resps, err)
	}
	if q, r := b.counts(); q != 0 || r != 0 {
		t.Errorf("counts %d queued, %d running after all finished", q, r)
	}
}

// TestBatchWorkers: BatchOptions.Share of the engine's Concurrency run
// queued batches, at least one, none when negative.
func TestBatchWorkers(t *testing.T) {
	for _, c := range []struct {
		share       float64
		concurrency int
		want        int
	}{{1, 1, 1}, {1, 4, 4}, {0.5, 4, 2}, {0.1, 4, 1}, {-1, 4, 0}} {
		if got := batchWorkers(Options{Concurrency: c.concurrency, Batch: BatchOptions{Share: c.share}}); got != c.want {
			t.Errorf("share %g of %d slots: %d workers, want %d", c.share, c.concurrency, got, c.want)
		}
	}
}
