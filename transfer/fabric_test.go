package transfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

func testWindow() windowDesc {
	return windowDesc{fabric: "ucx", epoch: 0x1234567, size: 1 << 30, desc: encodeUCXDesc(ucxDesc{base: 0x7f0000000000, worker: []byte("worker-address"), rkey: []byte{1, 2, 3}})}
}

// TestWindowDesc: a window descriptor round-trips, and every corruption of
// it is ErrCorrupt before any byte reaches the fabric.
func TestWindowDesc(t *testing.T) {
	b := encodeWindow(testWindow())
	d, err := parseWindow(b)
	if err != nil {
		t.Fatal(err)
	}
	if w := testWindow(); d.fabric != w.fabric || d.epoch != w.epoch || d.size != w.size || !bytes.Equal(d.desc, w.desc) {
		t.Fatalf("round trip: %+v", d)
	}
	resum := func(b []byte) []byte {
		binary.LittleEndian.PutUint64(b[len(b)-8:], xxhash.Sum64(b[:len(b)-8]))
		return b
	}
	for name, bad := range map[string][]byte{
		"empty": nil,
		"short": b[:20],
		"a flipped bit": func() []byte {
			c := bytes.Clone(b)
			c[40] ^= 1
			return c
		}(),
		"truncated, checksum redone": resum(bytes.Clone(b[:len(b)-3])),
		"zero epoch": func() []byte {
			c := bytes.Clone(b)
			binary.LittleEndian.PutUint64(c[8:], 0)
			return resum(c)
		}(),
		"long name": func() []byte {
			c := bytes.Clone(b)
			c[5] = 200
			return resum(c)
		}(),
		"version 2": func() []byte {
			c := bytes.Clone(b)
			c[4] = 2
			return resum(c)
		}(),
	} {
		if _, err := parseWindow(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// TestUCXDesc: UCX's descriptor round-trips; a worker address or a remote
// key of a bad length is refused.
func TestUCXDesc(t *testing.T) {
	d := ucxDesc{base: 42, version: 0x010d01, worker: []byte("w"), rkey: bytes.Repeat([]byte{9}, 300)}
	got, err := parseUCXDesc(encodeUCXDesc(d))
	if err != nil || got.base != 42 || got.version != 0x010d01 || ucxVersionString(got.version) != "1.13.1" || !bytes.Equal(got.worker, d.worker) || !bytes.Equal(got.rkey, d.rkey) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for name, bad := range map[string][]byte{
		"short":      make([]byte, 23),
		"no worker":  encodeUCXDesc(ucxDesc{rkey: []byte{1}}),
		"no rkey":    encodeUCXDesc(ucxDesc{worker: []byte{1}}),
		"extra byte": append(encodeUCXDesc(d), 0),
		"huge rkey":  encodeUCXDesc(ucxDesc{worker: []byte{1}, rkey: make([]byte, maxUCXBlob+1)}),
	} {
		if _, err := parseUCXDesc(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// TestLeaseGrantsInsideWindow: a grant that reaches past the window is a
// corrupt answer, so no read outside the owner's region is ever issued.
func TestLeaseGrantsInsideWindow(t *testing.T) {
	lim := defaultLimits()
	var p [leasePayload]byte
	binary.LittleEndian.PutUint64(p[0:], 7)
	binary.LittleEndian.PutUint32(p[8:], 1500)
	for _, tc := range []struct {
		off uint64
		n   int
		ok  bool
	}{
		{0, 4096, true},
		{1<<20 - 4096, 4096, true},
		{1<<20 - 4096, 4097, false},
		{1 << 20, 1, false},
		{1<<64 - 1, 2, false},
	} {
		var enc encoder
		tb := enc.begin(typeLeaseResp, 1)
		binary.LittleEndian.PutUint64(tb[8:], tc.off)
		tb[0] = byte(StatusOK)
		binary.LittleEndian.PutUint32(tb[4:], uint32(tc.n))
		st, lens, offs := make([]Status, 1), make([]int, 1), make([]uint64, 1)
		epoch, d, err := parseLeaseResp(tb, p[:], &lim, 1<<20, st, lens, offs)
		if tc.ok != (err == nil) {
			t.Errorf("grant [%d, +%d) of a 1 MiB window: %v", tc.off, tc.n, err)
		}
		if err == nil && (epoch != 7 || d != 1500*time.Millisecond || offs[0] != tc.off || lens[0] != tc.n) {
			t.Errorf("grant [%d, +%d): decoded epoch %d, %v, [%d, +%d)", tc.off, tc.n, epoch, d, offs[0], lens[0])
		}
	}
}

// TestUCXText: the transports are read off UCX's own descriptions of a
// context and of an endpoint (as UCX 1.13 prints them).
func TestUCXText(t *testing.T) {
	ctx := `#
# UCP context
#
#     component 0  :  self
#            md 0  :  component 2  sysv
#      resource 0  :  md 0  dev 0  flags -- sysv/memory
#      resource 1  :  md 1  dev 0  flags -- posix/memory
#      resource 2  :  md 2  dev 0  flags -- cma/memory
#      resource 3  :  md 3  dev 1  flags -- tcp/eth0
#`
	if got := parseUCXResources(ctx); !slices.Equal(got, []string{"sysv/memory", "posix/memory", "cma/memory", "tcp/eth0"}) {
		t.Errorf("context: %v", got)
	}
	if !(UCXInfo{Transports: parseUCXResources(ctx)}).Network() || (UCXInfo{Transports: []string{"posix/memory", "cma/memory"}}).Network() {
		t.Error("Network: want true with tcp/eth0 and false with shared memory alone")
	}
	ep := `#
# UCP endpoint
#
#               peer: <no debug data>
#                 lane[0]:  0:sysv/memory.0 md[0]           -> md[0]/sysv/sysdev[255] am am_bw#0
#                 lane[1]:  1:posix/memory.0 md[1]          -> md[1]/posix/sysdev[255]
#                 lane[2]:  2:cma/memory.0 md[2]            -> md[2]/cma/sysdev[255] rma_bw#0
#                 lane[3]:  5:rc_mlx5/mlx5_0:1.0 md[4]      -> md[4]/ib/sysdev[0] rma_bw#1
#                  get[0]: 0..<bcopy>..(inf)
#`
	if got := parseUCXLanes(ep); !slices.Equal(got, []string{"sysv/memory", "posix/memory", "cma/memory", "rc_mlx5/mlx5_0:1"}) {
		t.Errorf("endpoint: %v", got)
	}
}

func TestOnlyTCP(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want bool
	}{
		{nil, false},
		{[]string{"tcp/lo"}, true},
		{[]string{"tcp/eth0", "self/memory"}, true},
		{[]string{"tcp/eth0", "cma/memory"}, false},
		{[]string{"rc_mlx5/mlx5_0:1"}, false},
	} {
		if got := onlyTCP(tc.in); got != tc.want {
			t.Errorf("onlyTCP(%v) = %v", tc.in, got)
		}
	}
}

// FuzzFabric: the one-sided path's decoders never panic, never accept a
// grant outside the window, and what they accept re-encodes to the same
// bytes.
func FuzzFabric(f *testing.F) {
	f.Add(encodeWindow(testWindow()))
	f.Add(encodeUCXDesc(ucxDesc{base: 1, worker: []byte{1, 2}, rkey: []byte{3}}))
	var enc encoder
	tb := enc.begin(typeLeaseResp, 2)
	putShmEntry(tb, 0, StatusOK, 100, 4096)
	putShmEntry(tb, 1, statusRetry, 0, 0)
	f.Add(append(bytes.Clone(tb), make([]byte, leasePayload)...))
	lim := defaultLimits()
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := parseWindow(b); err == nil {
			if !bytes.Equal(encodeWindow(d), b) {
				t.Fatalf("window %+v re-encodes differently", d)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("parseWindow: %v is not ErrCorrupt", err)
		}
		if d, err := parseUCXDesc(b); err == nil {
			if !bytes.Equal(encodeUCXDesc(d), b) {
				t.Fatalf("UCX descriptor %+v re-encodes differently", d)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("parseUCXDesc: %v is not ErrCorrupt", err)
		}
		if len(b) >= leasePayload {
			table, payload := b[:len(b)-leasePayload], b[len(b)-leasePayload:]
			n := len(table) / shmRespEntry
			table = table[:n*shmRespEntry]
			st, lens, offs := make([]Status, n), make([]int, n), make([]uint64, n)
			const window = 1 << 20
			if _, _, err := parseLeaseResp(table, payload, &lim, window, st, lens, offs); err == nil {
				for i := range n {
					if offs[i]+uint64(lens[i]) > window {
						t.Fatalf("accepted a grant [%d, +%d) outside the window", offs[i], lens[i])
					}
				}
			}
			held := make([]bool, len(b)/getRespEntry)
			parseLeaseEndResp(b[:len(held)*getRespEntry], held)
		}
	})
}
