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
	want := Options{
		DataDir:         "kvmesh-data",
		Listen:          ListenOptions{GRPCAddr: "127.0.0.1:7600", HTTPAddr: "127.0.0.1:7601", DataAddr: "127.0.0.1:7602"},
		Cluster:         ClusterOptions{GossipAddr: "127.0.0.1:7603"},
		Tiers:           TierOptions{DRAMBytes: 1 << 30, NVMeBytes: 10 << 30},
		Limits:          LimitOptions{MaxBlockBytes: 16 << 20, MaxBatchBlocks: 16384, MaxMessageBytes: 4 << 20, ChunkBytes: 1 << 20, RequestTimeout: time.Minute},
		ShutdownTimeout: 8 * time.Second,
		Version:         "(devel)",
	}
	got := o
	got.NodeID, got.Logger = "", nil
	if got.DataDir != want.DataDir || got.Listen.GRPCAddr != want.Listen.GRPCAddr || got.Listen.HTTPAddr != want.Listen.HTTPAddr ||
		got.Listen.DataAddr != want.Listen.DataAddr || got.Cluster.GossipAddr != want.Cluster.GossipAddr || got.Tiers.DRAMBytes != want.Tiers.DRAMBytes ||
		got.Tiers.NVMeBytes != want.Tiers.NVMeBytes || got.Limits.MaxBlockBytes != want.Limits.MaxBlockBytes || got.Limits.MaxBatchBlocks != want.Limits.MaxBatchBlocks ||
		got.Limits.MaxMessageBytes != want.Limits.MaxMessageBytes || got.Limits.ChunkBytes != want.Limits.ChunkBytes ||
		got.Limits.RequestTimeout != want.Limits.RequestTimeout || got.ShutdownTimeout != want.ShutdownTimeout || got.Version != want.Version {
		t.Fatalf("defaults\n got %+v\nwant %+v", got, want)
	}
	if o.NodeID != "" || o.Logger == nil || o.Listen.ShmSocket != "kvmesh-data/shm.sock" || o.Cluster.Replicas != 1 || o.Cluster.ChunkTokens != 512 ||
		o.Cluster.LookupTimeout != 100*time.Millisecond || o.Cluster.GetTimeout != 2*time.Second || o.Cluster.GossipProfile != "lan" ||
		o.Cluster.PushYield != 0 || o.Cluster.PushBytesPerSec != 0 {
		t.Fatalf("defaults: NodeID %q (want it left to Open), Logger %v, ShmSocket %q, Replicas %d, ChunkTokens %d, LookupTimeout %v, GetTimeout %v, GossipProfile %q, PushYield %v, PushBytesPerSec %d",
			o.NodeID, o.Logger, o.Listen.ShmSocket, o.Cluster.Replicas, o.Cluster.ChunkTokens, o.Cluster.LookupTimeout, o.Cluster.GetTimeout, o.Cluster.GossipProfile, o.Cluster.PushYield, o.Cluster.PushBytesPerSec)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		mod   func(*Options)
	}{
		{"Listen.GRPCAddr", func(o *Options) { o.Listen.GRPCAddr = "7600" }},
		{"Listen.HTTPAddr", func(o *Options) { o.Listen.HTTPAddr = o.Listen.GRPCAddr }},
		{"Cluster.GossipAddr", func(o *Options) { o.Cluster.GossipAddr = "nohost" }},
		{"Cluster.Join", func(o *Options) { o.Cluster.Join = []string{"10.0.0.1:7603", "10.0.0.2"} }},
		{"NodeID", func(o *Options) { o.NodeID = "has space" }},
		{"Cluster.GossipKey", func(o *Options) { o.Cluster.GossipKey = []byte("short") }},
		{"Cluster.GossipProfile", func(o *Options) { o.Cluster.GossipProfile = "wan" }},
		{"Cluster.Replicas", func(o *Options) { o.Cluster.Replicas = 9 }},
		{"Cluster.PushBytesPerSec", func(o *Options) { o.Cluster.PushBytesPerSec = -1 }},
		{"Listen.ShmSocket", func(o *Options) { o.Listen.ShmSocket = "/" + strings.Repeat("x", 120) }},
		{"Listen.ShmRegionBytes", func(o *Options) { o.Listen.ShmRegionBytes = 4097 }},
		{"Tiers.DRAMBytes", func(o *Options) { o.Tiers.DRAMBytes = -1 }},
		{"Tiers.NVMeBytes", func(o *Options) { o.Tiers.NVMeBytes = 1 << 20 }},
		{"Limits.MaxBlockBytes", func(o *Options) { o.Limits.MaxBlockBytes = 10 }},
		{"Limits.MaxBatchBlocks", func(o *Options) { o.Limits.MaxBatchBlocks = -3 }},
		{"Limits.MaxMessageBytes", func(o *Options) { o.Limits.MaxMessageBytes = 1024 }},
		{"Limits.ChunkBytes", func(o *Options) { o.Limits.ChunkBytes = 4 << 20 }},
		{"Limits.RequestTimeout", func(o *Options) { o.Limits.RequestTimeout = -time.Second }},
		{"ShutdownTimeout", func(o *Options) { o.ShutdownTimeout = -time.Second }},
		{"ReadyFile", func(o *Options) { o.ReadyFile = "/does/not/exist/kvmesh.ready" }},
		{"ReadyFile", func(o *Options) { o.ReadyFile = os.TempDir() }},
		{"Prefill.Role", func(o *Options) { o.Prefill.Role = "router" }},
		{"Prefill.MaxWaiting", func(o *Options) { o.Prefill.MaxWaiting = -1 }},
		{"Prefill.Speculative", func(o *Options) { o.Prefill.Speculative = "medusa" }},
		{"Prefill.SpeculativeTokens", func(o *Options) { o.Prefill.SpeculativeTokens = 17 }},
		{"Prefill.DraftDir", func(o *Options) { o.Prefill.Speculative = "draft" }},
		{"Prefill.DraftDir", func(o *Options) { o.Prefill.Speculative = "ngram"; o.Prefill.DraftDir = "/models/draft" }},
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
	if _, err := New(Options{Limits: LimitOptions{MaxBatchBlocks: -1}}, c); !errors.Is(err, ErrInvalidOptions) {
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
