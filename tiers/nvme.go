package tiers

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/internal/privatefs"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// NVMe is the flash tier: values in append-only segment files written in
// large aligned writes, with a pebble database as the persistent index from
// location to (key, length, checksum) — the WiscKey/CacheLib shape.
//
// Durability. Put and PutBatch return once the value is durable: its record
// is written (O_DIRECT, in aligned writes of up to WriteBuffer bytes, from
// the caller's memory when it is aligned, else through a staging buffer), the
// segment file is fdatasync'ed, and only then is the index entry committed to pebble with a
// synced write. An index entry therefore never names bytes that are not on
// disk. Concurrent Puts are group-committed by one writer goroutine: every
// request queued while the previous group was being synced goes into the next
// group, which costs one write (or a few, WriteBuffer bytes each), one
// fdatasync per segment touched and one pebble sync. Writing a group overlaps
// with syncing the previous one.
//
// Space. Segments are files of SegmentSize bytes, preallocated, with
// increasing ids (an id comes back only after a restart, and only if no
// index entry named it). Capacity bounds all segment files together:
// when a new segment would exceed it (or the filesystem lacks the room, ENOSPC
// included), Put returns ErrFull; the owner then drops the oldest sealed
// segment (OldestSegment, DropSegment) and retries. Free deletes one index
// entry and does not reclaim space: space comes back a whole segment at a
// time. Free is not synced, so a crash may bring a freed value back; that is
// harmless, the value is intact and the owner's index decides what is live.
//
// Reads. A Loc is the segment id and the record's offset; Read does one
// aligned read of the whole record (O_DIRECT where the filesystem allows it),
// checks the header (magic, its own checksum, the Loc it was written at, the
// length) and the value's xxhash64, and fails with ErrCorrupt instead of ever
// returning wrong bytes. The index is not consulted on the read path.
//
// Recovery. Open scans the index: entries whose segment file is gone or
// shorter than the record are deleted; the records of the newest segment
// (the one being written at a crash) are read back and those that fail their
// checks are deleted too; segments with no entry are removed, and every
// segment is truncated after its last indexed record, which discards the
// torn tail of the segment being written at a crash. Range then reports what
// survived. Older segments are not re-read on open (that would cost a scan of
// the whole disk): a record damaged since it was written fails its checks on
// Read, and the owner drops it. An index of another format (an older
// kvmesh's, or one written under another prefixhash.KeyVersion) is emptied
// and its segment files removed before all this, with one log line saying
// how many segments, values and bytes went and why.
//
// Concurrency. All methods are safe for concurrent use, and all but Close
// may be called from Range's callback. No lock is held across I/O: Close waits for the
// calls in flight by counting them. The writer and syncer goroutines are
// owned by the tier and stopped by Close.
type NVMe struct {
	opts   NVMeOptions
	segDir string
	dirFd  int // the segment directory, for fsync after creating a file
	db     *pebble.DB
	direct bool // O_DIRECT in use
	log    *slog.Logger

	// calls counts the calls in flight; once closed is set, the call that
	// brings it to zero closes drained, which Close waits for.
	calls     atomic.Int64
	closed    atomic.Bool
	closing   chan struct{} // closed when Close starts: queued Puts give up
	drained   chan struct{}
	drainOnce sync.Once
	closeOnce sync.Once

	reqs   chan *nvmeReq   // Put and PutBatch requests, to the writer
	groups chan *nvmeGroup // written groups, writer to syncer
	stop   chan struct{}   // closed by Close once no call is in flight
	wg     sync.WaitGroup

	w nvmeWriter // owned by the writer goroutine

	// files makes the data path's system calls: sysFiles, or a test's
	// faults (set before any Put).
	files fileOps

	mu struct {
		sync.RWMutex
		segs     map[uint64]*segment
		reserved int64
		stored   int64
		values   int64
	}
}

var (
	_ Tier        = (*NVMe)(nil)
	_ Segmented   = (*NVMe)(nil)
	_ Recoverable = (*NVMe)(nil)
	_ Batcher     = (*NVMe)(nil)
	_ Checked     = (*NVMe)(nil)
)

// OpenNVMe opens (creating if needed) the NVMe tier in opts.Dir and recovers
// its index; see NVMe for what recovery keeps.
func OpenNVMe(opts NVMeOptions) (*NVMe, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	t := &NVMe{
		opts:    opts,
		segDir:  filepath.Join(opts.Dir, "segments"),
		dirFd:   -1,
		log:     opts.Logger,
		closing: make(chan struct{}),
		drained: make(chan struct{}),
		reqs:    make(chan *nvmeReq, opts.QueueDepth),
		groups:  make(chan *nvmeGroup, 1),
		stop:    make(chan struct{}),
		files:   sysFiles{},
	}
	t.mu.segs = make(map[uint64]*segment)
	ok := false
	defer func() {
		if !ok {
			t.closeResources()
		}
	}()
	// Only the node's user may read the cache: directories 0700, files
	// 0600, pebble's included (privatefs).
	for _, dir := range []string{t.segDir, filepath.Join(opts.Dir, "index")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("nvme: %w", err)
		}
	}
	fd, err := unix.Open(t.segDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("nvme: open %s: %w", t.segDir, err)
	}
	t.dirFd = fd
	t.direct = !opts.BufferedIO
	if t.direct {
		if err := nvmeProbeDirectIO(t.segDir); err != nil {
			t.direct = false
			t.log.Warn("nvme: O_DIRECT refused, using buffered I/O", "dir", t.segDir, "err", err)
		}
	}
	t.db, err = pebble.Open(filepath.Join(opts.Dir, "index"), &pebble.Options{Logger: nvmePebbleLogger{t.log}, FS: privatefs.New(nil)})
	if err != nil {
		return nil, fmt.Errorf("nvme: open index: %w", err)
	}
	if err := t.checkFormat(); err != nil {
		return nil, err
	}
	if err := t.recover(); err != nil {
		return nil, err
	}
	t.w.mem, err = segMmap(2 * opts.WriteBuffer)
	if err != nil {
		return nil, fmt.Errorf("nvme: write buffers: %w", err)
	}
	for i := range t.w.units {
		u := &t.w.units[i]
		u.stage = t.w.mem[i*opts.WriteBuffer : (i+1)*opts.WriteBuffer : (i+1)*opts.WriteBuffer]
		u.iov = make([][]byte, 0, nvmeMaxIov)
		u.reset()
	}
	t.w.wrote = make(chan error, 1)
	t.wg.Add(2)
	go t.writeLoop()
	go t.syncLoop()
	ok = true
	return t, nil
}

// nvmeProbeDirectIO reports why dir's filesystem refuses O_DIRECT, or nil.
func nvmeProbeDirectIO(dir string) error {
	path := filepath.Join(dir, ".direct-probe")
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_TRUNC|unix.O_RDWR|unix.O_CLOEXEC|unix.O_DIRECT, 0o600)
	if err != nil {
		return err
	}
	defer unix.Unlink(path)
	defer unix.Close(fd)
	b, err := segMmap(segAlign)
	if err != nil {
		return err
	}
	defer segMunmap(b)
	if err := segPwritev(sysFiles{}, fd, [][]byte{b}, 0); err != nil {
		return err
	}
	return segPreadv(sysFiles{}, fd, [][]byte{b}, 0)
}

func (t *NVMe) openSegment(path string, flags int) (int, error) {
	flags |= unix.O_RDWR | unix.O_CLOEXEC
	if t.direct {
		flags |= unix.O_DIRECT
	}
	fd, err := unix.Open(path, flags, 0o600)
	if err != nil {
		return -1, fmt.Errorf("nvme: open segment %s: %w", path, err)
	}
	return fd, nil
}

// enter admits a call unless the tier is closed; an admitted call must
// leave. Calls may nest (Range's callback).
func (t *NVMe) enter() bool {
	t.calls.Add(1)
	if t.closed.Load() {
		t.leave()
		return false
	}
	return true
}

func (t *NVMe) leave() {
	if t.calls.Add(-1) == 0 && t.closed.Load() {
		t.drainOnce.Do(func() { close(t.drained) })
	}
}

// Name returns "nvme".
func (t *NVMe) Name() string { return "nvme" }

// maxValue is the largest value a segment holds.
func (t *NVMe) maxValue() int { return int(t.opts.SegmentSize - segHeaderSize) }

// Put stores val under key and returns its location once it is durable.
// val is read until Put returns (by the kernel, for an aligned value) and not
// retained. ErrFull: no segment can be added (Capacity, or the
// filesystem); ErrTooLarge: len(val) > SegmentSize-64.
func (t *NVMe) Put(key prefixhash.Key, val []byte) (Loc, error) {
	if len(val) > t.maxValue() {
		return 0, fmt.Errorf("nvme: %d-byte value, segment holds %d: %w", len(val), t.maxValue(), ErrTooLarge)
	}
	r := nvmeReqPool.Get().(*nvmeReq)
	r.one.key[0], r.one.val[0] = key, val
	r.keys, r.vals, r.locs = r.one.key[:], r.one.val[:], r.one.loc[:]
	n, err := t.submit(r)
	loc := r.one.loc[0]
	r.reset()
	nvmeReqPool.Put(r)
	if n == 1 {
		return loc, nil
	}
	return 0, err
}

// PutBatch stores vals[i] under keys[i] and sets locs[i], in one group
// commit. It returns how many values, from the first, it stored before the
// first error; those are durable on return. The slices are not retained.
func (t *NVMe) PutBatch(keys []prefixhash.Key, vals [][]byte, locs []Loc) (int, error) {
	if len(keys) != len(vals) || len(locs) != len(vals) {
		return 0, fmt.Errorf("nvme: PutBatch: %d keys, %d values, %d locs", len(keys), len(vals), len(locs))
	}
	if len(vals) == 0 {
		return 0, nil
	}
	r := nvmeReqPool.Get().(*nvmeReq)
	r.keys, r.vals, r.locs = keys, vals, locs
	n, err := t.submit(r)
	r.reset()
	nvmeReqPool.Put(r)
	return n, err
}

func (t *NVMe) submit(r *nvmeReq) (int, error) {
	if !t.enter() {
		return 0, ErrClosed
	}
	defer t.leave()
	select {
	case t.reqs <- r:
	case <-t.closing:
		return 0, ErrClosed
	}
	<-r.done
	return r.n, r.err
}

// acquire returns segment id with a reference the caller must drop, or nil.
func (t *NVMe) acquire(id uint64) *segment {
	t.mu.RLock()
	s := t.mu.segs[id]
	if s != nil {
		s.ref()
	}
	t.mu.RUnlock()
	return s
}

// Read copies the value at loc into dst, which must be exactly its length.
// It reads the whole record with one aligned read (into dst itself for the
// aligned head of a large value in aligned memory, the rest through a pooled
// buffer) and checks it; a value that fails (or whose segment is gone, or
// whose bytes cannot be read) yields an error wrapping ErrCorrupt. On error
// dst's contents are unspecified.
func (t *NVMe) Read(loc Loc, dst []byte) error {
	if !t.enter() {
		return ErrClosed
	}
	defer t.leave()
	id, off, recLen := locSeg(loc), locOff(loc), segRecordLen(len(dst))
	if off+recLen > t.opts.SegmentSize {
		return fmt.Errorf("nvme: read %d bytes at segment %d offset %d: past the segment end: %w", len(dst), id, off, ErrCorrupt)
	}
	s := t.acquire(id)
	if s == nil {
		return fmt.Errorf("nvme: read segment %d: no such segment: %w", id, ErrCorrupt)
	}
	defer s.unref()
	return t.readRecord(s.fd, loc, dst)
}

// readRecord reads and checks the record at loc, in the segment open as fd,
// whose value is len(dst) bytes, into dst.
func (t *NVMe) readRecord(fd int, loc Loc, dst []byte) error {
	id, off, recLen := locSeg(loc), locOff(loc), segRecordLen(len(dst))
	head := t.zeroCopyHead(dst)
	tailLen := recLen - int64(head)
	bp, class := segGetBuf(tailLen)
	defer segPutBuf(bp, class)
	tail := (*bp)[:tailLen]
	var iov [2][]byte
	io := append(iov[:0], dst[:head], tail)
	if head == 0 {
		io = io[1:]
	}
	if err := segPreadv(t.files, fd, io, off); err != nil {
		return fmt.Errorf("nvme: read segment %d offset %d: %w (%w)", id, off, ErrCorrupt, err)
	}
	h, err := decodeSegHeader(tail[tailLen-segHeaderSize:])
	if err != nil {
		return fmt.Errorf("nvme: read segment %d offset %d: %w", id, off, err)
	}
	if h.loc != loc {
		return fmt.Errorf("nvme: read segment %d offset %d: record of segment %d offset %d: %w", id, off, locSeg(h.loc), locOff(h.loc), ErrCorrupt)
	}
	if h.n != uint64(len(dst)) {
		return fmt.Errorf("nvme: read segment %d offset %d: value is %d bytes, dst %d", id, off, h.n, len(dst))
	}
	rest := tail[:len(dst)-head]
	var d xxhash.Digest
	d.Reset()
	d.Write(dst[:head])
	d.Write(rest)
	if d.Sum64() != h.sum {
		return fmt.Errorf("nvme: read segment %d offset %d: value checksum mismatch: %w", id, off, ErrCorrupt)
	}
	copy(dst[head:], rest)
	return nil
}

// ChecksReads reports that Read verifies the whole value against its
// record's checksum (Checked).
func (t *NVMe) ChecksReads() bool { return true }

// Free deletes the index entry of the value at loc. Its space comes back when
// its segment is dropped. The delete is not synced: a crash may bring the
// value back, intact.
func (t *NVMe) Free(loc Loc) {
	if !t.enter() {
		return
	}
	defer t.leave()
	k := idxKey(loc)
	v, closer, err := t.db.Get(k)
	if err != nil {
		if !errors.Is(err, pebble.ErrNotFound) {
			t.log.Error("nvme: free: index lookup", "loc", loc, "err", err)
		} else if invariants.Enabled {
			// Freed twice, or its segment was dropped: the caller's index
			// kept a dead location (a store freeing what reclaim dropped).
			panic(fmt.Sprintf("tiers: nvme: free of segment %d offset %d, which holds no value: an index names a dead location", locSeg(loc), locOff(loc)))
		}
		return
	}
	_, n, _, _ := idxDecodeVal(v)
	closer.Close()
	if err := t.db.Delete(k, pebble.NoSync); err != nil {
		t.log.Error("nvme: free: index delete", "loc", loc, "err", err)
		return
	}
	t.mu.Lock()
	if s := t.mu.segs[locSeg(loc)]; s != nil {
		s.values--
		s.bytes -= int64(n)
		t.mu.values--
		t.mu.stored -= int64(n)
		if invariants.Enabled && (s.values < 0 || s.bytes < 0 || t.mu.values < 0 || t.mu.stored < 0) {
			panic(fmt.Sprintf("tiers: nvme: free of segment %d offset %d leaves the segment %d values, %d bytes, the tier %d values, %d bytes",
				locSeg(loc), locOff(loc), s.values, s.bytes, t.mu.values, t.mu.stored))
		}
	}
	t.mu.Unlock()
}

// Stats returns the tier's usage: Reserved counts whole segment files.
func (t *NVMe) Stats() Stats {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return Stats{Capacity: t.opts.Capacity, Reserved: t.mu.reserved, Stored: t.mu.stored, Values: t.mu.values}
}

// DirectIO reports whether the tier reads and writes with O_DIRECT.
func (t *NVMe) DirectIO() bool { return t.direct }

// Close waits for the calls in flight (queued Puts complete and are durable),
// stops the writer and syncer, and closes the index and the files. Every
// method returns ErrClosed afterwards.
func (t *NVMe) Close() error {
	first := false
	t.closeOnce.Do(func() {
		first = true
		t.closed.Store(true)
		close(t.closing)
	})
	if !first {
		return ErrClosed
	}
	if t.calls.Load() != 0 {
		<-t.drained
	}
	close(t.stop)
	t.wg.Wait()
	return t.closeResources()
}

// closeResources releases what OpenNVMe acquired; the goroutines are stopped.
func (t *NVMe) closeResources() error {
	var errs []error
	t.mu.Lock()
	for id, s := range t.mu.segs {
		s.unref()
		delete(t.mu.segs, id)
	}
	t.mu.Unlock()
	if t.db != nil {
		if err := t.db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("nvme: close index: %w", err))
		}
		t.db = nil
	}
	if t.w.mem != nil {
		if err := segMunmap(t.w.mem); err != nil {
			errs = append(errs, fmt.Errorf("nvme: write buffers: %w", err))
		}
		t.w.mem = nil
	}
	if t.dirFd >= 0 {
		unix.Close(t.dirFd)
		t.dirFd = -1
	}
	return errors.Join(errs...)
}
