package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node/ready"
	"github.com/kvmesh/kvmesh/transfer"
)

// TestServePortZero starts two `kvmesh serve` processes with every address
// on port 0 and reaches them only through their ready files: the first is
// answering the moment its file appears (gRPC health, HTTP, data plane
// through the Go client and a raw data-plane client), its log names the same
// addresses, the second joins it at the gossip address of the file, and each
// sees the other at the addresses of the other's file (the gossiped
// metadata carries bound ports, not 0). A stopped node removes its file.
func TestServePortZero(t *testing.T) {
	a := startDaemon(t, t.TempDir(), "--gossip-profile", "local", "--dram", "64MiB", "--nvme", "64MiB")
	info := a.ready

	// Serving already: one attempt each, no retry, no waiting for ready.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc, err := healthpb.NewHealthClient(rawConn(t, info.GRPCAddr)).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check at %s the moment the ready file appeared: %v, %v", info.GRPCAddr, hc, err)
	}
	resp, err := http.Get("http://" + info.HTTPAddr + "/metrics")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics at %s: %v, %v", info.HTTPAddr, resp, err)
	}
	resp.Body.Close()

	raw, err := os.ReadFile(a.readyFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("ready file is not JSON: %v\n%s", err, raw)
	}
	for _, k := range []string{"node_id", "pid", "grpc_addr", "http_addr", "data_addr", "gossip_addr", "shm_socket"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("ready file has no %q:\n%s", k, raw)
		}
	}
	if info.PID != a.cmd.Process.Pid || info.NodeID == "" || info.ShmSocket == "" {
		t.Errorf("ready file %+v; pid %d", info, a.cmd.Process.Pid)
	}
	for _, addr := range []string{info.GRPCAddr, info.HTTPAddr, info.DataAddr, info.GossipAddr} {
		if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
			t.Errorf("address %q in the ready file, want 127.0.0.1 and the port bound", addr)
		}
	}
	// The log's first serving line lists the same addresses.
	logLine := ""
	for _, l := range strings.Split(a.stderr.String(), "\n") {
		if strings.Contains(l, `msg="kvmesh node serving"`) {
			logLine = l
			break
		}
	}
	for _, kv := range []string{"grpc=" + info.GRPCAddr, "http=" + info.HTTPAddr, "data=" + info.DataAddr,
		"gossip=" + info.GossipAddr, "shm=" + info.ShmSocket} {
		if !strings.Contains(logLine, kv+" ") {
			t.Errorf("serving log line %q has no %s", logLine, kv)
		}
	}

	// Data plane: the Go client over TCP, and a raw client at data_addr.
	c, err := client.Dial(info.GRPCAddr, client.Options{Transport: client.TransportTCP})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tokens, payloads := e2ePrompt(1, 3)
	keys, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads)
	if err != nil || len(keys) != 3 {
		t.Fatalf("Put: %v, %v", keys, err)
	}
	if got, err := c.Get(ctx, e2eNS, client.Prompt{Tokens: tokens}); err != nil || len(got) != 3 || !bytes.Equal(got[2].Payload, payloads[2]) {
		t.Fatalf("Get: %d blocks, %v", len(got), err)
	}
	dc, err := transfer.NewClient(info.DataAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	res, err := dc.Get(ctx, keys)
	if err != nil || res.Hits() != 3 {
		t.Fatalf("data plane at %s: %v, %v", info.DataAddr, res, err)
	}
	res.Release()

	// A second node joins at the gossip address of the first's file.
	b := startDaemon(t, t.TempDir(), "--gossip-profile", "local", "--dram", "64MiB", "--nvme", "64MiB", "--join", info.GossipAddr)
	cb, err := client.Dial(b.ready.GRPCAddr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	waitMembers(t, c, 2, a, b)
	waitMembers(t, cb, 2, a, b)
	for _, view := range []*client.Client{c, cb} {
		m, err := view.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, mb := range m.Members {
			want := map[string]ready.Info{a.id: a.ready, b.id: b.ready}[mb.ID]
			got := ready.Info{NodeID: mb.ID, PID: want.PID, GRPCAddr: mb.GRPCAddr, HTTPAddr: mb.HTTPAddr,
				DataAddr: mb.DataAddr, GossipAddr: mb.GossipAddr, ShmSocket: want.ShmSocket}
			if got != want {
				t.Errorf("member %+v, want the addresses of its ready file %+v", got, want)
			}
		}
	}

	if _, err := b.stop(t); err != nil {
		t.Fatalf("stop: %v\n%s", err, b.stderr)
	}
	if _, err := os.Stat(b.readyFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ready file of a stopped node: %v, want it removed", err)
	}
}

// TestServeReadyFileBadPath: a ready file in a directory that does not
// exist fails the start at once, with one line naming the flag, before the
// node binds or creates anything.
func TestServeReadyFileBadPath(t *testing.T) {
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	missing := filepath.Join(dir, "no", "such", "dir")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), "serve", "--data-dir", dataDir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--ready-file", filepath.Join(missing, "kvmesh.ready"))
	cmd.Env = append(os.Environ(), "KVMESH_CONFIG=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1\n%s", err, stderr.String())
	}
	msg := strings.TrimSpace(stderr.String())
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "--ready-file") || !strings.Contains(msg, missing) || !strings.Contains(msg, "does not exist") {
		t.Errorf("stderr %q, want one line naming --ready-file and %s", msg, missing)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir: %v; the node must fail before it opens anything", err)
	}
}
