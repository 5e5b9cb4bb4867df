//go:build linux

package transfer_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/transporttest"
)

// BenchmarkGetParts reads the same bytes, a batch of 16 blocks of 512 KiB
// (8 layers × 8 KV heads × 16 tokens × 128 dims, fp16), over TCP and shared
// memory: as whole blocks (Get), and as every rank's part at TP 1 (the
// whole range through the part path), TP 2, 4 and 8 and PP 2 × TP 4, the
// ranks one after another, each a GetParts of its part of all 16 blocks.
// Every op moves the same payload bytes (SetBytes), so the MB/s compare
// directly:
//
//	go test -run '^$' -bench GetParts -benchtime 20x -count 5 ./transfer/
func BenchmarkGetParts(b *testing.B) {
	ns := prefixhash.Namespace{Model: "bench/parts", DType: prefixhash.Float16, BlockTokens: 16, Layers: 8, KVHeads: 8, HeadDim: 128}
	keys, blocks, err := transporttest.PartBlocks(ns, 16)
	if err != nil {
		b.Fatal(err)
	}
	st := transporttest.NewStore()
	for i, k := range keys {
		st.Set(k, blocks[i])
	}
	peers := map[string]transfer.PartPeer{"tcp": benchTCPPeer(b, st), "shm": benchShmPeer(b, st)}
	layouts := []struct {
		name   string
		tp, pp int
	}{{"tp1", 1, 1}, {"tp2", 2, 1}, {"tp4", 4, 1}, {"tp8", 8, 1}, {"pp2tp4", 4, 2}}
	for _, path := range []string{"tcp", "shm"} {
		p := peers[path]
		b.Run(fmt.Sprintf("path=%s/read=whole", path), func(b *testing.B) {
			b.SetBytes(int64(len(keys) * ns.BlockBytes()))
			for b.Loop() {
				r, err := p.Get(context.Background(), keys)
				if err != nil || r.Hits() != len(keys) {
					b.Fatalf("Get: %v, %d hits", err, r.Hits())
				}
				r.Release()
			}
		})
		for _, l := range layouts {
			var ranks [][]block.Part
			for pr := range l.pp {
				for tr := range l.tp {
					part, err := block.RankPart(ns, tr, l.tp, pr, l.pp)
					if err != nil {
						b.Fatal(err)
					}
					parts := make([]block.Part, len(keys))
					for i := range parts {
						parts[i] = part
					}
					ranks = append(ranks, parts)
				}
			}
			b.Run(fmt.Sprintf("path=%s/read=%s", path, l.name), func(b *testing.B) {
				b.SetBytes(int64(len(keys) * ns.BlockBytes()))
				for b.Loop() {
					for _, parts := range ranks {
						r, err := p.GetParts(context.Background(), keys, parts)
						if err != nil || r.Hits() != len(keys) {
							b.Fatalf("GetParts: %v, %d hits", err, r.Hits())
						}
						r.Release()
					}
				}
			})
		}
	}
}

func benchTCPPeer(b *testing.B, st *transporttest.Store) transfer.PartPeer {
	s, err := transfer.NewServer(st, st, nil, quiet)
	if err != nil {
		b.Fatal(err)
	}
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	c, err := transfer.NewClient(addr.String(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func benchShmPeer(b *testing.B, st *transporttest.Store) transfer.PartPeer {
	s, err := transfer.NewShmServer(st, st, nil, quiet)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "parts.sock")
	if err := s.Listen(path); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	c, err := transfer.DialShm(context.Background(), path, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}
