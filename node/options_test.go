package node

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
)

func TestOptionsDefaults(t *testing.T) {
	var o Options
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	want := Options{DataDir: "kvmesh-data", GRPCAddr: "127.0.0.1:7600", HTTPAddr: "127.0.0.1:7601",
		DataAddr: "127.0.0.1:7602", GossipAddr: "127.0.0.1:7603", DRAMBytes: 1 << 30, NVMeBytes: 10 << 30,
		MaxBlockBytes: 16 << 20, MaxBatchBlocks: 16384, MaxMessageBytes: 4 << 20, ChunkBytes: 1 << 20,
		RequestTimeout: time.Minute, ShutdownTimeout: 8 * time.Second, Version: "(devel)"}
	got := o
	got.NodeID, got.Logger = "", nil
	if got.DataDir != want.DataDir || got.GRPCAddr != want.GRPCAddr || got.HTTPAddr != want.HTTPAddr ||
		got.DataAddr != want.DataAddr || got.GossipAddr != want.GossipAddr || got.DRAMBytes != want.DRAMBytes ||
		got.NVMeBytes != want.NVMeBytes || got.MaxBlockBytes != want.MaxBlockBytes || got.MaxBatchBlocks != want.MaxBatchBlocks ||
		got.MaxMessageBytes != want.MaxMessageBytes || got.ChunkBytes != want.ChunkBytes ||
		got.RequestTimeout != want.RequestTimeout || got.ShutdownTimeout != want.ShutdownTimeout || got.Version != want.Version {
		t.Fatalf("defaults\n got %+v\nwant %+v", got, want)
	}
	if o.NodeID != "" || o.Logger == nil || o.ShmSocket != "kvmesh-data/shm.sock" || o.Replicas != 1 || o.ChunkTokens != 512 ||
		o.LookupTimeout != 100*time.Millisecond || o.GetTimeout != 2*time.Second || o.GossipProfile != "lan" ||
		o.PushYield != 0 || o.PushBytesPerSec != 0 {
		t.Fatalf("defaults: NodeID %q (want it left to Open), Logger %v, ShmSocket %q, Replicas %d, ChunkTokens %d, LookupTimeout %v, GetTimeout %v, GossipProfile %q, PushYield %v, PushBytesPerSec %d",
			o.NodeID, o.Logger, o.ShmSocket, o.Replicas, o.ChunkTokens, o.LookupTimeout, o.GetTimeout, o.GossipProfile, o.PushYield, o.PushBytesPerSec)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		mod   func(*Options)
	}{
		{"GRPCAddr", func(o *Options) { o.GRPCAddr = "7600" }},
		{"HTTPAddr", func(o *Options) { o.HTTPAddr = o.GRPCAddr }},
		{"GossipAddr", func(o *Options) { o.GossipAddr = "nohost" }},
		{"Join", func(o *Options) { o.Join = []string{"10.0.0.1:7603", "10.0.0.2"} }},
		{"NodeID", func(o *Options) { o.NodeID = "has space" }},
		{"GossipKey", func(o *Options) { o.GossipKey = []byte("short") }},
		{"GossipProfile", func(o *Options) { o.GossipProfile = "wan" }},
		{"Replicas", func(o *Options) { o.Replicas = 9 }},
		{"PushBytesPerSec", func(o *Options) { o.PushBytesPerSec = -1 }},
		{"ShmSocket", func(o *Options) { o.ShmSocket = "/" + strings.Repeat("x", 120) }},
		{"ShmRegionBytes", func(o *Options) { o.ShmRegionBytes = 4097 }},
		{"DRAMBytes", func(o *Options) { o.DRAMBytes = -1 }},
		{"NVMeBytes", func(o *Options) { o.NVMeBytes = 1 << 20 }},
		{"MaxBlockBytes", func(o *Options) { o.MaxBlockBytes = 10 }},
		{"MaxBatchBlocks", func(o *Options) { o.MaxBatchBlocks = -3 }},
		{"MaxMessageBytes", func(o *Options) { o.MaxMessageBytes = 1024 }},
		{"ChunkBytes", func(o *Options) { o.ChunkBytes = 4 << 20 }},
		{"RequestTimeout", func(o *Options) { o.RequestTimeout = -time.Second }},
		{"ShutdownTimeout", func(o *Options) { o.ShutdownTimeout = -time.Second }},
		{"ReadyFile", func(o *Options) { o.ReadyFile = "/does/not/exist/kvmesh.ready" }},
		{"ReadyFile", func(o *Options) { o.ReadyFile = os.TempDir() }},
		{"Prefill.Role", func(o *Options) { o.Prefill.Role = "router" }},
		{"Prefill.MaxWaiting", func(o *Options) { o.Prefill.MaxWaiting = -1 }},
		{"Prefill.Batch.TenantQueued", func(o *Options) { o.Prefill.Batch.TenantQueued = o.Prefill.Batch.MaxRequests - 1 }},
		{"Prefill.Batch.MaxBodyBytes", func(o *Options) { o.Prefill.Batch.MaxBodyBytes = 10 }},
		{"Prefill.Batch.ResultTTL", func(o *Options) { o.Prefill.Batch.ResultTTL = time.Millisecond }},
	} {
		var o Options
		o.EnsureDefaults()
		tc.mod(&o)
		err := o.Validate()
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Field != tc.field || !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%s: Validate = %v, want an OptionError naming %s", tc.field, err, tc.field)
		}
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	c := newFakeCache(1 << 20)
	if _, err := New(Options{MaxBatchBlocks: -1}, c); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("New = %v, want ErrInvalidOptions", err)
	}
	if c.closed.Load() != 1 {
		t.Fatal("New did not close the cache it was given")
	}
}

// TestNodeIDIsStable: a node without an id generates one on its first start
// and keeps it in its data dir; an id given explicitly wins.
func TestNodeIDIsStable(t *testing.T) {
	dir := t.TempDir()
	o := Options{DataDir: dir}
	o.EnsureDefaults()
	if err := resolveNodeID(&o); err != nil || o.NodeID == "" {
		t.Fatalf("first start: id %q, %v", o.NodeID, err)
	}
	again := Options{DataDir: dir}
	again.EnsureDefaults()
	if err := resolveNodeID(&again); err != nil || again.NodeID != o.NodeID {
		t.Fatalf("restart: id %q, %v; want %q", again.NodeID, err, o.NodeID)
	}
	other := Options{DataDir: t.TempDir()}
	other.EnsureDefaults()
	if err := resolveNodeID(&other); err != nil || other.NodeID == o.NodeID {
		t.Fatalf("another data dir got id %q (%v); ids must be unique", other.NodeID, err)
	}
	given := Options{DataDir: dir, NodeID: "n1", Logger: slog.New(slog.DiscardHandler)}
	given.EnsureDefaults()
	if err := resolveNodeID(&given); err != nil || given.NodeID != "n1" {
		t.Fatalf("given id: %q, %v", given.NodeID, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, nodeIDFile)); strings.TrimSpace(string(b)) != "n1" {
		t.Fatalf("stored id %q after an explicit one", b)
	}
}

func TestReadGossipKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key, err := ReadGossipKey(write("good", "MDEyMzQ1Njc4OWFiY2RlZg==\n")) // "0123456789abcdef"
	if err != nil || string(key) != "0123456789abcdef" {
		t.Fatalf("ReadGossipKey = %q, %v", key, err)
	}
	if _, err := ReadGossipKey(write("short", "c2hvcnQ=")); !errors.Is(err, gossip.ErrSecretKey) {
		t.Fatalf("5-byte key: %v, want gossip.ErrSecretKey", err)
	}
	if _, err := ReadGossipKey(write("garbage", "not base64 at all!")); err == nil {
		t.Fatal("garbage accepted as a key")
	}
	if _, err := ReadGossipKey(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing file accepted")
	}
}
