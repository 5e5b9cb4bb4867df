package tiers

import (
	"errors"
	"fmt"
	"log/slog"
)

// NVMeOptions configure an NVMe tier. The zero value of every field but Dir
// means its default.
type NVMeOptions struct {
	// Dir is the data directory: segment files go in Dir/segments, the
	// pebble index in Dir/index. Required. Two tiers must not share it
	// (pebble's lock refuses the second).
	Dir string
	// Capacity is the limit, in bytes, on all segment files together.
	// Default 10 GiB. At least SegmentSize.
	Capacity int64
	// SegmentSize is the size of one segment file in bytes: a multiple of
	// 4 KiB, from 16 KiB to 64 GiB. A value takes its length plus a 64-byte
	// header, rounded up to 4 KiB; the largest value is SegmentSize-64 bytes.
	// Default 64 MiB.
	SegmentSize int64
	// WriteBuffer is the size in bytes of each of the two aligned buffers
	// records are written through (one fills while the other is written),
	// and so of the largest write syscall: a multiple of 4 KiB. They are
	// allocated once, outside the Go heap. Default 4 MiB.
	WriteBuffer int
	// QueueDepth bounds the Put and PutBatch calls queued for the writer;
	// more callers wait. Default 256.
	QueueDepth int
	// DiskHeadroom is the free space in bytes left on the filesystem for the
	// index and everything else: a new segment is refused with ErrFull
	// unless SegmentSize+DiskHeadroom bytes are free. Default 256 MiB;
	// negative disables the check.
	DiskHeadroom int64
	// BufferedIO turns O_DIRECT off. Default false: O_DIRECT when the
	// filesystem accepts it (Open probes; a refusal is logged and the tier
	// falls back to buffered I/O).
	BufferedIO bool
	// Logger receives the recovery summary, the I/O mode fallback and
	// pebble's messages. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills the zero fields of o with their defaults.
func (o *NVMeOptions) EnsureDefaults() {
	if o.SegmentSize == 0 {
		o.SegmentSize = 64 << 20
	}
	if o.Capacity == 0 {
		o.Capacity = 10 << 30
	}
	if o.WriteBuffer == 0 {
		o.WriteBuffer = 4 << 20
	}
	if o.QueueDepth == 0 {
		o.QueueDepth = 256
	}
	if o.DiskHeadroom == 0 {
		o.DiskHeadroom = 256 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports the first field of o that is not usable, by name.
func (o *NVMeOptions) Validate() error {
	switch {
	case o.Dir == "":
		return errors.New("nvme: NVMeOptions.Dir is empty")
	case o.SegmentSize < 16<<10 || o.SegmentSize > segMaxSize || o.SegmentSize%segAlign != 0:
		return fmt.Errorf("nvme: NVMeOptions.SegmentSize %d: want a multiple of %d from 16 KiB to %d", o.SegmentSize, segAlign, segMaxSize)
	case o.Capacity < o.SegmentSize:
		return fmt.Errorf("nvme: NVMeOptions.Capacity %d: want at least SegmentSize (%d)", o.Capacity, o.SegmentSize)
	case o.WriteBuffer < segAlign || o.WriteBuffer%segAlign != 0 || o.WriteBuffer > 1<<30:
		return fmt.Errorf("nvme: NVMeOptions.WriteBuffer %d: want a multiple of %d up to 1 GiB", o.WriteBuffer, segAlign)
	case o.QueueDepth < 1:
		return fmt.Errorf("nvme: NVMeOptions.QueueDepth %d: want at least 1", o.QueueDepth)
	}
	return nil
}
