// Command benchgo is the Go side of clients/python/bench.py: it reads one
// prompt's blocks from a node with package client, each into its place in a
// preallocated buffer, as the Python client's get(out=...) does, and prints
// the rate as JSON. The Python script puts the blocks and starts the node.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7600", "the node's gRPC address")
	transport := flag.String("transport", client.TransportAuto, "auto (shared memory on this host), tcp or grpc")
	model := flag.String("model", "py/bench", "namespace model")
	layers := flag.Int("layers", 1, "namespace layers")
	blocks := flag.Int("blocks", 64, "blocks in the prompt")
	first := flag.Uint("first-token", 1, "the prompt is first-token, first-token+1, ...")
	dur := flag.Duration("duration", 2*time.Second, "how long to measure")
	flag.Parse()

	ns := prefixhash.Namespace{Model: *model, DType: prefixhash.Float16, BlockTokens: 16, Layers: *layers, KVHeads: 8, HeadDim: 128}
	tokens := make([]uint32, *blocks*ns.BlockTokens)
	for i := range tokens {
		tokens[i] = uint32(*first) + uint32(i)
	}
	ctx := context.Background()
	c, err := client.Dial(*addr, client.Options{Transport: *transport, MaxRetries: -1})
	if err != nil {
		fail(err)
	}
	defer c.Close()
	sns, err := c.Namespace(ctx, ns)
	if err != nil {
		fail(err)
	}
	keys := prefixhash.Keys(sns, tokens)
	size := ns.BlockBytes()
	// One buffer for the prompt, as the Python client's get fills one
	// tensor: block i lands in its i-th slice.
	dst := make([]byte, len(keys)*size)
	bufs := make([][]byte, len(keys))
	for i := range bufs {
		bufs[i] = dst[i*size : (i+1)*size]
	}
	get := func() int {
		blocks, err := c.Get(ctx, sns, client.Prompt{Keys: keys}, client.Into(bufs))
		if err != nil {
			fail(err)
		}
		n := 0
		for _, b := range blocks {
			if b.Found {
				n++
			}
		}
		return n
	}
	if n := get(); n != len(keys) {
		fail(fmt.Errorf("%d of %d blocks cached", n, len(keys)))
	}
	start, iters := time.Now(), 0
	for time.Since(start) < *dur {
		get()
		iters++
	}
	el := time.Since(start).Seconds()
	json.NewEncoder(os.Stdout).Encode(map[string]any{"transport": *transport, "block_bytes": size, "blocks": len(keys),
		"iters": iters, "seconds": el, "gb_per_s": float64(iters*len(keys)*size) / el / 1e9})
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchgo:", err)
	os.Exit(1)
}
