package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node/ready"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary builds cmd/kvmesh once per test run.
func binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvmesh-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kvmesh")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, buildTags...)
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// daemon is a running kvmesh serve.
type daemon struct {
	cmd                           *exec.Cmd
	grpcAddr, http                string
	dataAddr, shmPath, gossip, id string
	ready                         ready.Info // what its ready file said
	readyFile                     string
	stdout, stderr                *lockedBuffer
	exited                        chan struct{}
	exitErr                       error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startDaemon runs kvmesh serve with every address on port 0 of loopback
// (args may name others: the last flag wins) and waits until it is ready.
func startDaemon(t testing.TB, dataDir string, args ...string) *daemon {
	t.Helper()
	return startCommand(t, exec.Command(binary(t), append([]string{"serve", "--data-dir", dataDir,
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"}, args...)...))
}

// startCommand starts cmd, a kvmesh serve, with --ready-file in a fresh
// directory, and waits until the node writes it: the addresses come from
// that file, never from a port found free beforehand. It fails at once if
// the process exits first. The test's cleanup kills it if it still runs.
func startCommand(t testing.TB, cmd *exec.Cmd) *daemon {
	t.Helper()
	readyPath := filepath.Join(t.TempDir(), "kvmesh.ready")
	cmd.Args = append(cmd.Args, "--ready-file", readyPath)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "KVMESH_CONFIG=", "KVMESH_READY_FILE=") // no stray config
	d := &daemon{cmd: cmd, readyFile: readyPath, stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.stdout, d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.exitErr = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-d.exited:
		default:
			cmd.Process.Kill()
			<-d.exited
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	info, err := ready.Wait(ctx, readyPath, d.exited)
	if errors.Is(err, ready.ErrExited) {
		t.Fatalf("kvmesh serve exited (%v) before it was ready:\n%s", d.exitErr, d.stderr)
	}
	if err != nil {
		t.Fatalf("kvmesh serve: %v:\n%s", err, d.stderr)
	}
	d.ready = info
	d.id, d.grpcAddr, d.http, d.dataAddr, d.gossip, d.shmPath = info.NodeID, info.GRPCAddr, info.HTTPAddr, info.DataAddr, info.GossipAddr, info.ShmSocket
	return d
}

// stop sends SIGTERM and returns how long the process took to exit and its
// exit error.
func (d *daemon) stop(t *testing.T) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
		return time.Since(start), d.exitErr
	case <-time.After(30 * time.Second):
		t.Fatalf("kvmesh serve still running 30s after SIGTERM:\n%s", d.stderr)
	}
	return 0, nil
}

// e2eNS has 512 KiB blocks of 16 tokens, so a few dozen blocks overflow a
// small DRAM tier into NVMe.
var e2eNS = prefixhash.Namespace{Model: "e2e/model", DType: prefixhash.Float32, BlockTokens: 16,
	Layers: 8, KVHeads: 8, HeadDim: 64}

func e2ePrompt(seed, blocks int) ([]uint32, [][]byte) {
	tokens := make([]uint32, blocks*e2eNS.BlockTokens+3)
	for i := range tokens {
		tokens[i] = uint32(seed*100000 + i)
	}
	payloads := make([][]byte, blocks)
	for i := range payloads {
		p := make([]byte, e2eNS.BlockBytes())
		for j := range p {
			p[j] = byte(seed*7 + i*13 + j)
		}
		payloads[i] = p
	}
	return tokens, payloads
}

// TestServe runs the binary as an operator would: serve with flags on free
// ports, drive it with the Go client and grpcurl, send it garbage, scrape it,
// stop it with SIGTERM under load and reopen its data dir.
func TestServe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dataDir := t.TempDir()
	flags := []string{"--dram", "32MiB", "--nvme", "512MiB", "--max-block-bytes", "1MiB", "--max-batch-blocks", "64"}
	d := startDaemon(t, dataDir, flags...)
	ctx := context.Background()
	c, err := client.Dial(d.grpcAddr, client.Options{MaxBatchBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Put/lookup/get round trip; then enough prompts to spill DRAM to NVMe.
	const prompts, blocks = 8, 6
	tokens, payloads := make([][]uint32, prompts), make([][][]byte, prompts)
	for p := range prompts {
		tokens[p], payloads[p] = e2ePrompt(p, blocks)
		if _, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: tokens[p]}, payloads[p]); err != nil {
			t.Fatalf("Put prompt %d: %v\n%s", p, err, d.stderr)
		}
	}
	last := prompts - 1
	l, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens[last]})
	if err != nil || l.CachedBlocks != blocks || l.CachedTokens != blocks*16 || l.PromptTokens != blocks*16+3 {
		t.Fatalf("Lookup = %+v, %v; want %d blocks cached", l, err, blocks)
	}
	got, err := c.Get(ctx, e2eNS, client.Prompt{Tokens: tokens[last]})
	if err != nil || len(got) != blocks {
		t.Fatalf("Get = %d blocks, %v", len(got), err)
	}
	for i, b := range got {
		if !bytes.Equal(b.Payload, payloads[last][i]) {
			t.Fatalf("Get block %d differs from what was put", i)
		}
	}

	t.Run("grpcurl", func(t *testing.T) {
		grpcurl, err := exec.LookPath("grpcurl")
		if err != nil {
			t.Skip("grpcurl is not on PATH: go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4 (.ci/run does)")
		}
		out, err := exec.Command(grpcurl, "-plaintext", d.grpcAddr, "list").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "kvmesh.v1.CacheService") || !strings.Contains(string(out), "grpc.health.v1.Health") {
			t.Fatalf("grpcurl list: %v\n%s", err, out)
		}
		out, err = exec.Command(grpcurl, "-plaintext", d.grpcAddr, "grpc.health.v1.Health/Check").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SERVING") {
			t.Fatalf("grpcurl health check: %v\n%s", err, out)
		}
		toks := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(tokens[last])), ","), "[]")
		req := fmt.Sprintf(`{"namespace":{"model":"e2e/model","dtype":"DTYPE_FLOAT32","blockTokens":16,"layers":8,"kvHeads":8,"headDim":64},"tokens":[%s]}`, toks)
		out, err = exec.Command(grpcurl, "-plaintext", "-d", req, d.grpcAddr, "kvmesh.v1.CacheService/Lookup").CombinedOutput()
		if err != nil || !strings.Contains(string(out), fmt.Sprintf(`"cachedTokens": "%d"`, blocks*16)) {
			t.Fatalf("grpcurl Lookup: %v\n%s", err, out)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		raw := kvmeshv1.NewCacheServiceClient(conn)
		ns := client.NamespaceProto(e2eNS)
		huge := client.NamespaceProto(e2eNS)
		huge.Layers = 64 // 4 MiB blocks, over --max-block-bytes 1MiB
		bad := client.NamespaceProto(e2eNS)
		bad.Dtype = 0
		put := func(req *kvmeshv1.BatchPutRequest) error {
			s, err := raw.BatchPut(ctx)
			if err != nil {
				return err
			}
			s.Send(req)
			_, err = s.CloseAndRecv()
			return err
		}
		for _, tc := range []struct {
			name, want string
			err        error
		}{
			{"malformed tokens", "block.tokens", put(&kvmeshv1.BatchPutRequest{Namespace: ns,
				Block: &kvmeshv1.BlockHeader{Tokens: []uint32{1, 2, 3}, PayloadLen: uint64(e2eNS.BlockBytes())}})},
			{"oversized block", "max_block_bytes", put(&kvmeshv1.BatchPutRequest{Namespace: huge})},
			{"invalid namespace", "dtype", func() error {
				_, err := raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad, Tokens: tokens[0]})
				return err
			}()},
			{"oversized batch", "max_batch_blocks", func() error {
				_, err := raw.Exists(ctx, &kvmeshv1.ExistsRequest{Keys: make([][]byte, 65)})
				return err
			}()},
		} {
			st, _ := status.FromError(tc.err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) {
				t.Errorf("%s: %v; want InvalidArgument naming %s", tc.name, tc.err, tc.want)
			}
		}
		if l, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens[last]}); err != nil || l.CachedBlocks != blocks {
			t.Fatalf("after refused requests, Lookup = %+v, %v", l, err)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		resp, err := http.Get("http://" + d.http + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		problems, err := promlint.New(bytes.NewReader(body)).Lint()
		if err != nil {
			t.Fatalf("/metrics does not parse: %v", err)
		}
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
		for _, want := range []string{`kvmesh_tier_blocks{tier="nvme"}`, `kvmesh_tier_capacity_bytes{tier="dram"}`, "kvmesh_cache_hits_total",
			"kvmesh_cache_demotions_total", "grpc_server_handling_seconds_bucket", "grpc_server_handled_total", "kvmesh_build_info"} {
			if !bytes.Contains(body, []byte(want)) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
		if resp, err := http.Get("http://" + d.http + "/healthz"); err != nil || resp.StatusCode != 200 {
			t.Fatalf("/healthz: %v %v", resp, err)
		}
	})

	// Which blocks live on NVMe now (Lookup reports tiers without moving
	// anything)?
	onDisk := map[prefixhash.Key][]byte{}
	for p := range prompts {
		l, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens[p]})
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range l.Blocks() {
			if b.Tier == "nvme" {
				onDisk[b.Key] = payloads[p][i]
			}
		}
	}
	if len(onDisk) == 0 {
		t.Fatalf("no block was demoted to NVMe; the test needs DRAM pressure\n%s", d.stderr)
	}

	// SIGTERM under a stream of read-only requests (reads that do not move
	// blocks between tiers): each finishes or fails cleanly.
	var wg sync.WaitGroup
	var served atomic.Int64
	errc := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(30 * time.Second)
			for i := 0; i < 100000 && time.Now().Before(deadline); i++ {
				if _, err := c.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens[(w+i)%prompts]}); err != nil {
					errc <- err
					return
				}
				served.Add(1)
			}
		}()
	}
	for served.Load() < 20 {
		select {
		case err := <-errc:
			t.Fatalf("request before SIGTERM failed: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	took, exitErr := d.stop(t)
	if exitErr != nil || took > 10*time.Second {
		t.Fatalf("after SIGTERM: exit %v after %v; want status 0 within 10s\n%s", exitErr, took, d.stderr)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if code := status.Code(errors.Unwrap(err)); code != codes.Unavailable && code != codes.Canceled {
			t.Errorf("request during shutdown: %v; want Unavailable or Canceled", err)
		}
	}
	if !strings.Contains(d.stderr.String(), "kvmesh node stopped") {
		t.Errorf("no clean stop in the log:\n%s", d.stderr)
	}

	// Reopen: the NVMe blocks are served.
	d2 := startDaemon(t, dataDir, flags...)
	c2, err := client.Dial(d2.grpcAddr, client.Options{MaxBatchBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	keys := make([]prefixhash.Key, 0, len(onDisk))
	for k := range onDisk {
		keys = append(keys, k)
	}
	n := 0
	reread, err := c2.Get(ctx, e2eNS, client.Prompt{Keys: keys})
	for _, b := range reread {
		if err != nil {
			break
		}
		switch {
		case !b.Found:
			err = fmt.Errorf("block %s was on NVMe before the restart and is missing after it", b.Key)
		case !bytes.Equal(b.Payload, onDisk[b.Key]):
			err = fmt.Errorf("block %s differs after the restart", b.Key)
		default:
			n++
		}
	}
	if err != nil || n != len(keys) {
		t.Fatalf("after reopening: %d of %d NVMe blocks served, %v\n%s", n, len(keys), err, d2.stderr)
	}
	if _, exitErr := d2.stop(t); exitErr != nil {
		t.Fatalf("second stop: %v\n%s", exitErr, d2.stderr)
	}
	t.Logf("%d blocks on NVMe survived the restart; %d requests served before SIGTERM", len(keys), served.Load())
}
