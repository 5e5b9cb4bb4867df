package main

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestDataDirPrivate runs a node under umask 000 through every feature that
// writes under its data dir (blocks spilled to NVMe, a quota, synchronous
// and queued prefills, an OpenAI batch), and finds every file there 0600,
// every directory 0700 and the shared-memory socket the node's user's
// alone, while it runs and after it stopped: pebble's files (the NVMe
// index, the prefill queue) included.
func TestDataDirPrivate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dir := filepath.Join(t.TempDir(), "data")
	cmd := exec.Command("sh", "-c", `umask 000 && exec "$0" "$@"`, binary(t), "serve", "--data-dir", dir,
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0",
		"--dram", "8MiB", "--nvme", "256MiB", "--max-block-bytes", "1MiB")
	d := startCommand(t, cmd)
	c := dialNode(t, d)
	ctx := context.Background()

	tokens, payloads := e2ePrompt(1, 40) // 20 MiB: most of it spills to NVMe
	if _, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetQuota(ctx, e2eNS, client.Quota{DRAMBytes: 64 << 20, NVMeBytes: 128 << 20}); err != nil {
		t.Fatal(err)
	}
	addr := []string{"--addr", d.grpcAddr}
	text := strings.Repeat("Files under the data dir are the node's alone. ", 3)
	kvmesh(t, append([]string{"prefill", "--text", text}, addr...)...)
	kvmesh(t, append([]string{"prefill", "--text", text + "?", "--queue", "--wait"}, addr...)...)
	req := map[string]any{"model": "kvmesh", "prompt": text, "max_tokens": 4, "temperature": 0}
	code, sub := queueCall(t, "POST", "http://"+d.http+"/v1/queue", map[string]any{"requests": []any{req}})
	id, _ := sub["request_id"].(string)
	if code != http.StatusAccepted || id == "" {
		t.Fatalf("POST /v1/queue: %d %v", code, sub)
	}
	testkit.WaitFor(t, "the batch completes", func() bool {
		_, m := queueCall(t, "GET", "http://"+d.http+"/v1/queue/"+id, nil)
		return m["status"] == "completed"
	})
	testkit.WaitFor(t, "blocks spilled to NVMe", func() bool {
		blocks, _, _ := tierStats(t, c, "nvme")
		return blocks > 0
	})

	checkPrivate(t, dir, "nvme/index/LOCK", "nvme/index/OPTIONS-*", "nvme/index/MANIFEST-*", "nvme/segments/*",
		"prefill-queue/LOCK", "prefill-queue/MANIFEST-*", "prefill-queue/*.log", "node-id", "quotas.json", "callback-secret", "shm.sock")
	if _, err := d.stop(t); err != nil {
		t.Fatalf("stop: %v\n%s", err, d.stderr)
	}
	checkPrivate(t, dir, "nvme/index/LOCK", "prefill-queue/OPTIONS-*", "node-id")
}

// checkPrivate walks dir: files 0600, directories 0700, other entries
// (the socket) without access for group or others. Each of want (globs
// under dir) must match something, so the walk covers what it claims to.
func checkPrivate(t *testing.T, dir string, want ...string) {
	t.Helper()
	for _, w := range want {
		if m, _ := filepath.Glob(filepath.Join(dir, w)); len(m) == 0 {
			t.Errorf("nothing under the data dir matches %s", w)
		}
	}
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if os.IsNotExist(err) { // removed since it was listed (a WAL recycled)
			return nil
		}
		if err != nil {
			return err
		}
		mode := info.Mode()
		switch {
		case mode.IsRegular() && mode.Perm() != 0o600, mode.IsDir() && mode.Perm() != 0o700, mode.Perm()&0o077 != 0:
			t.Errorf("%s: %v; the data dir's files must be 0600, its directories 0700", path, mode)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
