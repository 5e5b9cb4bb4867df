package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// The nvme suite's end-to-end row: what a client gets of prompts whose
// blocks live mostly on a node's NVMe tier, through the whole hit path
// (client, data plane, store, tier), next to the tier alone and fio.

// nvmePromptBlocks is the blocks of each prompt the end-to-end row reads.
const nvmePromptBlocks = 64

// nvmeE2EDRAM is the DRAM tier of the node the end-to-end row starts: the
// smallest a node takes, so that most of the data set is on NVMe.
const nvmeE2EDRAM = 64 << 20

// nvmeEndToEnd starts one node with a 64 MiB DRAM tier and an NVMe tier in
// the work directory, puts prompts of 64 blocks of 256 KiB through the Go
// client until o.DataBytes are stored (untimed), then for o.ReadTime gets
// random whole prompts, one at a time, checking every byte of every block,
// and returns the payload GB/s. Against a cluster given with --addr it
// returns an error wrapping ErrMissing: the row needs a node whose tiers it
// sized.
func nvmeEndToEnd(ctx context.Context, env *Env, o NVMeOptions) (float64, error) {
	if len(env.Addrs) > 0 {
		return 0, fmt.Errorf("%w: the end-to-end row starts its own node (small DRAM, the data set on NVMe), not one given with --addr", ErrMissing)
	}
	// NVMe holds the data set twice over: hits promote blocks to DRAM and
	// DRAM pressure demotes others, each leaving a dead copy in an NVMe
	// segment, and with the tier near full a reclaim of the oldest segment
	// drops the blocks in it that were not hit since (a cache's right, but
	// this row measures reads of blocks that are there, and fails on a
	// miss).
	addrs, stop, err := nodeAddrs(ctx, env, DaemonOptions{DRAMBytes: nvmeE2EDRAM,
		NVMeBytes: (2*o.DataBytes + 2*nvmeE2EDRAM + 64<<20 - 1) &^ (64<<20 - 1)})
	if err != nil {
		return 0, err
	}
	defer stop()
	return nvmeEndToEndAt(ctx, addrs[0], o)
}

// nvmeEndToEndAt is nvmeEndToEnd's load against the node at addr.
func nvmeEndToEndAt(ctx context.Context, addr string, o NVMeOptions) (float64, error) {
	c, err := client.Dial(addr, client.Options{MaxRetries: -1})
	if err != nil {
		return 0, fmt.Errorf("bench: nvme: end to end: %w", err)
	}
	defer c.Close()
	ns, err := KVNamespace(nvmeReadValue)
	if err != nil {
		return 0, err
	}
	ns.Model = "kvmesh/bench-nvme-e2e"
	prompts := max(2, int(o.DataBytes/int64(nvmePromptBlocks*nvmeReadValue)))
	pattern := make([]byte, nvmeReadValue)
	for i := range pattern {
		pattern[i] = byte(i*13 + i>>11)
	}
	payloads := make([][]byte, nvmePromptBlocks)
	for i := range payloads {
		payloads[i] = bytes.Clone(pattern)
	}
	tokens := make([]uint32, nvmePromptBlocks*ns.BlockTokens)
	keys := make([][]prefixhash.Key, prompts)
	for p := range prompts {
		for j := range tokens {
			tokens[j] = uint32(p*len(tokens) + j)
		}
		for i, pl := range payloads {
			binary.LittleEndian.PutUint64(pl, uint64(p)<<16|uint64(i))
		}
		if keys[p], err = c.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
			return 0, fmt.Errorf("bench: nvme: end to end: put prompt %d: %w", p, err)
		}
		if len(keys[p]) != nvmePromptBlocks {
			return 0, fmt.Errorf("bench: nvme: end to end: put prompt %d stored %d of %d blocks", p, len(keys[p]), nvmePromptBlocks)
		}
	}
	rng := rand.New(rand.NewPCG(7, 0x65326500))
	var moved int64
	deadline := time.Now().Add(o.ReadTime)
	start := time.Now()
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		p := rng.IntN(prompts)
		got := 0
		_, err := c.Get(ctx, ns, client.Prompt{Keys: keys[p]}, client.Each(func(b client.Block) error {
			switch {
			case !b.Found:
				return fmt.Errorf("block %d missing", b.Index)
			case len(b.Payload) != nvmeReadValue || binary.LittleEndian.Uint64(b.Payload) != uint64(p)<<16|uint64(b.Index) ||
				!bytes.Equal(b.Payload[8:], pattern[8:]):
				return errNVMeBytes
			}
			got++
			return nil
		}))
		if err == nil && got != nvmePromptBlocks {
			err = fmt.Errorf("%d of %d blocks delivered", got, nvmePromptBlocks)
		}
		if err != nil {
			return 0, fmt.Errorf("bench: nvme: end to end: get prompt %d: %w", p, err)
		}
		moved += int64(got) * nvmeReadValue
	}
	return float64(moved) / time.Since(start).Seconds() / 1e9, nil
}

// errNVMeBytes means a block came back with bytes other than those put.
var errNVMeBytes = errors.New("a block came back with other bytes than were put")
