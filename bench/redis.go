package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RedisOptions configures the Redis peer.
type RedisOptions struct {
	// Binary is the server to run. Default "redis-server", looked up in PATH.
	Binary string
	// Dir is where the server's scratch directory is made. Default os.TempDir().
	Dir string
	// StartTimeout bounds how long the server may take to answer PING.
	// Default 10s.
	StartTimeout time.Duration
	// Args are extra server arguments, e.g. "--io-threads", "4".
	Args []string
}

// Redis is a redis-server the bench started: listening on a unix socket in
// a scratch directory and on no TCP port (--port 0 turns TCP off; a TCP
// port would have to be guessed free beforehand, since redis-server cannot
// report one it picked, and a guess races with every other process), with
// persistence off (--save ” --appendonly no). Close stops it and removes
// the directory.
//
// A unix socket spares Redis the loopback TCP stack, so it is a stricter
// baseline for kvmesh's network path than Redis over TCP.
type Redis struct {
	socket  string
	version string
	dir     string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
}

// maxRedisValue bounds the bulk replies the client accepts.
const maxRedisValue = 1 << 30

// maxSocketPath is the longest unix socket path Linux accepts (sun_path is
// 108 bytes, NUL included).
const maxSocketPath = 107

// StartRedis starts a redis-server. When the binary is not installed the
// error wraps ErrMissing, which suites report as a skipped peer.
func StartRedis(ctx context.Context, o RedisOptions) (*Redis, error) {
	if o.Binary == "" {
		o.Binary = "redis-server"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 10 * time.Second
	}
	bin, err := exec.LookPath(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("%w: redis: %s not found (install Debian's redis-server): %w", ErrMissing, o.Binary, err)
	}
	dir, err := os.MkdirTemp(o.Dir, "kvmesh-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("bench: redis: %w", err)
	}
	socket := filepath.Join(dir, "redis.sock")
	if abs, err := filepath.Abs(socket); err == nil {
		socket = abs
	}
	if len(socket) > maxSocketPath {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("bench: redis: socket path %s is longer than %d bytes; choose a shorter RedisOptions.Dir", socket, maxSocketPath)
	}
	logPath := filepath.Join(dir, "redis.log")
	args := []string{"--port", "0", "--unixsocket", socket, "--unixsocketperm", "700",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logPath, "--daemonize", "no"}
	cmd := exec.Command(bin, append(args, o.Args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	setDeathSignal(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("bench: redis: start %s: %w", bin, err)
	}
	r := &Redis{socket: socket, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status of a server we stop is not news
		close(r.done)
	}()
	if err := r.waitReady(ctx, o.StartTimeout); err != nil {
		r.Close()
		return nil, fmt.Errorf("bench: redis: %w%s", err, logTail(logPath))
	}
	return r, nil
}

func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return " (log: " + strings.Join(lines[max(0, len(lines)-3):], " | ") + ")"
}

// waitReady waits until the server answers PING, it exits, or timeout.
func (r *Redis) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = r.ping(ctx); last == nil {
			return nil
		}
		select {
		case <-r.done:
			return errors.New("server exited at start")
		case <-ctx.Done():
			return fmt.Errorf("not answering after %v: %w", timeout, last)
		case <-tick.C:
		}
	}
}

func (r *Redis) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := dialRESP(ctx, r.socket, 1<<20)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, _, err := c.command(ctx, nil, nil, "PING"); err != nil {
		return err
	}
	_, info, err := c.command(ctx, nil, nil, "INFO", "server")
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "redis_version:"); ok {
			r.version = v
		}
	}
	return nil
}

// Socket returns the path of the server's unix socket (redis-cli -s and
// redis-benchmark -s take it).
func (r *Redis) Socket() string { return r.socket }

// Version returns the server's redis_version.
func (r *Redis) Version() string { return r.version }

// Close stops the server (SIGTERM, then SIGKILL after 5s), waits for it and
// removes its directory.
func (r *Redis) Close() error {
	select {
	case <-r.done:
	default:
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(5 * time.Second)
		select {
		case <-r.done:
		case <-t.C:
			_ = r.cmd.Process.Kill()
			<-r.done
		}
		t.Stop()
	}
	return os.RemoveAll(r.dir)
}

// Target returns the server as a KVTarget named "redis"; key k is
// "key:" and k in 12 digits, the names redis-benchmark's -r draws, so that
// its GETs read the fill this client wrote.
func (r *Redis) Target() KVTarget { return redisTarget{socket: r.socket} }

type redisTarget struct{ socket string }

func (t redisTarget) Name() string { return "redis" }

// Reset empties the server (FLUSHALL).
func (t redisTarget) Reset(ctx context.Context) error {
	c, err := dialRESP(ctx, t.socket, 1<<20)
	if err != nil {
		return err
	}
	defer c.Close()
	kind, reply, err := c.command(ctx, nil, nil, "FLUSHALL")
	if err != nil {
		return err
	}
	if kind != '+' {
		return fmt.Errorf("%w: FLUSHALL replied %c%s", errRESPProtocol, kind, reply)
	}
	return nil
}

func (t redisTarget) Dial(ctx context.Context) (KVConn, error) {
	c, err := dialRESP(ctx, t.socket, maxRedisValue)
	if err != nil {
		return nil, err
	}
	return &redisConn{c: c}, nil
}

type redisConn struct {
	c   *respConn
	key []byte
}

func (c *redisConn) keyName(k int) string {
	c.key = append(c.key[:0], "key:000000000000"...)
	d := strconv.AppendInt(c.key[len(c.key):], int64(k), 10)
	if len(d) < 12 {
		copy(c.key[len(c.key)-len(d):], d)
	} else {
		c.key = append(c.key[:4], d...)
	}
	return string(c.key)
}

func (c *redisConn) Set(ctx context.Context, key int, value []byte) error {
	kind, reply, err := c.c.command(ctx, nil, value, "SET", c.keyName(key))
	if err != nil {
		return err
	}
	if kind != '+' || string(reply) != "OK" {
		return fmt.Errorf("%w: SET replied %c%s", errRESPProtocol, kind, reply)
	}
	return nil
}

func (c *redisConn) Get(ctx context.Context, key int, dst []byte) ([]byte, error) {
	kind, v, err := c.c.command(ctx, dst, nil, "GET", c.keyName(key))
	if err != nil {
		return dst, err
	}
	if kind != '$' {
		return dst, fmt.Errorf("%w: GET replied type %c", errRESPProtocol, kind)
	}
	return v, nil
}

func (c *redisConn) Close() error { return c.c.Close() }

// MeasureRedis starts Redis, runs KVLoad for every load in loads (SET then
// GET rows, in order) and stops it. It returns the server version with the
// rows; without redis-server the error wraps ErrMissing.
func MeasureRedis(ctx context.Context, o RedisOptions, loads []KVLoadOptions, bar Bar) (string, []KVResult, error) {
	r, err := StartRedis(ctx, o)
	if err != nil {
		return "", nil, err
	}
	defer r.Close()
	if bar == nil {
		bar = nopBar{}
	}
	var rows []KVResult
	for _, l := range loads {
		bar.Describe(fmt.Sprintf("redis: %s values, %d clients", formatBytes(float64(l.ValueBytes)), l.Concurrency))
		set, get, err := KVLoad(ctx, r.Target(), l)
		if err != nil {
			return r.Version(), rows, err
		}
		rows = append(rows, set, get)
		bar.Add(1)
	}
	return r.Version(), rows, nil
}
