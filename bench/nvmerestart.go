package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/client"
)

// The nvme suite's warm-restart row: a node whose DRAM holds the data set
// is stopped with SIGTERM, writes its DRAM to NVMe on the way out
// (`kvmesh serve --spill-on-stop`), and is started again on its data dir;
// the row gives the write's speed, from the node's own log, beside fio's
// sequential write on the same file system, and how much of the data set a
// lookup finds after the restart.

// nvmeRestartPrompt is the blocks of each prompt the row puts.
const nvmeRestartPrompt = 16

// warmRestart is what the row measured.
type warmRestart struct {
	GBps  float64 // the spill's bytes over its time, as the node logged them
	Found float64 // blocks a lookup finds after the restart, of those put
	Bytes int64   // what the spill wrote
}

// nvmeWarmRestart starts one node in o.Dir with DRAM for o.DataBytes of
// 1 MiB blocks, puts them in prompts of 16 blocks, restarts it gracefully
// and looks every prompt up. Against --addr it returns an error wrapping
// ErrMissing: the row restarts a node it started.
func nvmeWarmRestart(ctx context.Context, env *Env, o NVMeOptions) (warmRestart, error) {
	var wr warmRestart
	switch {
	case len(env.Addrs) > 0:
		return wr, fmt.Errorf("%w: the warm-restart row restarts a node it started, not one given with --addr", ErrMissing)
	case env.Binary == "":
		return wr, fmt.Errorf("%w: run it as `kvmesh bench`", ErrNoBinary)
	}
	const segment = 64 << 20
	ds, err := StartDaemons(ctx, DaemonOptions{Binary: env.Binary, Dir: o.Dir,
		DRAMBytes: o.DataBytes + o.DataBytes/4 + segment, NVMeBytes: (o.DataBytes + o.DataBytes/4 + 2*segment) &^ (segment - 1),
		MaxBlockBytes: 2 << 20, Args: []string{"--log-level", "info", "--log-format", "json"}})
	if err != nil {
		return wr, err
	}
	defer ds.Close()
	ns, err := KVNamespace(nvmeSpillValue)
	if err != nil {
		return wr, err
	}
	ns.Model = "kvmesh/bench-warm-restart"
	prompts := max(1, int(o.DataBytes/(nvmeRestartPrompt*nvmeSpillValue)))
	tokens := make([][]uint32, prompts)
	payloads := make([][]byte, nvmeRestartPrompt)
	for i := range payloads {
		payloads[i] = make([]byte, nvmeSpillValue)
		for j := range payloads[i] {
			payloads[i][j] = byte(i*31 + j*7 + j>>10)
		}
	}
	c, err := client.Dial(ds.List()[0].GRPCAddr, client.Options{MaxRetries: -1})
	if err != nil {
		return wr, fmt.Errorf("bench: nvme: warm restart: %w", err)
	}
	for p := range prompts {
		tokens[p] = make([]uint32, nvmeRestartPrompt*ns.BlockTokens)
		for j := range tokens[p] {
			tokens[p][j] = uint32(p*len(tokens[p]) + j)
		}
		if _, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens[p]}, payloads); err != nil {
			c.Close()
			return wr, fmt.Errorf("bench: nvme: warm restart: put prompt %d: %w", p, err)
		}
	}
	c.Close()

	log, err := ds.Restart(ctx, 0, time.Minute)
	if err != nil {
		return wr, err
	}
	spilled, took, err := spillFromLog(log)
	if err != nil {
		return wr, err
	}
	wr.Bytes, wr.GBps = spilled, float64(spilled)/took.Seconds()/1e9
	c, err = client.Dial(ds.List()[0].GRPCAddr, client.Options{MaxRetries: -1})
	if err != nil {
		return wr, fmt.Errorf("bench: nvme: warm restart: %w", err)
	}
	defer c.Close()
	found := 0
	for p := range prompts {
		l, err := c.Lookup(ctx, ns, client.Prompt{Tokens: tokens[p]})
		if err != nil {
			return wr, fmt.Errorf("bench: nvme: warm restart: lookup prompt %d: %w", p, err)
		}
		found += l.CachedBlocks
	}
	wr.Found = float64(found) / float64(prompts*nvmeRestartPrompt)
	return wr, nil
}

// errNoSpill means a stopped node's log has no line saying what it wrote
// from DRAM to NVMe.
var errNoSpill = errors.New("bench: nvme: warm restart: the node's log says nothing was written from DRAM to NVMe")

// spillFromLog finds the line a node logs (as JSON) once it has written
// DRAM to NVMe, and returns its bytes and time.
func spillFromLog(log string) (int64, time.Duration, error) {
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg   string `json:"msg"`
			Bytes int64  `json:"bytes"`
			Took  int64  `json:"took"` // slog writes a Duration as nanoseconds
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || !strings.HasPrefix(line.Msg, "wrote DRAM to NVMe") {
			continue
		}
		if line.Bytes <= 0 || line.Took <= 0 {
			return 0, 0, fmt.Errorf("%w: %s", errNoSpill, sc.Text())
		}
		return line.Bytes, time.Duration(line.Took), nil
	}
	return 0, 0, errNoSpill
}
