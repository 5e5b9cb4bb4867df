package ready

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.ready")
	want := Info{NodeID: "n1", PID: 42, GRPCAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2", DataAddr: "127.0.0.1:3",
		GossipAddr: "127.0.0.1:4", ShmSocket: "/tmp/s.sock"}
	if err := Write(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil || got != want {
		t.Fatalf("Read: %+v, %v; want %+v", got, err, want)
	}
	// Only the file is left: the temporary file was renamed.
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("dir holds %v, want the ready file alone", ents)
	}
	b, _ := os.ReadFile(path)
	for _, key := range []string{`"node_id"`, `"pid"`, `"grpc_addr"`, `"http_addr"`, `"data_addr"`, `"gossip_addr"`, `"shm_socket"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("file has no key %s:\n%s", key, b)
		}
	}
}

func TestWriteMissingDir(t *testing.T) {
	err := Write(filepath.Join(t.TempDir(), "nope", "node.ready"), Info{PID: 1, GRPCAddr: "x:1"})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Write into a missing directory: %v", err)
	}
}

func TestWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.ready")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		info Info
		err  error
	}
	got := make(chan result, 1)
	go func() {
		info, err := Wait(ctx, path, nil)
		got <- result{info, err}
	}()
	if err := Write(path, Info{PID: 7, GRPCAddr: "127.0.0.1:9"}); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || r.info.PID != 7 {
		t.Fatalf("Wait: %+v, %v", r.info, r.err)
	}

	exited := make(chan struct{})
	close(exited)
	if _, err := Wait(ctx, filepath.Join(t.TempDir(), "never"), exited); !errors.Is(err, ErrExited) {
		t.Fatalf("Wait on an exited process: %v, want ErrExited", err)
	}
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := Wait(short, filepath.Join(t.TempDir(), "never"), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past the deadline: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("{not json"), 0o644)
	if _, err := Wait(ctx, bad, nil); err == nil {
		t.Fatal("Wait accepted a file that is not JSON")
	}
}
