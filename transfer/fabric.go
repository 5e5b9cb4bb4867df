package transfer

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Fabric reads memory of another process one-sidedly: the reader names a
// region the owner registered, an offset and a length, and the bytes land
// in the reader's own registered memory without the owner's code taking
// part (on RDMA, the owner's NIC answers; over UCX's shared-memory
// transport, the reader's kernel copies; over UCX's TCP transport, the
// owner's progress thread answers inside UCX). UCX implements it in the
// ucx build (NewUCX); kvmesh's lease protocol over the TCP data plane
// (Window, RMA) decides what may be read, and when.
type Fabric interface {
	// Name names the fabric to peers and in metrics ("ucx").
	Name() string
	// Register registers mem for remote reads and as a landing buffer.
	// mem must be memory the Go runtime does not manage (an mmap: the
	// fabric keeps its address) and stay mapped until the Region is
	// closed.
	Register(mem []byte) (Region, error)
	// Connect reaches the region a peer described (Region.Descriptor).
	// A descriptor that does not parse is an error wrapping ErrCorrupt.
	Connect(desc []byte) (Remote, error)
}

// Region is memory registered with a Fabric.
type Region interface {
	// Descriptor is what a peer's Fabric.Connect takes to read the
	// region: for UCX, the worker's address, the region's base address
	// and its packed remote key.
	Descriptor() []byte
	// Close deregisters the region. Nothing may read it (or land in it)
	// after.
	Close() error
}

// Remote is a peer's region as a reader reaches it.
type Remote interface {
	// Read starts filling each span's Dst, which lies in local (a Region
	// of this process's Fabric), with the remote region's bytes at
	// [Off, Off+len(Dst)), and calls done exactly once: with nil when
	// every span landed, or with the error once no span is being written
	// any more (a failed span, or Close). Until done is called, the spans'
	// memory is the fabric's: a reader that gives up closes the Remote and
	// must not reuse the memory before done (over a transport that cannot
	// tell, that may be never). done runs on the fabric's goroutine and
	// must not block. Read returns an error, without calling done, when it
	// cannot start (the Remote is closed). Only offsets the owner granted
	// are read; Read does not check them against the region's size (the
	// caller does).
	Read(local Region, spans []Span, done func(error)) error
	// Transports names the fabric's transports that carry this Remote's
	// reads (for UCX, "tl/device" of each lane, like "cma/memory" or
	// "tcp/eth0"); nil when unknown.
	Transports() []string
	// Close drops the connection. Reads in flight fail.
	Close() error
}

// Span is one read of Remote.Read: len(Dst) bytes at Off in the remote
// region.
type Span struct {
	Off uint64
	Dst []byte
}

// Window is memory that peers read one-sidedly: the node's DRAM arena,
// registered once with a Fabric. A Server with a Window
// (ServerOptions.Window) gives its descriptor to node-wide clients that
// ask, and grants them leases on the values its Source holds in it (see
// RMA). The descriptor carries an epoch, new for each Window, so that a
// reader never reads a re-registered region (a restarted owner) with what
// it learned of the old one.
type Window struct {
	mem   []byte
	reg   Region
	name  string
	epoch uint64
	desc  []byte // the fabric response's payload (encodeWindow)
}

// Expose registers mem with f as a Window. mem must stay mapped until the
// Window is closed.
func Expose(f Fabric, mem []byte) (*Window, error) {
	if len(mem) == 0 {
		return nil, errors.New("transfer: Expose of no memory")
	}
	reg, err := f.Register(mem)
	if err != nil {
		return nil, fmt.Errorf("transfer: register the window with %s: %w", f.Name(), err)
	}
	var e [8]byte
	if _, err := rand.Read(e[:]); err != nil {
		reg.Close()
		return nil, fmt.Errorf("transfer: window epoch: %w", err)
	}
	w := &Window{mem: mem, reg: reg, name: f.Name(), epoch: binary.LittleEndian.Uint64(e[:]) | 1}
	w.desc = encodeWindow(windowDesc{fabric: w.name, epoch: w.epoch, size: uint64(len(mem)), desc: reg.Descriptor()})
	if len(w.desc) > maxFabricPayload {
		reg.Close()
		return nil, fmt.Errorf("transfer: the %s descriptor is %d bytes, more than the %d a fabric response carries", w.name, len(w.desc), maxFabricPayload)
	}
	return w, nil
}

// Close deregisters the window. The server that serves it must be closed
// first.
func (w *Window) Close() error { return w.reg.Close() }

// Fabric returns the name of the window's fabric.
func (w *Window) Fabric() string { return w.name }

// offset returns the offset of v in the window, and whether v lies in it.
func (w *Window) offset(v []byte) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	base, p := uintptrOf(w.mem), uintptrOf(v)
	if p < base || p-base > uintptr(len(w.mem)) || uintptr(len(v)) > uintptr(len(w.mem))-(p-base) {
		return 0, false
	}
	return int64(p - base), true
}

// windowDesc is a decoded fabric response: what a reader needs to read a
// peer's Window.
type windowDesc struct {
	fabric string // the owner's fabric (Fabric.Name)
	epoch  uint64 // the window's epoch: lease answers carry it too
	size   uint64 // the window's size: no grant reaches past it
	desc   []byte // the fabric's own descriptor (Region.Descriptor)
}

// The fabric response's payload (an empty payload: the server has no window
// for this client):
//
//	off  size  field
//	  0     4  magic "KVFW"
//	  4     1  version (1)
//	  5     1  length n of the fabric's name, 1 to 16
//	  6     2  zero
//	  8     8  epoch (non-zero)
//	 16     8  window size in bytes (non-zero)
//	 24     4  length m of the fabric's descriptor, 1 to maxFabricPayload
//	 28     4  zero
//	 32     n  the fabric's name
//	32+n    m  the fabric's descriptor
//	32+n+m  8  xxhash64 of the bytes before
//
// The frame's checksums cover its header, not its payload: this one has its
// own, so that a corrupt descriptor never reaches the fabric (UCX trusts
// the remote keys it unpacks).
const (
	windowMagic      = 0x5746564b // "KVFW"
	windowVersion    = 1
	windowFixed      = 32
	maxFabricName    = 16
	maxFabricPayload = 64 << 10
)

func encodeWindow(d windowDesc) []byte {
	b := make([]byte, windowFixed+len(d.fabric)+len(d.desc)+8)
	binary.LittleEndian.PutUint32(b[0:], windowMagic)
	b[4] = windowVersion
	b[5] = byte(len(d.fabric))
	binary.LittleEndian.PutUint64(b[8:], d.epoch)
	binary.LittleEndian.PutUint64(b[16:], d.size)
	binary.LittleEndian.PutUint32(b[24:], uint32(len(d.desc)))
	n := copy(b[windowFixed:], d.fabric)
	copy(b[windowFixed+n:], d.desc)
	end := len(b) - 8
	binary.LittleEndian.PutUint64(b[end:], xxhash.Sum64(b[:end]))
	return b
}

// parseWindow decodes a fabric response's payload. The descriptor it
// returns aliases b.
func parseWindow(b []byte) (windowDesc, error) {
	var d windowDesc
	if len(b) < windowFixed+8 {
		return d, corrupt("window descriptor of %d bytes", len(b))
	}
	end := len(b) - 8
	if sum := xxhash.Sum64(b[:end]); sum != binary.LittleEndian.Uint64(b[end:]) {
		return d, corrupt("window descriptor checksum %016x, want %016x", binary.LittleEndian.Uint64(b[end:]), sum)
	}
	n, m := int(b[5]), uint64(binary.LittleEndian.Uint32(b[24:]))
	d.epoch, d.size = binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:])
	switch {
	case binary.LittleEndian.Uint32(b[0:]) != windowMagic:
		return d, corrupt("window descriptor magic %#08x", binary.LittleEndian.Uint32(b[0:]))
	case b[4] != windowVersion:
		return d, corrupt("window descriptor version %d, this build speaks %d", b[4], windowVersion)
	case b[6]|b[7] != 0 || binary.LittleEndian.Uint32(b[28:]) != 0:
		return d, corrupt("window descriptor reserved bytes are not zero")
	case n == 0 || n > maxFabricName:
		return d, corrupt("fabric name of %d bytes", n)
	case m == 0 || uint64(windowFixed+n)+m != uint64(end):
		return d, corrupt("fabric descriptor of %d bytes in a %d-byte window descriptor", m, len(b))
	case d.epoch == 0 || d.size == 0:
		return d, corrupt("window epoch %d, size %d", d.epoch, d.size)
	}
	d.fabric = string(b[windowFixed : windowFixed+n])
	d.desc = b[windowFixed+n : end]
	return d, nil
}
