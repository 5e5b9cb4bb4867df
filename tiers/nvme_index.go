package tiers

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/cockroachdb/pebble/v2"
)

// OldestSegment returns the oldest sealed segment and the values its index
// still names (freed values are not listed).
func (t *NVMe) OldestSegment() (uint64, []Record, bool, error) {
	if !t.enter() {
		return 0, nil, false, ErrClosed
	}
	defer t.leave()
	var oldest uint64
	t.mu.RLock()
	for id, s := range t.mu.segs {
		if s.sealed && (oldest == 0 || id < oldest) {
			oldest = id
		}
	}
	t.mu.RUnlock()
	if oldest == 0 {
		return 0, nil, false, nil
	}
	lo, hi := idxSegBounds(oldest)
	var recs []Record
	err := t.scan(lo, hi, func(r Record) bool { recs = append(recs, r); return true })
	if err != nil {
		return 0, nil, false, err
	}
	return oldest, recs, true, nil
}

// scan calls fn for every well-formed index entry in [lo, hi).
func (t *NVMe) scan(lo, hi []byte, fn func(Record) bool) error {
	it, err := t.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("nvme: index: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		loc, ok := idxDecodeKey(it.Key())
		key, n, _, vok := idxDecodeVal(it.Value())
		if !ok || !vok {
			continue
		}
		if !fn(Record{Key: key, Loc: loc, Len: n}) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("nvme: index: %w", err)
	}
	return nil
}

// DropSegment deletes a sealed segment: its index entries, then its file.
// Reads in flight complete (the file is closed by the last of them). Dropping
// a segment that does not exist is a no-op; the segment being written cannot
// be dropped.
func (t *NVMe) DropSegment(id uint64) error {
	if !t.enter() {
		return ErrClosed
	}
	defer t.leave()
	t.mu.Lock()
	s := t.mu.segs[id]
	if s == nil {
		t.mu.Unlock()
		return nil
	}
	if !s.sealed {
		t.mu.Unlock()
		return fmt.Errorf("nvme: drop segment %d: it is being written", id)
	}
	delete(t.mu.segs, id)
	t.mu.reserved -= s.size
	t.mu.values -= s.values
	t.mu.stored -= s.bytes
	t.mu.Unlock()
	defer s.unref()
	lo, hi := idxSegBounds(id)
	if err := t.db.DeleteRange(lo, hi, pebble.Sync); err != nil {
		// The file goes anyway: on the next open, entries naming a missing
		// segment are deleted.
		err = fmt.Errorf("nvme: drop segment %d: index: %w", id, err)
		if rerr := os.Remove(s.path); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return err
	}
	if err := os.Remove(s.path); err != nil {
		return fmt.Errorf("nvme: drop segment %d: %w", id, err)
	}
	return nil
}

// Range calls fn for every value in the index, in Loc order, until fn
// returns false. Called after OpenNVMe, it reports what survived the last
// shutdown or crash. Values stored or dropped while Range runs may or may not
// be reported.
func (t *NVMe) Range(fn func(Record) bool) error {
	if !t.enter() {
		return ErrClosed
	}
	defer t.leave()
	return t.scan([]byte{idxPrefix}, []byte{idxPrefix + 1}, func(r Record) bool {
		t.mu.RLock()
		live := t.mu.segs[locSeg(r.Loc)] != nil
		t.mu.RUnlock()
		return !live || fn(r)
	})
}

// nvmePebbleLogger sends pebble's messages to slog; pebble's Fatalf must not
// return, so it panics after logging.
type nvmePebbleLogger struct{ log *slog.Logger }

func (l nvmePebbleLogger) Infof(format string, args ...any) {
	l.log.Debug("nvme: pebble: " + fmt.Sprintf(format, args...))
}

func (l nvmePebbleLogger) Errorf(format string, args ...any) {
	l.log.Error("nvme: pebble: " + fmt.Sprintf(format, args...))
}

func (l nvmePebbleLogger) Fatalf(format string, args ...any) {
	msg := "nvme: pebble: " + fmt.Sprintf(format, args...)
	l.log.Error(msg)
	panic(msg)
}
