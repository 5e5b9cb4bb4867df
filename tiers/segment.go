package tiers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// A segment is one append-only file of the NVMe tier. It holds records laid
// end to end, each starting at a multiple of segAlign:
//
//	record = value ‖ zero padding ‖ header (segHeaderSize bytes)
//
// segRecordLen(len(value)) bytes long, a multiple of segAlign, with the
// header in its last 64 bytes. A record is read by one aligned O_DIRECT read
// of that length at its offset. The value comes first so that it starts on an
// aligned file offset: a value whose memory is aligned too is written from,
// and read into, that memory directly, with only the last block of the record
// going through a bounce buffer. The header, all integers little-endian:
//
//	off  size  field
//	  0     4  magic "KVNR"
//	  4     2  format version (2)
//	  6     2  header length (64)
//	  8     8  Loc of the record: segment id << 24 | offset / 4096
//	 16    16  key
//	 32     8  value length
//	 40     8  xxhash64 of the value
//	 48     1  key format version (prefixhash.KeyVersion)
//	 49     7  reserved, zero
//	 56     8  xxhash64 of bytes [0,56)
//
// The Loc in the header makes a record self-identifying: a read that lands on
// the wrong bytes (a stale or misdirected block, a copied file) fails like a
// checksum mismatch instead of serving another value. A reader knows the
// value's length (the owner keeps it), hence where the header is. The key
// format version makes a record keyed under another prefixhash.KeyVersion
// unreadable: its key would name other tokens under this build's keys.
// Version 1 records (no key format; xxhash64 keys) fail the same way; whole
// segments of them are dropped on open (see NVMe, Recovery).
const (
	segAlign       = 4096
	segHeaderSize  = 64
	segMagic       = "KVNR"
	segVersion     = 2
	segOffBits     = 24 // Loc bits for the offset, in segAlign units
	segMaxSize     = int64(1) << segOffBits * segAlign
	segMaxID       = uint64(1)<<(64-segOffBits) - 1
	segFileSuffix  = ".seg"
	segFileNameLen = 16 + len(segFileSuffix)
)

// errSegHeader is wrapped by every header decoding error; it wraps
// ErrCorrupt, so a bad header is a missing value to the owner.
var errSegHeader = fmt.Errorf("nvme: bad record header: %w", ErrCorrupt)

// segHeader is a decoded record header.
type segHeader struct {
	loc Loc
	key prefixhash.Key
	n   uint64 // value length
	sum uint64 // xxhash64 of the value
}

// segRecordLen returns the bytes a record with an n-byte value takes in a
// segment, header and padding included.
func segRecordLen(n int) int64 {
	return (int64(n) + segHeaderSize + segAlign - 1) &^ (segAlign - 1)
}

// segLoc returns the Loc of the record at byte offset off of segment seg.
func segLoc(seg uint64, off int64) Loc {
	return Loc(seg<<segOffBits | uint64(off/segAlign))
}

// locSeg returns the segment id of loc.
func locSeg(l Loc) uint64 { return uint64(l) >> segOffBits }

// locOff returns the byte offset of loc in its segment.
func locOff(l Loc) int64 { return int64(uint64(l)&(1<<segOffBits-1)) * segAlign }

// segFileName returns the file name of segment id: 16 hex digits, so that
// names sort like ids.
func segFileName(id uint64) string { return fmt.Sprintf("%016x%s", id, segFileSuffix) }

// parseSegFileName returns the id named by a segment file name.
func parseSegFileName(name string) (uint64, bool) {
	if len(name) != segFileNameLen || name[16:] != segFileSuffix {
		return 0, false
	}
	var id uint64
	for _, c := range []byte(name[:16]) {
		switch {
		case c >= '0' && c <= '9':
			id = id<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			id = id<<4 | uint64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return id, id != 0 && id <= segMaxID
}

// encodeSegHeader writes h into b[:segHeaderSize].
func encodeSegHeader(b []byte, h segHeader) {
	b = b[:segHeaderSize]
	copy(b[0:4], segMagic)
	binary.LittleEndian.PutUint16(b[4:6], segVersion)
	binary.LittleEndian.PutUint16(b[6:8], segHeaderSize)
	binary.LittleEndian.PutUint64(b[8:16], uint64(h.loc))
	copy(b[16:32], h.key[:])
	binary.LittleEndian.PutUint64(b[32:40], h.n)
	binary.LittleEndian.PutUint64(b[40:48], h.sum)
	clear(b[48:56])
	b[48] = prefixhash.KeyVersion
	binary.LittleEndian.PutUint64(b[56:64], xxhash.Sum64(b[:56]))
}

// decodeSegHeader decodes the record header at the start of b. Every error
// wraps ErrCorrupt.
func decodeSegHeader(b []byte) (segHeader, error) {
	var h segHeader
	if len(b) < segHeaderSize {
		return h, fmt.Errorf("%w: %d bytes, want %d", errSegHeader, len(b), segHeaderSize)
	}
	b = b[:segHeaderSize]
	if string(b[0:4]) != segMagic {
		return h, fmt.Errorf("%w: magic %q", errSegHeader, b[0:4])
	}
	if got := xxhash.Sum64(b[:56]); got != binary.LittleEndian.Uint64(b[56:64]) {
		return h, fmt.Errorf("%w: header checksum mismatch", errSegHeader)
	}
	if v, kv := binary.LittleEndian.Uint16(b[4:6]), b[48]; v != segVersion || kv != prefixhash.KeyVersion {
		return h, fmt.Errorf("%w: version %d, key format %d: written by another kvmesh (this build: %d, key format %d)",
			errSegHeader, v, kv, segVersion, prefixhash.KeyVersion)
	}
	if n := binary.LittleEndian.Uint16(b[6:8]); n != segHeaderSize {
		return h, fmt.Errorf("%w: header length %d", errSegHeader, n)
	}
	h.loc = Loc(binary.LittleEndian.Uint64(b[8:16]))
	copy(h.key[:], b[16:32])
	h.n = binary.LittleEndian.Uint64(b[32:40])
	h.sum = binary.LittleEndian.Uint64(b[40:48])
	return h, nil
}

// The pebble index. Keys are ordered by Loc, so a segment's entries are one
// contiguous key range (OldestSegment scans it, DropSegment deletes it with one
// range tombstone):
//
//	key   'l' ‖ Loc (8 bytes, big-endian)
//	value key (16) ‖ value length (8, little-endian) ‖ xxhash64 of the value (8, little-endian)
//
// and one metadata key, "m/format" → idxFormat, checked on open. The format
// names the key format too: segments written under another one (an older
// kvmesh's "kvmesh-nvme-1", xxhash64 keys) are dropped on open, since their
// keys mean nothing to this build.
const (
	idxPrefix       = 'l'
	idxKeyLen       = 9
	idxValLen       = 32
	idxFormatFamily = "kvmesh-nvme-"
)

// idxFormat is "kvmesh-nvme-2/keys-2": segment format 2, key format
// prefixhash.KeyVersion.
var idxFormat = fmt.Sprintf("%s%d/keys-%d", idxFormatFamily, segVersion, prefixhash.KeyVersion)

var idxFormatKey = []byte("m/format")

func idxKey(l Loc) []byte {
	k := make([]byte, idxKeyLen)
	k[0] = idxPrefix
	putLocBE(k[1:], l)
	return k
}

func putLocBE(b []byte, l Loc) { binary.BigEndian.PutUint64(b, uint64(l)) }

// idxSegBounds returns the key range [lo, hi) holding segment seg's entries.
func idxSegBounds(seg uint64) (lo, hi []byte) {
	return idxKey(segLoc(seg, 0)), idxKey(segLoc(seg+1, 0))
}

func idxDecodeKey(k []byte) (Loc, bool) {
	if len(k) != idxKeyLen || k[0] != idxPrefix {
		return 0, false
	}
	return Loc(binary.BigEndian.Uint64(k[1:])), true
}

func idxEncodeVal(dst []byte, key prefixhash.Key, n int, sum uint64) []byte {
	dst = append(dst, key[:]...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(n))
	return binary.LittleEndian.AppendUint64(dst, sum)
}

func idxDecodeVal(v []byte) (key prefixhash.Key, n int, sum uint64, ok bool) {
	if len(v) != idxValLen {
		return key, 0, 0, false
	}
	copy(key[:], v[:16])
	n64 := binary.LittleEndian.Uint64(v[16:24])
	if n64 > uint64(segMaxSize) {
		return key, 0, 0, false
	}
	return key, int(n64), binary.LittleEndian.Uint64(v[24:32]), true
}

// segment is one open segment file. The NVMe tier's map holds one reference,
// the writer one while the segment is active, and every read one for its
// duration: the file descriptor is closed when the last reference goes, so a
// dropped (unlinked) segment still serves the reads already in flight.
type segment struct {
	id   uint64
	fd   int
	path string
	refs atomic.Int64
	// broken is set when a write or sync to the file failed: nothing more is
	// written to it or indexed in it.
	broken atomic.Bool

	// Guarded by NVMe.mu.
	size   int64 // bytes the file reserves on disk (counted against Capacity)
	values int64 // indexed values
	bytes  int64 // their total length
	sealed bool  // no more writes; every record written to it is indexed
}

func (s *segment) ref() { s.refs.Add(1) }

func (s *segment) unref() {
	switch n := s.refs.Add(-1); {
	case n == 0:
		unix.Close(s.fd)
	case n < 0:
		panic(fmt.Sprintf("nvme: segment %d: reference count %d", s.id, n))
	}
}

var errSegShort = errors.New("nvme: unexpected end of segment file")

// segPreadv fills the buffers of iov from fd at off, in one preadv unless
// the kernel returns less.
func segPreadv(files fileOps, fd int, iov [][]byte, off int64) error {
	for len(iov) > 0 {
		n, err := files.Preadv(fd, iov, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("short read at %d: %w", off, errSegShort)
		}
		off += int64(n)
		iov = segAdvance(iov, n)
	}
	return nil
}

// segPwritev writes the buffers of iov to fd at off, writing again what a
// short write left.
func segPwritev(files fileOps, fd int, iov [][]byte, off int64) error {
	for len(iov) > 0 {
		n, err := files.Pwritev(fd, iov, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		off += int64(n)
		iov = segAdvance(iov, n)
	}
	return nil
}

// segAdvance drops the first n bytes of iov; it may modify iov's entries.
func segAdvance(iov [][]byte, n int) [][]byte {
	for len(iov) > 0 && n >= len(iov[0]) {
		n -= len(iov[0])
		iov = iov[1:]
	}
	if n > 0 {
		iov[0] = iov[0][n:]
	}
	return iov
}

// segAligned reports whether b starts on a segAlign boundary.
func segAligned(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))&(segAlign-1) == 0
}

// segBufs pools the aligned buffers reads go through, by power-of-two size
// class from segAlign up. They live on the Go heap: the collector does not
// move objects, so the kernel may DMA into them.
var segBufs [40]sync.Pool

// segGetBuf returns an aligned buffer of at least n bytes (n > 0) and its
// size class, to be handed back to segPutBuf.
func segGetBuf(n int64) (*[]byte, int) {
	c := bits.Len64(uint64(n-1) / segAlign)
	if p, _ := segBufs[c].Get().(*[]byte); p != nil {
		return p, c
	}
	size := segAlign << c
	raw := make([]byte, size+segAlign)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&raw[0])) & (segAlign - 1)); r != 0 {
		off = segAlign - r
	}
	b := raw[off : off+size : off+size]
	return &b, c
}

func segPutBuf(p *[]byte, c int) { segBufs[c].Put(p) }

// segMmap returns n bytes of page-aligned anonymous memory outside the Go
// heap; segMunmap returns it.
func segMmap(n int) ([]byte, error) {
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
}

func segMunmap(b []byte) error { return unix.Munmap(b) }
