package node

import (
	"errors"
	"testing"
	"time"
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
	if o.NodeID == "" || o.Logger == nil {
		t.Fatalf("NodeID %q, Logger %v: want both set", o.NodeID, o.Logger)
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
		{"Join", func(o *Options) { o.Join = []string{"10.0.0.1:7603"} }},
		{"DRAMBytes", func(o *Options) { o.DRAMBytes = -1 }},
		{"NVMeBytes", func(o *Options) { o.NVMeBytes = 1 << 20 }},
		{"MaxBlockBytes", func(o *Options) { o.MaxBlockBytes = 10 }},
		{"MaxBatchBlocks", func(o *Options) { o.MaxBatchBlocks = -3 }},
		{"MaxMessageBytes", func(o *Options) { o.MaxMessageBytes = 1024 }},
		{"ChunkBytes", func(o *Options) { o.ChunkBytes = 4 << 20 }},
		{"RequestTimeout", func(o *Options) { o.RequestTimeout = -time.Second }},
		{"ShutdownTimeout", func(o *Options) { o.ShutdownTimeout = -time.Second }},
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
