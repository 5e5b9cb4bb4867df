package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// recordedEvents is an Events that keeps what it is told, as strings.
type recordedEvents struct {
	mu  sync.Mutex
	log []string
}

func (r *recordedEvents) BlockStored(medium string, record []byte) {
	h, err := block.DecodeHeader(record, 0)
	r.add(fmt.Sprintf("stored %s %s %v", medium, h.Key, err))
}

func (r *recordedEvents) BlockRemoved(medium string, key prefixhash.Key, digest uint64) {
	r.add(fmt.Sprintf("removed %s %s", medium, key))
}

func (r *recordedEvents) AllBlocksCleared(digest uint64) { r.add(fmt.Sprintf("cleared %016x", digest)) }

func (r *recordedEvents) add(s string) {
	r.mu.Lock()
	r.log = append(r.log, s)
	r.mu.Unlock()
}

func (r *recordedEvents) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

// TestEvents: a put is a store into CPU; a demotion a removal from CPU and a
// store into DISK; a promotion the reverse; an eviction a removal; a
// namespace drop one AllBlocksCleared; objects are not reported.
func TestEvents(t *testing.T) {
	ctx := context.Background()
	ev := &recordedEvents{}
	ns := blocktest.NS()
	w := newWorld(t, 35, ns)
	l := openLocal(t, Options{DRAM: newFakeMem(blockBytes, 2, blockBytes), NVMe: newFakeVolume(64<<10, 8).open(), DemoteBatchBytes: 1, Events: ev})
	a := w.extend(-1)
	if err := l.Put(ctx, w.blocks[a].enc); err != nil {
		t.Fatal(err)
	}
	ka := w.blocks[a].key
	if got, want := ev.take(), []string{fmt.Sprintf("stored CPU %s <nil>", ka)}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("put: %v, want %v", got, want)
	}
	// Two more blocks: DRAM holds two, so the coldest (a) is demoted.
	for range 2 {
		if err := l.Put(ctx, w.blocks[w.extend(-1)].enc); err != nil {
			t.Fatal(err)
		}
	}
	got := fmt.Sprint(ev.take())
	if want := fmt.Sprintf("removed CPU %s stored DISK %s <nil>", ka, ka); !strings.Contains(got, want) {
		t.Fatalf("demotion: %s, want %s in it", got, want)
	}
	// Read a twice: its second hit promotes it.
	for range 2 {
		r, err := l.Get(ctx, ka)
		if err != nil {
			t.Fatal(err)
		}
		r.Release()
	}
	if got := fmt.Sprint(ev.take()); !strings.Contains(got, fmt.Sprintf("removed DISK %s stored CPU %s <nil>", ka, ka)) {
		t.Fatalf("promotion: %s", got)
	}
	// Objects are not KV blocks.
	b, okey := object(t, rand.New(rand.NewPCG(1, 1)), ns, "o", 100, block.Retention{})
	if err := l.Put(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ev.take()); strings.Contains(got, okey.String()) {
		t.Fatalf("an object put was reported: %v", got)
	}
	if _, err := l.DropNamespace(ns.Digest()); err != nil {
		t.Fatal(err)
	}
	if got, want := ev.take(), []string{fmt.Sprintf("cleared %016x", ns.Digest())}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("drop: %v, want %v", got, want)
	}
}
