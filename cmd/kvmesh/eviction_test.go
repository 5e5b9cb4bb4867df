package main

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/store"
)

// TestServeEviction: --eviction (or KVMESH_EVICTION) picks the store's
// policy, dedup by default; an unknown name is refused with advice that
// names the flag.
func TestServeEviction(t *testing.T) {
	o, err := serveOptions(t, nil)
	if err != nil || o.Tiers.Eviction != string(store.DefaultEviction) {
		t.Fatalf("default: eviction %q, %v; want %q", o.Tiers.Eviction, err, store.DefaultEviction)
	}
	if o, err := serveOptions(t, nil, "--eviction", "lru"); err != nil || o.Tiers.Eviction != "lru" {
		t.Fatalf("--eviction lru: %q, %v", o.Tiers.Eviction, err)
	}
	if o, err := serveOptions(t, map[string]string{"KVMESH_EVICTION": "lru"}); err != nil || o.Tiers.Eviction != "lru" {
		t.Fatalf("KVMESH_EVICTION=lru: %q, %v", o.Tiers.Eviction, err)
	}
	_, err = serveOptions(t, nil, "--eviction", "fifo")
	if err == nil || !strings.Contains(err.Error(), "--eviction") || !strings.Contains(err.Error(), "fifo") {
		t.Fatalf("--eviction fifo: %v; want a refusal naming the flag and the value", err)
	}
}

// TestBenchEvictionRefused: kvmesh bench refuses an unknown --eviction
// before it starts anything.
func TestBenchEvictionRefused(t *testing.T) {
	c := benchCmd()
	c.SetArgs([]string{"trace", "--eviction", "fifo"})
	c.SetOut(new(strings.Builder))
	c.SetErr(new(strings.Builder))
	c.SilenceErrors, c.SilenceUsage = true, true
	if err := c.Execute(); err == nil || !strings.Contains(err.Error(), "--eviction") {
		t.Fatalf("bench trace --eviction fifo: %v; want a refusal naming --eviction", err)
	}
}
