package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func tinyPeers(t *testing.T) PeersOptions {
	return PeersOptions{
		BlockSizes:            []int{64 << 10},
		Concurrency:           []int{2},
		Duration:              20 * time.Millisecond,
		MemcpyWorkingSetBytes: 1 << 20,
		RedisKeyBytes:         1 << 20,
		Fio:                   FioOptions{FileBytes: 4 << 20, Runtime: 50 * time.Millisecond, IODepth: 2},
	}
}

func TestMissingPeersAreSkipped(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no redis-server, no fio
	env := &Env{WorkDir: t.TempDir(), OutDir: t.TempDir()}
	res := &Result{Suite: "peers"}
	f, err := MeasurePeers(context.Background(), env, tinyPeers(t), res)
	if err != nil {
		t.Fatalf("missing peers failed the suite: %v", err)
	}
	var skipped []string
	for _, s := range res.Skipped {
		skipped = append(skipped, s.What)
		if !strings.Contains(s.Reason, "not found") {
			t.Errorf("skip reason %q does not say the binary was not found", s.Reason)
		}
	}
	if want := []string{"redis", "fio seq_write", "fio rand_read"}; strings.Join(skipped, ",") != strings.Join(want, ",") {
		t.Fatalf("skipped %v, want %v", skipped, want)
	}
	if len(f.Redis) != 0 || len(f.Fio) != 0 || len(f.Memcpy) != 1 || len(f.RawTCP) != 1 {
		t.Fatalf("figures: %d redis, %d fio, %d memcpy, %d tcp", len(f.Redis), len(f.Fio), len(f.Memcpy), len(f.RawTCP))
	}
	var tables []string
	for _, tb := range res.Tables {
		tables = append(tables, tb.Name)
	}
	if strings.Join(tables, ",") != "memcpy,raw_tcp" {
		t.Fatalf("tables %v, want memcpy and raw_tcp only", tables)
	}
	checkPNG(t, res.Plots, 1)

	_, err = StartRedis(context.Background(), RedisOptions{})
	if !errors.Is(err, ErrMissing) {
		t.Fatalf("StartRedis without redis-server: %v, want ErrMissing", err)
	}
	_, err = Fio(context.Background(), FioOptions{Dir: t.TempDir()}, FioSeqWrite)
	if !errors.Is(err, ErrMissing) {
		t.Fatalf("Fio without fio: %v, want ErrMissing", err)
	}
}

func checkPNG(t *testing.T, paths []string, want int) {
	t.Helper()
	if len(paths) != want {
		t.Fatalf("%d plots %v, want %d", len(paths), paths, want)
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
			t.Fatalf("%s is %v", p, b)
		}
	}
}

func TestRedisPeer(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := StartRedis(ctx, RedisOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// On a unix socket, and on no TCP port (none was guessed for it).
	if fi, err := os.Stat(r.Socket()); r.Version() == "" || err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("version %q, socket %q: %v", r.Version(), r.Socket(), err)
	}
	ic, err := dialRESP(ctx, r.Socket(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	_, info, err := ic.command(ctx, nil, nil, "INFO", "server")
	ic.Close()
	if err != nil || !strings.Contains(string(info), "tcp_port:0") {
		t.Fatalf("INFO server: %v\n%s", err, info)
	}
	set, get, err := KVLoad(ctx, r.Target(), KVLoadOptions{ValueBytes: 4096, Concurrency: 2, Keys: 16,
		Duration: time.Second, MaxOps: 200})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range []KVResult{set, get} {
		if res.Ops < 1 || res.Ops > 200 || res.Errors != 0 || res.GBps <= 0 || res.Target != "redis" {
			t.Fatalf("%s: %+v", res.Op, res)
		}
	}
	c, err := r.Target().Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Get(ctx, 1<<30, nil); !errors.Is(err, errRESPNil) {
		t.Fatalf("GET of a missing key: %v", err)
	}
	// An error reply leaves the connection usable.
	rc := c.(*redisConn).c
	if _, _, err := rc.command(ctx, nil, nil, "NOSUCHCOMMAND"); err == nil || errors.Is(err, errRESPProtocol) {
		t.Fatalf("unknown command: %v, want an error reply", err)
	}
	if v, err := c.Get(ctx, 3, nil); err != nil || len(v) != 4096 {
		t.Fatalf("GET after an error reply: %d bytes, %v", len(v), err)
	}
	dir := r.dir
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	default:
		t.Fatal("Close returned before the server exited")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("server directory left behind: %v", err)
	}
}

func TestFioPeer(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio not installed")
	}
	dir := t.TempDir()
	o := FioOptions{Dir: dir, FileBytes: 4 << 20, Runtime: 100 * time.Millisecond, IODepth: 2}
	for _, job := range []FioJob{FioSeqWrite, FioRandRead} {
		r, err := Fio(context.Background(), o, job)
		if errors.Is(err, ErrMissing) {
			t.Skipf("fio cannot run here: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.Job != job.Name || r.BlockBytes != job.BlockBytes || r.GBps <= 0 || r.IOPS <= 0 || r.IODepth != 2 {
			t.Fatalf("%s: %+v", job.Name, r)
		}
	}
	if err := RemoveFioFile(dir); err != nil {
		t.Fatal(err)
	}
}

func TestParseFio(t *testing.T) {
	out, err := os.ReadFile("testdata/fio_randread.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := parseFio(out, FioRandRead)
	if err != nil {
		t.Fatal(err)
	}
	if r.GBps != 1.423801725 || r.P50MS != 0.254976 || r.Job != "rand_read" || r.RW != "randread" {
		t.Fatalf("parsed %+v", r)
	}
	for _, bad := range []string{"", "fio: no JSON here", `{"jobs": []}`, `{"jobs": [{"error": 5}]}`, `{"jobs": [{"read": {}}]}`, "{"} {
		if _, err := parseFio([]byte(bad), FioRandRead); err == nil {
			t.Errorf("parseFio(%q) accepted bad output", bad)
		}
	}
}

func TestRawTCPAndMemcpy(t *testing.T) {
	ctx := context.Background()
	tcp, err := RawTCP(ctx, TCPOptions{Conns: 2, WriteBytes: 64 << 10, Duration: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if tcp.Bytes <= 0 || tcp.GBps <= 0 || tcp.Conns != 2 {
		t.Fatalf("raw tcp: %+v", tcp)
	}
	m, err := Memcpy(ctx, MemcpyOptions{BlockBytes: 64 << 10, WorkingSetBytes: 1 << 20, Duration: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if m.Bytes <= 0 || m.GBps <= 0 || m.WorkingSetBytes != 1<<20 {
		t.Fatalf("memcpy: %+v", m)
	}
	if _, err := Memcpy(ctx, MemcpyOptions{}); err == nil {
		t.Fatal("memcpy of 0-byte blocks accepted")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := RawTCP(cctx, TCPOptions{Duration: time.Second}); err == nil {
		t.Fatal("raw tcp ran with a cancelled context")
	}
}

// mapTarget is an in-memory KVTarget; corrupt makes every GET return a
// value of the wrong key.
type mapTarget struct {
	mu      sync.Mutex
	m       map[int][]byte
	corrupt bool
}

func (t *mapTarget) Name() string                         { return "map" }
func (t *mapTarget) Dial(context.Context) (KVConn, error) { return t, nil }
func (t *mapTarget) Close() error                         { return nil }
func (t *mapTarget) Set(_ context.Context, k int, v []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[int][]byte{}
	}
	t.m[k] = bytes.Clone(v)
	return nil
}
func (t *mapTarget) Get(_ context.Context, k int, dst []byte) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[k]
	if !ok {
		return dst, fmt.Errorf("key %d missing", k)
	}
	if t.corrupt {
		v = t.m[(k+1)%len(t.m)]
	}
	return append(dst[:0], v...), nil
}

func TestKVLoad(t *testing.T) {
	o := KVLoadOptions{ValueBytes: 64, Concurrency: 3, Keys: 10, Duration: time.Second, MaxOps: 300}
	set, get, err := KVLoad(context.Background(), &mapTarget{}, o)
	if err != nil {
		t.Fatal(err)
	}
	if set.Ops != 300 || get.Ops != 300 || set.Errors+get.Errors != 0 {
		t.Fatalf("set %+v\nget %+v", set, get)
	}
	_, get, err = KVLoad(context.Background(), &mapTarget{corrupt: true}, o)
	if err != nil {
		t.Fatal(err)
	}
	if get.Errors != 300 || get.Ops != 0 {
		t.Fatalf("wrong values not detected: %+v", get)
	}
	if _, _, err := KVLoad(context.Background(), &mapTarget{}, KVLoadOptions{ValueBytes: 4}); err == nil ||
		!strings.Contains(err.Error(), "value_bytes") {
		t.Fatalf("4-byte values: %v, want an error naming value_bytes", err)
	}
}

func TestReadReply(t *testing.T) {
	errAny := errors.New("any error")
	tests := []struct {
		in   string
		kind byte
		val  string
		err  error // nil: success; errAny: some error
	}{
		{"+OK\r\n", '+', "OK", nil},
		{":42\r\n", ':', "42", nil},
		{"$5\r\nhello\r\n", '$', "hello", nil},
		{"$0\r\n\r\n", '$', "", nil},
		{"$-1\r\n", 0, "", errRESPNil},
		{"$5\r\nhelloXX", 0, "", errRESPProtocol},
		{"$99\r\nshort\r\n", 0, "", errAny}, // EOF inside the bulk
		{"$2000\r\n", 0, "", errRESPProtocol},
		{"$x\r\n", 0, "", errRESPProtocol},
		{"*1\r\n$1\r\na\r\n", 0, "", errRESPProtocol},
		{"+OK\n", 0, "", errRESPProtocol},
		{"", 0, "", errAny},
	}
	for _, tt := range tests {
		kind, val, err := readReply(bufio.NewReader(strings.NewReader(tt.in)), nil, 1000)
		switch {
		case tt.err == nil && (err != nil || kind != tt.kind || string(val) != tt.val):
			t.Errorf("%q: %q %q %v, want %q %q", tt.in, kind, val, err, tt.kind, tt.val)
		case tt.err == errAny && err == nil:
			t.Errorf("%q: no error", tt.in)
		case tt.err != nil && tt.err != errAny && !errors.Is(err, tt.err):
			t.Errorf("%q: err %v, want %v", tt.in, err, tt.err)
		}
	}
	var re respError
	if _, _, err := readReply(bufio.NewReader(strings.NewReader("-ERR no\r\n")), nil, 10); !errors.As(err, &re) || string(re) != "ERR no" {
		t.Errorf("error reply: %v", err)
	}
}

func FuzzReadReply(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "$5\r\nhello\r\n", "$-1\r\n", "-ERR x\r\n", ":1\r\n", "$3\r\nab", "*2\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(b), 16)
		for range 64 {
			_, v, err := readReply(r, nil, 1<<10)
			if len(v) > 1<<10 {
				t.Fatalf("reply of %d bytes beyond the limit", len(v))
			}
			if err != nil {
				return
			}
		}
	})
}

func TestPeersSuiteWithEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis and fio")
	}
	env := &Env{WorkDir: t.TempDir(), OutDir: t.TempDir()}
	res := &Result{}
	o := tinyPeers(t)
	f, err := MeasurePeers(context.Background(), env, o, res)
	if err != nil {
		t.Fatal(err)
	}
	_, redisErr := exec.LookPath("redis-server")
	if redisErr == nil {
		if len(f.Redis) != 2 || f.Redis[0].RatioVsRawTCP == nil {
			t.Fatalf("redis rows %+v", f.Redis)
		}
	}
	checkPNG(t, res.Plots, 1)
	if _, err := os.Stat(filepath.Join(env.WorkDir, "kvmesh-bench-fio.dat")); !os.IsNotExist(err) {
		t.Fatal("fio's file was left in the work directory")
	}
}
