package node

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/ready"
)

// TestReadyFile: a node with every address on port 0 writes, once it
// serves, a ready file naming the ports it bound (as its members see them),
// and removes it when it stops. A node bound to 0.0.0.0 names the
// advertised host instead of the unspecified one.
func TestReadyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.ready")
	a := openClusterNode(t, t.TempDir(), "a", nil, func(o *Options) { o.ReadyFile = path })
	info, err := ready.Wait(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := ready.Info{NodeID: "a", PID: os.Getpid(), GRPCAddr: a.GRPCAddr(), HTTPAddr: a.HTTPAddr(),
		DataAddr: a.DataAddr(), GossipAddr: a.GossipAddr(), ShmSocket: a.ShmSocket()}
	if info != want || info != a.Ready() {
		t.Fatalf("ready file %+v, want %+v", info, want)
	}
	for _, addr := range []string{info.GRPCAddr, info.HTTPAddr, info.DataAddr, info.GossipAddr} {
		if strings.HasSuffix(addr, ":0") {
			t.Errorf("ready file names port 0: %+v", info)
		}
	}
	self, ok := a.cluster.members.Member("a")
	if !ok || self.GossipAddr != info.GossipAddr || self.Meta.GRPCAddr != info.GRPCAddr || self.Meta.DataAddr != info.DataAddr ||
		self.Meta.HTTPAddr != info.HTTPAddr {
		t.Errorf("member %+v, want the addresses of the ready file %+v", self, info)
	}
	a.stop(t)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ready file after stop: %v, want it removed", err)
	}

	wild := filepath.Join(t.TempDir(), "wild.ready")
	openClusterNode(t, t.TempDir(), "b", nil, func(o *Options) {
		o.Listen.GRPCAddr, o.Listen.HTTPAddr, o.Listen.DataAddr = "0.0.0.0:0", "0.0.0.0:0", "0.0.0.0:0"
		o.ReadyFile = wild
	})
	info, err = ready.Wait(t.Context(), wild, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{info.GRPCAddr, info.HTTPAddr, info.DataAddr} {
		if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
			t.Errorf("address %q of a node bound to 0.0.0.0; want the advertised host 127.0.0.1 and the port", addr)
		}
	}
}
