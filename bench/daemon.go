package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node/ready"
)

// ErrNoBinary means a suite that starts kvmesh nodes was not told where
// the kvmesh binary is (Env.Binary) nor given an existing cluster
// (Env.Addrs).
var ErrNoBinary = errors.New("bench: no kvmesh binary to start nodes with")

// DaemonOptions configure StartDaemons.
type DaemonOptions struct {
	// Binary is the kvmesh binary. Required.
	Binary string
	// Dir is where each node's data directory is made. Required.
	Dir string
	// Nodes is the number of `kvmesh serve` processes. Default 1.
	Nodes int
	// Join joins the nodes into one cluster: every node after the first
	// joins the first's gossip address, and StartDaemons waits until every
	// node sees them all. Default false: independent nodes.
	Join bool
	// DRAMBytes is each node's DRAM tier. Default 1 GiB.
	DRAMBytes int64
	// NVMeBytes is each node's NVMe tier. Default 64 MiB, the smallest a
	// node takes (one segment), so that a benchmark measures DRAM unless it
	// asks for more.
	NVMeBytes int64
	// MaxBlockBytes is the largest block a node accepts. Default: the
	// node's default (16 MiB).
	MaxBlockBytes int64
	// MaxBlocks bounds the blocks each node caches in DRAM and NVMe
	// together (`kvmesh serve --max-blocks`). Default 0: the node's
	// default, its tiers' capacities over 4 KiB.
	MaxBlocks int
	// Eviction is each node's eviction policy (`kvmesh serve --eviction`).
	// Default "": the node's default.
	Eviction string
	// NVMeAdmission is each node's `kvmesh serve --nvme-admission`.
	// Default "": the node's default (all).
	NVMeAdmission string
	// Args are more `kvmesh serve` arguments.
	Args []string
	// StartTimeout bounds the start of all the nodes, cluster formation
	// included. Default 60s (a race-enabled binary starts slowly).
	StartTimeout time.Duration
}

// EnsureDefaults fills zero fields with their defaults.
func (o *DaemonOptions) EnsureDefaults() {
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.DRAMBytes == 0 {
		o.DRAMBytes = 1 << 30
	}
	if o.NVMeBytes == 0 {
		o.NVMeBytes = 64 << 20
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = time.Minute
	}
}

// Validate names the first field that is out of range.
func (o *DaemonOptions) Validate() error {
	switch {
	case o.Binary == "":
		return fmt.Errorf("%w: DaemonOptions.Binary is empty", ErrNoBinary)
	case o.Dir == "":
		return errors.New("bench: daemons: dir is required")
	case o.Nodes < 1 || o.Nodes > 64:
		return fmt.Errorf("bench: daemons: nodes %d is outside 1..64", o.Nodes)
	case o.DRAMBytes < 1<<20 || o.NVMeBytes < 1<<20:
		return fmt.Errorf("bench: daemons: dram %d and nvme %d bytes must be at least 1 MiB", o.DRAMBytes, o.NVMeBytes)
	case o.StartTimeout <= 0:
		return fmt.Errorf("bench: daemons: start timeout %v must be positive", o.StartTimeout)
	}
	return nil
}

// Daemon is one `kvmesh serve` process the bench started, with its own data
// directory and every address on port 0 of 127.0.0.1: the addresses are
// those its ready file (--ready-file) reported.
type Daemon struct {
	ID                                       string
	GRPCAddr, HTTPAddr, DataAddr, GossipAddr string
	DataDir                                  string

	readyFile string
	cmd       *exec.Cmd
	stderr    *tailBuffer
	done      chan struct{} // closed when the process has exited
	exitErr   error         // set before done is closed
}

// Pid returns the node's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Daemons are the nodes of one StartDaemons call. Close stops them.
type Daemons struct {
	list []*Daemon
	dir  string
	opts DaemonOptions
}

// StartDaemons starts o.Nodes `kvmesh serve` processes and returns when
// every one answers on gRPC (and, with Join, sees all the others as
// members). With Join, the first node starts alone and the others once its
// ready file names its gossip address. On error, the processes already
// started are stopped, and the error carries the last lines a failed node
// printed.
func StartDaemons(ctx context.Context, o DaemonOptions) (*Daemons, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(o.Dir, "kvmesh-bench-nodes-")
	if err != nil {
		return nil, fmt.Errorf("bench: daemons: %w", err)
	}
	ds := &Daemons{dir: dir, opts: o}
	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()
	fail := func(err error) (*Daemons, error) {
		ds.Close()
		return nil, err
	}
	seed := ""
	for i := range o.Nodes {
		d, err := startDaemon(o, dir, i, seed)
		if err != nil {
			return fail(err)
		}
		ds.list = append(ds.list, d)
		if i == 0 && o.Join && o.Nodes > 1 {
			if err := d.waitReadyFile(ctx); err != nil {
				return fail(err)
			}
			seed = d.GossipAddr
		}
	}
	for _, d := range ds.list {
		if err := d.waitReadyFile(ctx); err != nil {
			return fail(err)
		}
	}
	if err := ds.waitReady(ctx, o.Join, o.Nodes); err != nil {
		return fail(err)
	}
	return ds, nil
}

// startDaemon starts node i, joining seed (a gossip address) unless it is
// empty. Every address is port 0: the node picks its ports, and
// waitReadyFile reads them back.
func startDaemon(o DaemonOptions, dir string, i int, seed string) (*Daemon, error) {
	d := &Daemon{
		ID:        fmt.Sprintf("bench-node-%d", i),
		DataDir:   filepath.Join(dir, fmt.Sprintf("node%d", i)),
		readyFile: filepath.Join(dir, fmt.Sprintf("node%d.ready", i)),
		stderr:    &tailBuffer{max: 8 << 10},
		done:      make(chan struct{}),
	}
	args := serveArgs(o, d, seed)
	d.cmd = exec.Command(o.Binary, args...)
	// A config file or KVMESH_* variable of the user's must not reach the
	// bench's nodes.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVMESH_") {
			d.cmd.Env = append(d.cmd.Env, kv)
		}
	}
	d.cmd.Stderr = d.stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{}
	setDeathSignal(d.cmd.SysProcAttr)
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: daemons: start %s: %w", o.Binary, err)
	}
	go func() {
		d.exitErr = d.cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// waitReadyFile waits for the node's ready file and takes its addresses
// from it; it fails as soon as the node exits, or when ctx ends.
func (d *Daemon) waitReadyFile(ctx context.Context) error {
	info, err := ready.Wait(ctx, d.readyFile, d.done)
	if errors.Is(err, ready.ErrExited) {
		<-d.done
		return fmt.Errorf("bench: kvmesh serve (%s) exited at start (%v): %s", d.ID, d.exitErr, d.stderr.lastLines(3))
	}
	if err != nil {
		return fmt.Errorf("bench: kvmesh serve (%s) not ready: %w: %s", d.ID, err, d.stderr.lastLines(3))
	}
	d.GRPCAddr, d.HTTPAddr, d.DataAddr, d.GossipAddr = info.GRPCAddr, info.HTTPAddr, info.DataAddr, info.GossipAddr
	return nil
}

// waitReady polls every node until it answers Stats (and, when joined,
// lists nodes alive members); it fails as soon as one node exits, or when
// ctx ends.
func (ds *Daemons) waitReady(ctx context.Context, joined bool, nodes int) error {
	clients := make([]*client.Client, len(ds.list))
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i, d := range ds.list {
		c, err := client.Dial(d.GRPCAddr, client.Options{MaxRetries: -1, Timeout: time.Second})
		if err != nil {
			return fmt.Errorf("bench: daemon %s: %w", d.ID, err)
		}
		clients[i] = c
	}
	ready := make([]bool, len(ds.list))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		waiting := 0
		for i, d := range ds.list {
			select {
			case <-d.done:
				return fmt.Errorf("bench: kvmesh serve (%s) exited at start (%v): %s", d.ID, d.exitErr, d.stderr.lastLines(3))
			default:
			}
			if ready[i] {
				continue
			}
			if err := d.ready(ctx, clients[i], joined, nodes); err != nil {
				last = fmt.Errorf("%s: %w", d.ID, err)
				waiting++
				continue
			}
			ready[i] = true
		}
		if waiting == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: kvmesh serve not ready: %w (last: %w)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

func (d *Daemon) ready(ctx context.Context, c *client.Client, joined bool, nodes int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := c.Stats(ctx); err != nil {
		return err
	}
	if !joined || nodes == 1 {
		return nil
	}
	m, err := c.Members(ctx)
	if err != nil {
		return err
	}
	alive := 0
	for _, mb := range m.Members {
		if mb.State == "alive" {
			alive++
		}
	}
	if alive < nodes {
		return fmt.Errorf("%d of %d members alive", alive, nodes)
	}
	return nil
}

// Restart stops node i gracefully (SIGTERM; after timeout, SIGKILL and an
// error), starts it again on its data dir, under its id and options, and
// waits until it answers. It returns what the node printed while it
// stopped (the last 8 KiB of its stderr).
func (ds *Daemons) Restart(ctx context.Context, i int, timeout time.Duration) (string, error) {
	d := ds.list[i]
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-d.done:
	case <-t.C:
		_ = d.cmd.Process.Kill()
		<-d.done
		return d.stderr.String(), fmt.Errorf("bench: kvmesh serve (%s) still running %v after SIGTERM", d.ID, timeout)
	}
	log := d.stderr.String()
	if d.exitErr != nil {
		return log, fmt.Errorf("bench: kvmesh serve (%s) stopped with %v: %s", d.ID, d.exitErr, d.stderr.lastLines(3))
	}
	seed := ""
	if ds.opts.Join && i > 0 {
		seed = ds.list[0].GossipAddr
	}
	nd, err := startDaemon(ds.opts, ds.dir, i, seed)
	if err != nil {
		return log, err
	}
	ds.list[i] = nd
	ctx, cancel := context.WithTimeout(ctx, ds.opts.StartTimeout)
	defer cancel()
	if err := nd.waitReadyFile(ctx); err != nil {
		return log, err
	}
	sub := &Daemons{list: []*Daemon{nd}}
	return log, sub.waitReady(ctx, false, 1)
}

// List returns the nodes in start order.
func (ds *Daemons) List() []*Daemon { return ds.list }

// Addrs returns the nodes' gRPC addresses in start order.
func (ds *Daemons) Addrs() []string {
	out := make([]string, len(ds.list))
	for i, d := range ds.list {
		out[i] = d.GRPCAddr
	}
	return out
}

// Close stops every node (SIGTERM, then SIGKILL after 10s), waits for them
// and removes their data directories. It returns the first error of a node
// that did not exit cleanly.
func (ds *Daemons) Close() error {
	for _, d := range ds.list {
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	var errs []error
	for _, d := range ds.list {
		t := time.NewTimer(10 * time.Second)
		select {
		case <-d.done:
		case <-t.C:
			_ = d.cmd.Process.Kill()
			<-d.done
			errs = append(errs, fmt.Errorf("bench: kvmesh serve (%s) still running 10s after SIGTERM", d.ID))
		}
		t.Stop()
	}
	ds.list = nil
	if ds.dir != "" {
		errs = append(errs, os.RemoveAll(ds.dir))
	}
	return errors.Join(errs...)
}

// tailBuffer keeps the last max bytes written to it: a node's stderr, for
// the error that says why it failed.
type tailBuffer struct {
	max int
	mu  struct {
		sync.Mutex
		b []byte
	}
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mu.b = append(t.mu.b, p...)
	if over := len(t.mu.b) - t.max; over > 0 {
		t.mu.b = append(t.mu.b[:0], t.mu.b[over:]...)
	}
	return len(p), nil
}

// String returns what the buffer kept.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.mu.b)
}

// lastLines returns the last n lines written, joined by " | ".
func (t *tailBuffer) lastLines(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return firstLines(lastN(string(t.mu.b), n), n)
}

func lastN(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// serveArgs returns the `kvmesh serve` arguments of node d.
func serveArgs(o DaemonOptions, d *Daemon, seed string) []string {
	const port0 = "127.0.0.1:0"
	args := []string{"serve", "--node-id", d.ID, "--data-dir", d.DataDir,
		"--grpc-addr", port0, "--http-addr", port0, "--data-addr", port0, "--gossip-addr", port0, "--ready-file", d.readyFile,
		"--dram", strconv.FormatInt(o.DRAMBytes, 10), "--nvme", strconv.FormatInt(o.NVMeBytes, 10),
		"--log-level", "warn"}
	if o.MaxBlockBytes > 0 {
		args = append(args, "--max-block-bytes", strconv.FormatInt(o.MaxBlockBytes, 10))
	}
	if o.MaxBlocks > 0 {
		args = append(args, "--max-blocks", strconv.Itoa(o.MaxBlocks))
	}
	if o.Eviction != "" {
		args = append(args, "--eviction", o.Eviction)
	}
	if o.NVMeAdmission != "" {
		args = append(args, "--nvme-admission", o.NVMeAdmission)
	}
	if seed != "" {
		args = append(args, "--join", seed)
	}
	return append(args, o.Args...)
}
