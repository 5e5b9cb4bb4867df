package node

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// BenchmarkClientPut and BenchmarkClientGet time one client.Put (a new
// block: never a no-op) and one client.GetKeys of a block at a time, over
// the client's TCP data plane to an in-process node (the path `kvmesh bench
// store` measures as kvmesh-tcp, without the process boundary), so that a
// CPU profile shows both sides of an op:
//
//	go test -run '^$' -bench 'Client(Put|Get)$' -benchmem -count 5 ./node/
//	go test -run '^$' -bench 'ClientPut$/size=64KiB' -cpuprofile cpu.out ./node/
func BenchmarkClientPut(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) { benchClientPut(b, size.n, tcpBenchClient(b)) })
	}
	// The same through the shared-memory data plane: each block written
	// into a slot the node reserved, then committed.
	for _, size := range benchSizes {
		b.Run("shm/size="+size.name, func(b *testing.B) { benchClientPut(b, size.n, shmBenchClient(b)) })
	}
}

// benchClientPut puts new n-byte blocks through c, one Put of one block at
// a time.
func benchClientPut(b *testing.B, n int, c *client.Client) {
	ns := benchNamespace(n)
	ctx := context.Background()
	// The namespace is dropped (untimed) before the DRAM tier fills, so
	// that every Put stores a new block in DRAM.
	perDrop := max(1, (256*MiB)/n)
	payload := make([]byte, n)
	tokens := make([]uint32, ns.BlockTokens)
	payloads := [][]byte{payload}
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := range b.N {
		if i > 0 && i%perDrop == 0 {
			b.StopTimer()
			if _, err := c.DropNamespace(ctx, ns); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		tokens[0], tokens[1] = uint32(i), uint32(i>>32)
		binary.LittleEndian.PutUint64(payload, uint64(i))
		if keys, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil || len(keys) != 1 {
			b.Fatalf("put %d: %d keys, %v", i, len(keys), err)
		}
	}
}

func BenchmarkClientGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) { benchClientGet(b, size.n, tcpBenchClient(b)) })
	}
	// The same through the shared-memory data plane: the node's arena read
	// in place under a lease.
	for _, size := range benchSizes {
		b.Run("shm/size="+size.name, func(b *testing.B) { benchClientGet(b, size.n, shmBenchClient(b)) })
	}
}

// benchClientGet fills the node behind c with 64 MiB of n-byte blocks and
// reads them back one GetKeys of one block at a time, copying each payload
// out in the callback.
func benchClientGet(b *testing.B, n int, c *client.Client) {
	ns := benchNamespace(n)
	ctx := context.Background()
	nkeys := max(2, (64*MiB)/n)
	keys := make([]prefixhash.Key, nkeys)
	payload := make([]byte, n)
	tokens := make([]uint32, ns.BlockTokens)
	for i := range keys {
		tokens[0] = uint32(i)
		binary.LittleEndian.PutUint64(payload, uint64(i))
		got, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens}, [][]byte{payload})
		if err != nil {
			b.Fatal(err)
		}
		keys[i] = got[0]
	}
	dst := make([]byte, 0, n)
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := range b.N {
		k := i % nkeys
		found := false
		err := c.GetKeys(ctx, ns, keys[k:k+1], func(blk client.Block) error {
			found = blk.Found
			dst = append(dst[:0], blk.Payload...)
			return nil
		})
		if err != nil || !found || binary.LittleEndian.Uint64(dst) != uint64(k) {
			b.Fatalf("get %d: found %v, %v", k, found, err)
		}
	}
}

// BenchmarkClientGetPrompt reads a cached prompt of 8 blocks by its tokens,
// as a worker does, with Get (payloads the caller keeps: a new buffer per
// block) and with GetInto (into the caller's buffers, reused), over the TCP
// data plane to an in-process node:
//
//	go test -run '^$' -bench 'ClientGetPrompt' -benchmem -count 5 ./node/
func BenchmarkClientGetPrompt(b *testing.B) {
	for _, size := range benchSizes[:2] {
		ns := benchNamespace(size.n)
		c := tcpBenchClient(b)
		ctx := context.Background()
		const blocks = 8
		tokens := make([]uint32, blocks*ns.BlockTokens)
		for i := range tokens {
			tokens[i] = uint32(i)
		}
		payloads := make([][]byte, blocks)
		dst := make([][]byte, blocks)
		for i := range payloads {
			payloads[i], dst[i] = make([]byte, size.n), make([]byte, size.n)
			binary.LittleEndian.PutUint64(payloads[i], uint64(i))
		}
		if _, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
			b.Fatal(err)
		}
		b.Run("api=Get/size="+size.name, func(b *testing.B) {
			b.SetBytes(int64(blocks * size.n))
			for range b.N {
				got, err := c.Get(ctx, ns, client.Prompt{Tokens: tokens})
				if err != nil || len(got) != blocks || binary.LittleEndian.Uint64(got[blocks-1].Payload) != blocks-1 {
					b.Fatalf("Get: %d blocks, %v", len(got), err)
				}
			}
		})
		b.Run("api=GetInto/size="+size.name, func(b *testing.B) {
			b.SetBytes(int64(blocks * size.n))
			for range b.N {
				got, err := c.GetInto(ctx, ns, tokens, dst)
				if err != nil || got != blocks || binary.LittleEndian.Uint64(dst[blocks-1]) != blocks-1 {
					b.Fatalf("GetInto: %d blocks, %v", got, err)
				}
			}
		})
	}
}

// tcpBenchClient starts a node with 512 MiB of DRAM and returns a client
// of its TCP data plane, closed with b.
func tcpBenchClient(b *testing.B) *client.Client {
	n := startClusterNodes(b, 1, func(_ int, o *Options) {
		o.Tiers.DRAMBytes, o.Limits.MaxBlockBytes, o.Listen.ShmSocket = 512*MiB, 8*MiB, ShmOff
	})[0]
	return benchClient(b, n, client.TransportTCP)
}

// shmBenchClient is tcpBenchClient with the node's shared-memory data
// plane, its DRAM populated at start (as `kvmesh bench store` runs it).
func shmBenchClient(b *testing.B) *client.Client {
	n := startClusterNodes(b, 1, func(_ int, o *Options) {
		o.Tiers.DRAMBytes, o.Limits.MaxBlockBytes, o.Tiers.DRAMPopulate = 512*MiB, 8*MiB, true
	})[0]
	return benchClient(b, n, client.TransportAuto)
}

func benchClient(b *testing.B, n *clusterNode, transport string) *client.Client {
	c, err := client.Dial(n.GRPCAddr(), client.Options{Transport: transport, MaxRetries: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

//lint:file-ignore SA1019 the node's tests call the client's deprecated methods, kept one release (client/deprecated.go).
