package tiers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/prefixhash"
)

func TestSegHeaderRoundTrip(t *testing.T) {
	h := segHeader{loc: segLoc(7, 3*segAlign), key: nvmeTestKey(1), n: 12345, sum: 0xdeadbeef}
	var b [segHeaderSize]byte
	encodeSegHeader(b[:], h)
	got, err := decodeSegHeader(b[:])
	if err != nil || got != h {
		t.Fatalf("decode(encode(%+v)) = %+v, %v", h, got, err)
	}
	for i := range b {
		c := b
		c[i] ^= 0x40
		if _, err := decodeSegHeader(c[:]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("header with byte %d flipped: %v, want ErrCorrupt", i, err)
		}
	}
	if _, err := decodeSegHeader(b[:segHeaderSize-1]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("short header: %v", err)
	}
}

func TestSegLoc(t *testing.T) {
	for _, tc := range []struct {
		seg uint64
		off int64
	}{{1, 0}, {1, segAlign}, {segMaxID, segMaxSize - segAlign}, {12345, 64 << 20}} {
		l := segLoc(tc.seg, tc.off)
		if locSeg(l) != tc.seg || locOff(l) != tc.off {
			t.Errorf("segLoc(%d, %d) = %x: seg %d off %d", tc.seg, tc.off, l, locSeg(l), locOff(l))
		}
	}
	for _, tc := range []struct{ n, want int64 }{{0, 4096}, {4032, 4096}, {4033, 8192}, {1 << 20, 1<<20 + 4096}} {
		if got := segRecordLen(int(tc.n)); got != tc.want {
			t.Errorf("segRecordLen(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
	if id, ok := parseSegFileName(segFileName(0xabc)); !ok || id != 0xabc {
		t.Errorf("parseSegFileName(segFileName(0xabc)) = %x, %v", id, ok)
	}
	for _, bad := range []string{"", "0000000000000000.seg", "000000000000000G.seg", "0000000000000001.sex", "000000000000001.seg"} {
		if _, ok := parseSegFileName(bad); ok {
			t.Errorf("parseSegFileName(%q) accepted", bad)
		}
	}
}

func TestZeroCopyHead(t *testing.T) {
	n := &NVMe{direct: true}
	bp, class := segGetBuf(256 << 10)
	defer segPutBuf(bp, class)
	b := *bp
	for _, tc := range []struct {
		v    []byte
		want int
	}{
		{b[:256<<10], 256 << 10},
		{b[:100_000], 100_000 &^ (segAlign - 1)},
		{b[:nvmeZeroCopyMin-1], 0},
		{b[1 : 1+100_000], 0},
	} {
		if got := n.zeroCopyHead(tc.v); got != tc.want {
			t.Errorf("direct: zeroCopyHead(%d bytes, aligned %v) = %d, want %d", len(tc.v), segAligned(tc.v), got, tc.want)
		}
	}
	n.direct = false
	if got := n.zeroCopyHead(b[1 : 1+100_000]); got != 100_000&^(segAlign-1) {
		t.Errorf("buffered: zeroCopyHead(unaligned) = %d", got)
	}
}

func TestIdxValRoundTrip(t *testing.T) {
	k := nvmeTestKey(3)
	v := idxEncodeVal(nil, k, 777, 42)
	gk, n, sum, ok := idxDecodeVal(v)
	if !ok || gk != k || n != 777 || sum != 42 {
		t.Fatalf("idxDecodeVal = %v %d %d %v", gk, n, sum, ok)
	}
	if _, _, _, ok := idxDecodeVal(v[:len(v)-1]); ok {
		t.Fatal("short index value accepted")
	}
}

// FuzzSegHeader: decoding arbitrary bytes never panics, and whatever decodes
// re-encodes to the same bytes.
func FuzzSegHeader(f *testing.F) {
	var b [segHeaderSize]byte
	encodeSegHeader(b[:], segHeader{loc: segLoc(1, 0), key: prefixhash.Key{1}, n: 10, sum: 99})
	f.Add(b[:])
	f.Add(b[:10])
	f.Add(make([]byte, segHeaderSize))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := decodeSegHeader(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		var re [segHeaderSize]byte
		encodeSegHeader(re[:], h)
		if !bytes.Equal(re[:], data[:segHeaderSize]) {
			t.Fatalf("re-encoding %+v gives %x, decoded from %x", h, re, data[:segHeaderSize])
		}
	})
}

// TestSegHeaderOtherVersions: a record of segment format 1 (an older kvmesh,
// xxhash64 keys) or of another key format does not decode, even with a
// valid checksum.
func TestSegHeaderOtherVersions(t *testing.T) {
	h := segHeader{loc: segLoc(7, 3*segAlign), key: nvmeTestKey(1), n: 12345, sum: 0xdeadbeef}
	for _, tc := range []struct {
		version uint16
		keys    byte
	}{{1, 0}, {1, prefixhash.KeyVersion}, {segVersion, 1}, {segVersion, prefixhash.KeyVersion + 1}} {
		var b [segHeaderSize]byte
		encodeSegHeader(b[:], h)
		binary.LittleEndian.PutUint16(b[4:6], tc.version)
		b[48] = tc.keys
		binary.LittleEndian.PutUint64(b[56:64], xxhash.Sum64(b[:56]))
		if _, err := decodeSegHeader(b[:]); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "another kvmesh") {
			t.Errorf("version %d, key format %d: %v", tc.version, tc.keys, err)
		}
	}
}
