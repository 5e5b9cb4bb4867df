// Local over the real tiers (tiers.DRAM, tiers.NVMe): the fakes in
// fake_test.go are strict, these are what ships.

package store

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/tiers"
)

func realDRAM(t testing.TB, capacity, slab int64) *tiers.DRAM {
	t.Helper()
	d, err := tiers.NewDRAM(tiers.DRAMOptions{Capacity: capacity, SlabSize: slab})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func realNVMe(t testing.TB, dir string, capacity, segment int64) *tiers.NVMe {
	t.Helper()
	n, err := tiers.OpenNVMe(tiers.NVMeOptions{Dir: dir, Capacity: capacity, SegmentSize: segment,
		WriteBuffer: 64 << 10, DiskHeadroom: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLocalRealTiersPressure runs the pressure test over the real DRAM and
// NVMe tiers, both far too small for the workload.
func TestLocalRealTiersPressure(t *testing.T) {
	for _, disk := range []bool{false, true} {
		opts := Options{DRAM: realDRAM(t, 4*16<<10, 16<<10), DemoteBatchBytes: 4 * blockBytes}
		if disk {
			opts.NVMe = realNVMe(t, t.TempDir(), 8*64<<10, 64<<10)
		}
		l := openLocal(t, opts)
		s := runPressure(t, l, newWorld(t, 201, blocktest.NS()), 1500)
		if disk && (s.Demotions == 0 || s.Promotions == 0) {
			t.Fatalf("tiers never exchanged blocks: %+v", s)
		}
	}
}

// TestLocalRealTiersReopen closes a node over the real NVMe tier and opens it
// again: what was on NVMe is served again, verified.
func TestLocalRealTiersReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w := newWorld(t, 202, blocktest.NS())
	l, err := Open(Options{DRAM: realDRAM(t, 16<<10, 16<<10), NVMe: realNVMe(t, dir, 16*64<<10, 64<<10), DemoteBatchBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	w.putGrown(t, l, 100)
	var onDisk []wblock
	for _, b := range w.blocks {
		if info, ok := l.Info(auth.Access{}, b.key); ok && info.Tier == "nvme" {
			onDisk = append(onDisk, b)
		}
	}
	if len(onDisk) == 0 {
		t.Fatal("nothing was demoted")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLocal(t, Options{DRAM: realDRAM(t, 1<<20, 16<<10), NVMe: realNVMe(t, dir, 16*64<<10, 64<<10)})
	if s := l.Stats(); s.Recovered != int64(len(onDisk)) {
		t.Fatalf("recovered %d blocks, %d were on NVMe", s.Recovered, len(onDisk))
	}
	for _, b := range onDisk {
		r, err := l.Get(ctx, b.key)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Bytes(), b.enc) {
			t.Fatal("a recovered block differs")
		}
		r.Release()
	}
	if s := l.Stats(); s.Promotions != int64(len(onDisk)) || s.CorruptDrops != 0 {
		t.Fatalf("after reading every recovered block: %+v", s)
	}
}

// BenchmarkLocalRealDRAM is BenchmarkLocalPut and BenchmarkLocalGet's copy
// case over the real DRAM tier.
func BenchmarkLocalRealDRAM(b *testing.B) {
	ctx := context.Background()
	for _, sz := range benchSizes {
		ns := benchNS(sz.payload)
		const n = 16
		blocks, keys := benchBlocks(b, ns, n)
		size := len(blocks[0])
		// Slabs of about 4 values, so that an eviction frees a slot and
		// seldom a whole slab (which the tier hands back to the kernel).
		slot := int64(size+64+4095) / 4096 * 4096
		slab := 4 * slot
		b.Run(sz.name+"/put", func(b *testing.B) {
			l := openLocal(b, Options{DRAM: realDRAM(b, n/2*slot, slab)})
			b.SetBytes(int64(size))
			k := 0
			for b.Loop() {
				if err := l.Put(ctx, blocks[k%n]); err != nil {
					b.Fatal(err)
				}
				k++
			}
		})
		b.Run(sz.name+"/get-copy", func(b *testing.B) {
			l := openLocal(b, Options{DRAM: realDRAM(b, n*slot, slab)})
			for _, blk := range blocks {
				if err := l.Put(ctx, blk); err != nil {
					b.Fatal(err)
				}
			}
			dst := make([]byte, size)
			b.SetBytes(int64(size))
			k := 0
			for b.Loop() {
				r, err := l.Get(ctx, keys[k%n])
				if err != nil {
					b.Fatal(err)
				}
				copy(dst, r.Bytes())
				r.Release()
				k++
			}
		})
	}
}
