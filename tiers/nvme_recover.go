package tiers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// checkFormat reads the index's format. An index of another kvmesh-nvme
// format (an older kvmesh, another key format) is emptied with its segment
// files, in one logged step: its blocks are unreadable to this build. A
// format from elsewhere is an error: the directory is not ours to clear.
func (t *NVMe) checkFormat() error {
	v, closer, err := t.db.Get(idxFormatKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return t.setFormat()
	case err != nil:
		return fmt.Errorf("nvme: read index format: %w", err)
	}
	old := string(v)
	closer.Close()
	if old == idxFormat {
		return nil
	}
	if !strings.HasPrefix(old, idxFormatFamily) {
		return fmt.Errorf("nvme: index format %q, want %q", old, idxFormat)
	}
	return t.dropOtherFormat(old)
}

func (t *NVMe) setFormat() error {
	if err := t.db.Set(idxFormatKey, []byte(idxFormat), pebble.Sync); err != nil {
		return fmt.Errorf("nvme: write index format: %w", err)
	}
	return nil
}

// dropOtherFormat deletes every index entry and segment file written under
// index format old, then records this build's format.
func (t *NVMe) dropOtherFormat(old string) error {
	var values int64
	it, err := t.db.NewIter(&pebble.IterOptions{LowerBound: []byte{idxPrefix}, UpperBound: []byte{idxPrefix + 1}})
	if err != nil {
		return fmt.Errorf("nvme: index: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		values++
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("nvme: index: %w", err)
	}
	// Entries first: a crash between the two steps leaves files with no
	// entries, which recovery removes.
	if err := t.db.DeleteRange([]byte{idxPrefix}, []byte{idxPrefix + 1}, pebble.Sync); err != nil {
		return fmt.Errorf("nvme: drop %s index: %w", old, err)
	}
	ents, err := os.ReadDir(t.segDir)
	if err != nil {
		return fmt.Errorf("nvme: %w", err)
	}
	var segs, bytes int64
	for _, e := range ents {
		if _, ok := parseSegFileName(e.Name()); !ok {
			continue
		}
		if fi, err := e.Info(); err == nil {
			bytes += fi.Size()
		}
		if err := os.Remove(filepath.Join(t.segDir, e.Name())); err != nil {
			return fmt.Errorf("nvme: drop %s segment: %w", old, err)
		}
		segs++
	}
	if err := unix.Fsync(t.dirFd); err != nil {
		return fmt.Errorf("nvme: sync %s: %w", t.segDir, err)
	}
	if err := t.setFormat(); err != nil {
		return err
	}
	t.log.Warn("nvme: dropped segments written by another kvmesh format: their block keys are not this build's",
		"dir", t.opts.Dir, "segments", segs, "values", values, "bytes", bytes,
		"format", old, "want", idxFormat, "key_version", prefixhash.KeyVersion)
	return nil
}

// recover rebuilds the segment table from the segment files and the index,
// deleting entries that name missing bytes, then removes empty segments and
// truncates the others after their last indexed record.
func (t *NVMe) recover() error {
	ents, err := os.ReadDir(t.segDir)
	if err != nil {
		return fmt.Errorf("nvme: %w", err)
	}
	type segInfo struct {
		size, end, values, bytes int64
	}
	found := make(map[uint64]*segInfo)
	var maxID uint64
	for _, e := range ents {
		id, ok := parseSegFileName(e.Name())
		if !ok {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return fmt.Errorf("nvme: %w", err)
		}
		found[id] = &segInfo{size: fi.Size()}
		maxID = max(maxID, id)
	}

	it, err := t.db.NewIter(&pebble.IterOptions{LowerBound: []byte{idxPrefix}, UpperBound: []byte{idxPrefix + 1}})
	if err != nil {
		return fmt.Errorf("nvme: index: %w", err)
	}
	b := t.db.NewBatch()
	defer b.Close()
	var dropped int
	for it.First(); it.Valid(); it.Next() {
		loc, ok := idxDecodeKey(it.Key())
		_, n, _, vok := idxDecodeVal(it.Value())
		si := found[locSeg(loc)]
		if !ok || !vok || si == nil || locOff(loc)+segRecordLen(n) > si.size {
			if err := b.Delete(it.Key(), nil); err != nil {
				it.Close()
				return fmt.Errorf("nvme: index: %w", err)
			}
			dropped++
			continue
		}
		si.end = max(si.end, locOff(loc)+segRecordLen(n))
		si.values++
		si.bytes += int64(n)
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("nvme: index: %w", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("nvme: index: %w", err)
	}

	// The newest segment with entries was being written when the process
	// stopped: read its records back, and drop those that fail (a disk that
	// acknowledged a flush it had not done).
	var newest uint64
	for id, si := range found {
		if si.values > 0 && id > newest {
			newest = id
		}
	}
	if newest != 0 {
		si := found[newest]
		bad, err := t.verifySegment(newest)
		if err != nil {
			return err
		}
		si.values, si.bytes, si.end = 0, 0, 0
		b := t.db.NewBatch()
		defer b.Close()
		lo, hi := idxSegBounds(newest)
		err = t.scan(lo, hi, func(r Record) bool {
			if bad[r.Loc] {
				err := b.Delete(idxKey(r.Loc), nil)
				return err == nil
			}
			si.values++
			si.bytes += int64(r.Len)
			si.end = max(si.end, locOff(r.Loc)+segRecordLen(r.Len))
			return true
		})
		if err == nil {
			err = b.Commit(pebble.Sync)
		}
		if err != nil {
			return fmt.Errorf("nvme: index: %w", err)
		}
		dropped += len(bad)
	}

	var removed, truncated int64
	for id, si := range found {
		path := filepath.Join(t.segDir, segFileName(id))
		if si.values == 0 {
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("nvme: remove empty segment: %w", err)
			}
			removed++
			continue
		}
		if si.size > si.end {
			if err := os.Truncate(path, si.end); err != nil {
				return fmt.Errorf("nvme: truncate segment: %w", err)
			}
			truncated += si.size - si.end
			si.size = si.end
		}
		fd, err := t.openSegment(path, 0)
		if err != nil {
			return err
		}
		s := &segment{id: id, fd: fd, path: path, size: si.size, values: si.values, bytes: si.bytes, sealed: true}
		s.refs.Store(1)
		t.mu.segs[id] = s
		t.mu.reserved += s.size
		t.mu.values += s.values
		t.mu.stored += s.bytes
	}
	if err := unix.Fsync(t.dirFd); err != nil {
		return fmt.Errorf("nvme: sync %s: %w", t.segDir, err)
	}
	t.w.nextID = maxID + 1
	t.log.Info("nvme: recovered", "dir", t.opts.Dir, "segments", len(t.mu.segs),
		"values", t.mu.values, "bytes", t.mu.stored, "dropped_entries", dropped,
		"removed_segments", removed, "truncated_bytes", truncated, "direct_io", t.direct)
	return nil
}

// verifySegment reads back every indexed record of segment id and returns
// those that fail their checks.
func (t *NVMe) verifySegment(id uint64) (map[Loc]bool, error) {
	fd, err := t.openSegment(filepath.Join(t.segDir, segFileName(id)), 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	bad := make(map[Loc]bool)
	lo, hi := idxSegBounds(id)
	err = t.scan(lo, hi, func(r Record) bool {
		bp, class := segGetBuf(max(int64(r.Len), 1))
		if err := t.readRecord(fd, r.Loc, (*bp)[:r.Len]); err != nil {
			t.log.Warn("nvme: recovery: dropping a value of the last segment", "loc", r.Loc, "err", err)
			bad[r.Loc] = true
		}
		segPutBuf(bp, class)
		return true
	})
	return bad, err
}
