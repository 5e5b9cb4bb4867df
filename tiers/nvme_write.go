package tiers

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// The write path is a two-stage pipeline:
//
//	Put/PutBatch --reqs--> writer --groups--> syncer --done--> caller
//
// The writer takes every request queued (up to nvmeGroupWrites units), lays
// their records out in write units and writes them to the active segment,
// one pwritev of up to WriteBuffer bytes each, the next unit filling while
// the previous one is written. The syncer fdatasyncs the segments the
// group wrote to, commits the group's index entries in one synced pebble
// batch, and only then completes the requests. While the syncer syncs group
// n, the writer writes group n+1, and the requests arriving meanwhile make
// group n+2: under load, one sync serves many Puts. Both channels are
// bounded: the queue by QueueDepth, the groups by one waiting group.

// nvmeGroupWrites bounds a group: the writer stops taking requests into a
// group once they hold this many WriteBuffers of records.
const nvmeGroupWrites = 8

// nvmeReq is one Put or PutBatch call on its way through the pipeline.
type nvmeReq struct {
	keys []prefixhash.Key
	vals [][]byte
	locs []Loc
	n    int   // values stored: set by the writer, cleared by the syncer on a group failure
	err  error // why the values after the n-th were not stored
	done chan struct{}
	one  struct { // backing arrays for Put
		key [1]prefixhash.Key
		val [1][]byte
		loc [1]Loc
	}
}

var nvmeReqPool = sync.Pool{New: func() any { return &nvmeReq{done: make(chan struct{}, 1)} }}

func (r *nvmeReq) reset() {
	r.keys, r.vals, r.locs = nil, nil, nil
	r.one.val[0] = nil
	r.n, r.err = 0, nil
}

// nvmeEntry is one index entry to commit.
type nvmeEntry struct {
	loc Loc
	key prefixhash.Key
	n   int
	sum uint64
}

// nvmeGroup is what the writer hands the syncer: requests written together.
type nvmeGroup struct {
	reqs   []*nvmeReq
	ents   []nvmeEntry
	segs   []*segment // written to by this group, one reference each
	sealed []*segment // sealed by this group, one reference each (the writer's)
	err    error      // a write failed: no value of the group is stored
}

var nvmeGroupPool = sync.Pool{New: func() any { return new(nvmeGroup) }}

func (g *nvmeGroup) reset() {
	clear(g.reqs)
	clear(g.segs)
	clear(g.sealed)
	g.reqs, g.ents, g.segs, g.sealed = g.reqs[:0], g.ents[:0], g.segs[:0], g.sealed[:0]
	g.err = nil
}

// nvmeWriter is the writer goroutine's state. Records are laid out in
// write units of at most WriteBuffer bytes, each written by one pwritev: the
// aligned head of a large value whose memory is suitably aligned is written
// from the caller's memory (zero copy), everything else (small values, the
// unaligned tail of a value, padding, headers) is copied into the unit's
// staging buffer. Two units alternate: while one is written by a short-lived
// goroutine, the next is filled; the writer waits for that write before it
// reuses the unit, switches segments or ends a group.
type nvmeWriter struct {
	mem     []byte      // both staging buffers, one mapping outside the Go heap
	units   [2]nvmeUnit // the unit being filled is units[cur]
	cur     int
	unitOff int64 // offset in active of the current unit's first byte
	writing bool  // a write of units[cur^1] is in flight
	wrote   chan error
	active  *segment // segment being written (the writer holds a reference), or nil
	off     int64    // offset in active of the next record
	nextID  uint64   // id of the next segment
}

// nvmeUnit is one write: iov, len bytes in all, staged bytes in stage.
type nvmeUnit struct {
	stage  []byte   // staging buffer, aligned, WriteBuffer bytes
	used   int      // bytes of stage in use
	iov    [][]byte // the unit's bytes, in file order
	len    int      // bytes in iov
	staged int      // index in iov of the open staging entry, -1 if none
}

// nvmeMaxIov bounds the entries of one pwritev (IOV_MAX is 1024).
const nvmeMaxIov = 512

// nvmeZeroCopyMin is the smallest value written from (and read into) the
// caller's memory directly; below it a copy costs less than an iovec.
const nvmeZeroCopyMin = 32 << 10

func (t *NVMe) writeLoop() {
	defer t.wg.Done()
	defer close(t.groups)
	defer func() {
		if t.w.active != nil {
			t.w.active.unref()
			t.w.active = nil
		}
	}()
	limit := int64(nvmeGroupWrites) * int64(t.opts.WriteBuffer)
	for {
		var r *nvmeReq
		select {
		case r = <-t.reqs:
		case <-t.stop:
			return
		}
		g := nvmeGroupPool.Get().(*nvmeGroup)
		g.reqs = append(g.reqs, r)
		size := nvmeReqBytes(r)
	gather:
		for size < limit {
			select {
			case r = <-t.reqs:
				g.reqs = append(g.reqs, r)
				size += nvmeReqBytes(r)
			default:
				break gather
			}
		}
		t.writeGroup(g)
		t.groups <- g
	}
}

func nvmeReqBytes(r *nvmeReq) int64 {
	var n int64
	for _, v := range r.vals {
		n += segRecordLen(len(v))
	}
	return n
}

// writeGroup writes the records of g's requests and sets their locations.
func (t *NVMe) writeGroup(g *nvmeGroup) {
	for _, r := range g.reqs {
		for i, v := range r.vals {
			loc, sum, err := t.appendRecord(g, r.keys[i], v)
			if err != nil {
				r.err = err
				break
			}
			r.locs[i] = loc
			r.n = i + 1
			g.ents = append(g.ents, nvmeEntry{loc: loc, key: r.keys[i], n: len(v), sum: sum})
		}
		if g.err != nil {
			return
		}
	}
	t.flush(g)
}

// appendRecord lays out one record in write units, writing them as they
// fill, and moves to a new segment when the active one lacks room.
func (t *NVMe) appendRecord(g *nvmeGroup, key prefixhash.Key, val []byte) (Loc, uint64, error) {
	if len(val) > t.maxValue() {
		return 0, 0, fmt.Errorf("nvme: %d-byte value, segment holds %d: %w", len(val), t.maxValue(), ErrTooLarge)
	}
	w := &t.w
	recLen := segRecordLen(len(val))
	if w.active != nil && (w.active.broken.Load() || w.off+recLen > t.opts.SegmentSize) {
		if err := t.flush(g); err != nil {
			return 0, 0, err
		}
		t.seal(g)
	}
	if w.active == nil {
		if err := t.newSegment(); err != nil {
			return 0, 0, err
		}
	}
	if n := len(g.segs); n == 0 || g.segs[n-1] != w.active {
		w.active.ref()
		g.segs = append(g.segs, w.active)
	}
	loc := segLoc(w.active.id, w.off)
	sum := xxhash.Sum64(val)
	var hdr [segHeaderSize]byte
	encodeSegHeader(hdr[:], segHeader{loc: loc, key: key, n: uint64(len(val)), sum: sum})
	head := t.zeroCopyHead(val)
	if err := t.unitRef(g, val[:head]); err != nil {
		return 0, 0, err
	}
	if err := t.unitCopy(g, val[head:], len(val)-head); err != nil {
		return 0, 0, err
	}
	if err := t.unitCopy(g, nil, int(recLen)-len(val)-segHeaderSize); err != nil {
		return 0, 0, err
	}
	if err := t.unitCopy(g, hdr[:], segHeaderSize); err != nil {
		return 0, 0, err
	}
	w.off += recLen
	return loc, sum, nil
}

// zeroCopyHead returns how many leading bytes of v move between the disk
// and v's own memory: the aligned head of a large value, when the memory
// suits the I/O mode (O_DIRECT needs it aligned).
func (t *NVMe) zeroCopyHead(v []byte) int {
	if len(v) < nvmeZeroCopyMin || (t.direct && !segAligned(v)) {
		return 0
	}
	return len(v) &^ (segAlign - 1)
}

// unitRef adds p (aligned, a multiple of segAlign long) to the write units
// without copying it.
func (t *NVMe) unitRef(g *nvmeGroup, p []byte) error {
	w := &t.w
	wb := t.opts.WriteBuffer
	for len(p) > 0 {
		u := &w.units[w.cur]
		if u.len == wb || len(u.iov) == nvmeMaxIov {
			if err := t.flushAsync(g); err != nil {
				return err
			}
			u = &w.units[w.cur]
		}
		k := min(len(p), wb-u.len)
		u.iov = append(u.iov, p[:k])
		u.staged = -1
		u.len += k
		p = p[k:]
	}
	return nil
}

// unitCopy copies p into the write units, or n zero bytes if p is nil.
func (t *NVMe) unitCopy(g *nvmeGroup, p []byte, n int) error {
	w := &t.w
	wb := t.opts.WriteBuffer
	for n > 0 {
		u := &w.units[w.cur]
		if u.len == wb || u.used == len(u.stage) || (u.staged < 0 && len(u.iov) == nvmeMaxIov) {
			if err := t.flushAsync(g); err != nil {
				return err
			}
			u = &w.units[w.cur]
		}
		k := min(n, wb-u.len, len(u.stage)-u.used)
		dst := u.stage[u.used : u.used+k]
		if p != nil {
			copy(dst, p[:k])
			p = p[k:]
		} else {
			clear(dst)
		}
		if u.staged < 0 {
			u.staged = len(u.iov)
			u.iov = append(u.iov, dst)
		} else {
			e := u.iov[u.staged]
			u.iov[u.staged] = e[:len(e)+k]
		}
		u.used += k
		u.len += k
		n -= k
	}
	return nil
}

// flush writes the current unit to the active segment and waits for every
// write in flight. A failure fails the whole group (g.err), breaks the
// segment and seals it.
func (t *NVMe) flush(g *nvmeGroup) error {
	if err := t.waitWrite(g); err != nil {
		return err
	}
	w := &t.w
	u := &w.units[w.cur]
	if u.len == 0 {
		return nil
	}
	off := t.takeUnit(u)
	err := t.pwritev(w.active, u.iov, off)
	u.reset()
	if err != nil {
		return t.writeFailed(g, err)
	}
	return nil
}

// flushAsync starts writing the current unit and moves on to the other one
// once that one's write has completed.
func (t *NVMe) flushAsync(g *nvmeGroup) error {
	if err := t.waitWrite(g); err != nil {
		return err
	}
	w := &t.w
	u := &w.units[w.cur]
	off := t.takeUnit(u)
	s := w.active // g holds a reference to it until the group is synced
	w.writing = true
	go func() { w.wrote <- t.pwritev(s, u.iov, off) }()
	w.cur ^= 1
	w.units[w.cur].reset()
	return nil
}

func (t *NVMe) pwritev(s *segment, iov [][]byte, off int64) error {
	return segPwritev(t.files, s.fd, iov, off)
}

func (t *NVMe) fdatasync(s *segment) error { return t.files.Fdatasync(s.fd) }

// takeUnit returns the offset at which u goes and advances past it.
func (t *NVMe) takeUnit(u *nvmeUnit) int64 {
	w := &t.w
	if u.len%segAlign != 0 {
		panic(fmt.Sprintf("nvme: writing %d bytes, not a multiple of %d", u.len, segAlign))
	}
	off := w.unitOff
	w.unitOff += int64(u.len)
	return off
}

// reset empties u, dropping its references to callers' memory.
func (u *nvmeUnit) reset() {
	clear(u.iov)
	u.iov = u.iov[:0]
	u.used, u.len, u.staged = 0, 0, -1
}

// waitWrite waits for the write in flight, if any.
func (t *NVMe) waitWrite(g *nvmeGroup) error {
	w := &t.w
	if w.writing {
		w.writing = false
		if err := <-w.wrote; err != nil && g.err == nil {
			return t.writeFailed(g, err)
		}
	}
	return g.err
}

func (t *NVMe) writeFailed(g *nvmeGroup, err error) error {
	w := &t.w
	g.err = nvmeIOError("write", w.active.id, err)
	w.active.broken.Store(true)
	w.units[w.cur].reset()
	t.seal(g)
	return g.err
}

// seal retires the active segment: the syncer marks it sealed (droppable)
// once the group, and so every record written to it, is indexed.
func (t *NVMe) seal(g *nvmeGroup) {
	w := &t.w
	if w.units[w.cur].len != 0 || w.writing {
		panic("nvme: sealing a segment with unwritten records")
	}
	g.sealed = append(g.sealed, w.active) // the writer's reference moves to g
	w.active = nil
}

// newSegment creates, preallocates and makes durable the next segment file,
// and makes it the active one. ErrFull when Capacity or the filesystem has
// no room for it.
func (t *NVMe) newSegment() (err error) {
	size := t.opts.SegmentSize
	t.mu.Lock()
	if t.mu.reserved+size > t.opts.Capacity {
		reserved := t.mu.reserved
		t.mu.Unlock()
		return fmt.Errorf("nvme: %d bytes of segments, a new one exceeds Capacity %d: %w", reserved, t.opts.Capacity, ErrFull)
	}
	t.mu.reserved += size
	t.mu.Unlock()
	defer func() {
		if err != nil {
			t.mu.Lock()
			t.mu.reserved -= size
			t.mu.Unlock()
		}
	}()
	if t.opts.DiskHeadroom >= 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(t.segDir, &st); err != nil {
			return fmt.Errorf("nvme: statfs %s: %w", t.segDir, err)
		}
		if free := int64(st.Bavail) * st.Bsize; free < size+t.opts.DiskHeadroom {
			return fmt.Errorf("nvme: %d bytes free on %s, a segment needs %d plus %d headroom: %w", free, t.segDir, size, t.opts.DiskHeadroom, ErrFull)
		}
	}
	w := &t.w
	if w.nextID > segMaxID {
		return fmt.Errorf("nvme: segment ids exhausted: %w", ErrFull)
	}
	id := w.nextID
	w.nextID++
	path := filepath.Join(t.segDir, segFileName(id))
	fd, err := t.openSegment(path, unix.O_CREAT|unix.O_EXCL)
	if err != nil {
		return nvmeIOError("create", id, err)
	}
	fail := func(err error) error {
		unix.Close(fd)
		unix.Unlink(path)
		return nvmeIOError("create", id, err)
	}
	if err := unix.Fallocate(fd, 0, 0, size); err != nil && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return fail(err)
	}
	// The file's name must be durable before any index entry names it.
	if err := unix.Fsync(t.dirFd); err != nil {
		return fail(err)
	}
	s := &segment{id: id, fd: fd, path: path, size: size}
	s.refs.Store(2) // the map's and the writer's
	t.mu.Lock()
	t.mu.segs[id] = s
	t.mu.Unlock()
	w.active, w.off, w.unitOff = s, 0, 0
	return nil
}

// nvmeIOError wraps an I/O error; a full disk or quota becomes ErrFull too.
func nvmeIOError(op string, id uint64, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("nvme: %s segment %d: %w (%w)", op, id, ErrFull, err)
	}
	return fmt.Errorf("nvme: %s segment %d: %w", op, id, err)
}

func (t *NVMe) syncLoop() {
	defer t.wg.Done()
	var kb [idxKeyLen]byte
	var vb []byte
	for g := range t.groups {
		err := g.err
		for _, s := range g.segs {
			if err != nil {
				break
			}
			if s.broken.Load() {
				err = fmt.Errorf("nvme: segment %d: an earlier write or sync failed", s.id)
				break
			}
			if e := t.fdatasync(s); e != nil {
				s.broken.Store(true)
				err = nvmeIOError("sync", s.id, e)
			}
		}
		if err == nil && len(g.ents) > 0 {
			b := t.db.NewBatch()
			for _, e := range g.ents {
				kb[0] = idxPrefix
				putLocBE(kb[1:], e.loc)
				vb = idxEncodeVal(vb[:0], e.key, e.n, e.sum)
				if err = b.Set(kb[:], vb, nil); err != nil {
					break
				}
			}
			if err == nil {
				err = b.Commit(pebble.Sync)
			}
			b.Close()
			if err != nil {
				err = fmt.Errorf("nvme: index: %w", err)
			}
		}
		t.mu.Lock()
		if err == nil {
			for _, e := range g.ents {
				s := t.mu.segs[locSeg(e.loc)]
				if s == nil {
					panic(fmt.Sprintf("nvme: segment %d dropped while being written", locSeg(e.loc)))
				}
				s.values++
				s.bytes += int64(e.n)
				t.mu.values++
				t.mu.stored += int64(e.n)
			}
		}
		for _, s := range g.sealed {
			s.sealed = true
		}
		t.mu.Unlock()
		for _, s := range g.segs {
			s.unref()
		}
		for _, s := range g.sealed {
			s.unref()
		}
		for _, r := range g.reqs {
			if err != nil {
				r.n, r.err = 0, err
			}
			r.done <- struct{}{}
		}
		g.reset()
		nvmeGroupPool.Put(g)
	}
}
