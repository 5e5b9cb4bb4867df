package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// The examples run against a real node in this process (startNode), on a
// port the system picks; a program would dial its kvmesh serve instead.

// ns is the examples' namespace: blocks of 16 tokens of a small model, 4 KiB
// of payload each.
var ns = prefixhash.Namespace{Model: "example/tiny", DType: prefixhash.Float16, BlockTokens: 16,
	Layers: 2, KVHeads: 2, HeadDim: 16}

// startNode starts a node with small tiers (16 MiB of DRAM, 64 MiB of NVMe) in a temporary directory
// and returns its gRPC address and how to stop it.
func startNode() (addr string, stop func()) {
	dir, err := os.MkdirTemp("", "kvmesh-example")
	if err != nil {
		log.Fatal(err)
	}
	n, err := node.Open(node.Options{
		NodeID:  "example",
		DataDir: dir,
		Listen:  node.ListenOptions{GRPCAddr: "127.0.0.1:0"},
		Tiers:   node.TierOptions{DRAMBytes: 16 << 20, NVMeBytes: 64 << 20},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx) }()
	return n.GRPCAddr(), func() {
		cancel()
		if err := <-done; err != nil {
			log.Fatal(err)
		}
		os.RemoveAll(dir)
	}
}

// prompt returns a prompt of 40 tokens (2 full blocks and a tail) and the
// payloads of its full blocks, as an engine would have computed them.
func prompt() ([]uint32, [][]byte) {
	tokens := make([]uint32, 40)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	payloads := make([][]byte, 2)
	for i := range payloads {
		payloads[i] = make([]byte, ns.BlockBytes())
		for j := range payloads[i] {
			payloads[i][j] = byte(i + j)
		}
	}
	return tokens, payloads
}

// dial starts a node and returns a client of it (as ExampleDial does), and
// how to close both.
func dial() (*client.Client, func()) {
	addr, stop := startNode()
	c, err := client.Dial(addr, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	return c, func() {
		c.Close()
		stop()
	}
}

// cachedPrompt is dial with prompt's blocks put in the cache.
func cachedPrompt() (*client.Client, func()) {
	c, stop := dial()
	tokens, payloads := prompt()
	if _, err := c.Put(context.Background(), ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
		log.Fatal(err)
	}
	return c, stop
}

func ExampleDial() {
	addr, stop := startNode()
	defer stop()

	c, err := client.Dial(addr, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stats(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("connected to", st.NodeID)
	// Output: connected to example
}

func ExampleClient_Put() {
	c, stop := dial()
	defer stop()

	tokens, payloads := prompt()
	keys, err := c.Put(context.Background(), ns, client.Prompt{Tokens: tokens}, payloads)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(keys), "blocks stored; the first is", keys[0] == prefixhash.Keys(ns, tokens)[0])
	// Output: 2 blocks stored; the first is true
}

// Two tensor-parallel ranks of an instance each put their half of every
// block's KV heads; the blocks count as cached once both halves are there,
// and a single-GPU worker reads them whole.
func ExampleClient_Put_rank() {
	c, stop := dial()
	defer stop()
	ctx := context.Background()
	tokens, payloads := prompt() // the whole model's KV, as one GPU computes it

	l := block.LayoutOf(ns)
	for rank := range 2 {
		r := client.Rank{TPRank: rank, TPSize: 2}
		part, err := r.Part(ns) // its KV heads, in every layer
		if err != nil {
			log.Fatal(err)
		}
		// What the rank holds of each block: its heads of each layer.
		mine := make([][]byte, len(payloads))
		for i, p := range payloads {
			mine[i] = l.ExtractPart(nil, p, ns.BlockTokens, part)
		}
		if _, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens, Rank: r}, mine); err != nil {
			log.Fatal(err)
		}
		lk, err := c.Lookup(ctx, ns, client.Prompt{Tokens: tokens})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("rank %d put %s: %d blocks cached\n", rank, part, lk.CachedBlocks)
	}

	blocks, err := c.Get(ctx, ns, client.Prompt{Tokens: tokens}) // the zero Rank: the whole block
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range blocks {
		fmt.Println("block", b.Index, "whole:", bytes.Equal(b.Payload, payloads[b.Index]))
	}
	// Output:
	// rank 0 put layers [0,2) heads [0,1): 0 blocks cached
	// rank 1 put layers [0,2) heads [1,2): 2 blocks cached
	// block 0 whole: true
	// block 1 whole: true
}

func ExampleClient_Lookup() {
	c, stop := dial()
	defer stop()
	ctx := context.Background()
	tokens, payloads := prompt()
	if _, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads[:1]); err != nil {
		log.Fatal(err)
	}

	l, err := c.Lookup(ctx, ns, client.Prompt{Tokens: tokens})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d of %d tokens cached, on %s\n", l.CachedTokens, l.PromptTokens, l.Runs[0].NodeID)
	// Output: 16 of 40 tokens cached, on example
}

// A conversation's next turn continues the chain of the turns before it:
// only the new tokens are hashed, and their blocks are placed and counted
// as the whole prompt's.
func ExampleClient_Lookup_parent() {
	c, stop := cachedPrompt()
	defer stop()
	ctx := context.Background()
	tokens, _ := prompt()

	salted, err := c.Namespace(ctx, ns) // the namespace as the node keys it for this client
	if err != nil {
		log.Fatal(err)
	}
	turn1 := prefixhash.NewChain(salted)
	turn1.Extend(tokens[:16]) // the first turn: block 0
	l, err := c.Lookup(ctx, ns, client.Prompt{Tokens: tokens[16:], Parent: turn1})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("after the first turn: %d of %d blocks cached; the next is %v\n", l.CachedBlocks, l.PromptBlocks, l.Keys[0] == prefixhash.Keys(ns, tokens)[1])
	// Output: after the first turn: 1 of 1 blocks cached; the next is true
}

func ExampleClient_Get() {
	c, stop := cachedPrompt()
	defer stop()
	ctx := context.Background()
	tokens, payloads := prompt()

	blocks, err := c.Get(ctx, ns, client.Prompt{Tokens: tokens})
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range blocks {
		fmt.Println("block", b.Index, bytes.Equal(b.Payload, payloads[b.Index]))
	}
	// Output:
	// block 0 true
	// block 1 true
}

func ExampleClient_Get_into() {
	c, stop := cachedPrompt()
	defer stop()
	ctx := context.Background()
	tokens, payloads := prompt()

	// The worker's own buffers (its KV cache pages, say), reused for every
	// prompt: one per block it can take.
	dst := [][]byte{make([]byte, ns.BlockBytes()), make([]byte, ns.BlockBytes()), make([]byte, ns.BlockBytes())}
	blocks, err := c.Get(ctx, ns, client.Prompt{Tokens: tokens}, client.Into(dst))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(blocks), "blocks read;", bytes.Equal(dst[1], payloads[1]))
	// Output: 2 blocks read; true
}

// Blocks by key (here the ones a Lookup found, and one that is not cached):
// one Block per key, a miss with Found false.
func ExampleClient_Get_keys() {
	c, stop := cachedPrompt()
	defer stop()
	ctx := context.Background()
	tokens, _ := prompt()

	l, err := c.Lookup(ctx, ns, client.Prompt{Tokens: tokens})
	if err != nil {
		log.Fatal(err)
	}
	keys := append(l.Keys[:l.CachedBlocks:l.CachedBlocks], prefixhash.Key{1})
	blocks, err := c.Get(ctx, ns, client.Prompt{Keys: keys})
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range blocks {
		fmt.Println("key", b.Index, "found:", b.Found)
	}
	// Output:
	// key 0 found: true
	// key 1 found: true
	// key 2 found: false
}

// Each streams the blocks to a callback as they arrive: a read of many
// blocks holds one at a time.
func ExampleClient_Get_each() {
	c, stop := cachedPrompt()
	defer stop()
	ctx := context.Background()
	tokens, payloads := prompt()

	_, err := c.Get(ctx, ns, client.Prompt{Tokens: tokens}, client.Each(func(b client.Block) error {
		// b.Payload is valid during the call only.
		fmt.Println("block", b.Index, bytes.Equal(b.Payload, payloads[b.Index]))
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// block 0 true
	// block 1 true
}

// View reads in place: on the node's host the payloads are the node's own
// memory, held for the caller until Release.
func ExampleClient_View() {
	c, stop := cachedPrompt()
	defer stop()
	ctx := context.Background()
	tokens, payloads := prompt()

	v, err := c.View(ctx, ns, client.Prompt{Tokens: tokens})
	if err != nil {
		log.Fatal(err)
	}
	defer v.Release()
	for _, b := range v.Blocks {
		fmt.Println("block", b.Index, bytes.Equal(b.Payload, payloads[b.Index]))
	}
	// Output:
	// block 0 true
	// block 1 true
}

func ExampleClient_Stats() {
	c, stop := cachedPrompt()
	defer stop()

	st, err := c.Stats(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, x := range st.Namespaces {
		fmt.Printf("namespace %v: %d blocks, %d tokens\n", x.Digest == ns.Digest(), x.Blocks, x.Tokens)
	}
	// Output: namespace true: 2 blocks, 32 tokens
}

// A refusal matches a sentinel error, and errors.As reaches the reason and
// the details the node sent.
func ExampleError() {
	c, stop := dial()
	defer stop()
	ctx := context.Background()
	if _, err := c.SetQuota(ctx, ns, client.Quota{DRAMBytes: 1024, NVMeBytes: 1024}); err != nil {
		log.Fatal(err)
	}
	tokens, payloads := prompt()

	_, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads)
	fmt.Println("over the quota:", errors.Is(err, client.ErrQuota))
	var e *client.Error
	if errors.As(err, &e) {
		fmt.Println(e.Code, e.Reason, e.Quotas[0].Subject == fmt.Sprintf("namespace:%016x", ns.Digest()))
	}
	// Output:
	// over the quota: true
	// ResourceExhausted QUOTA_EXCEEDED true
}
