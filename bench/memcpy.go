package bench

import (
	"context"
	"fmt"
	"time"
)

// MemcpyOptions configures the memcpy limit.
type MemcpyOptions struct {
	// BlockBytes is the size of one copy() call. Required.
	BlockBytes int
	// WorkingSetBytes is the size of the source and of the destination; the
	// copies walk through them, so a working set larger than the CPU caches
	// measures memory, and one equal to BlockBytes measures a copy from
	// cache (when the block fits). Default 256 MiB, never below BlockBytes.
	WorkingSetBytes int
	// Duration is how long to copy. Default 1s.
	Duration time.Duration
}

// MemcpyResult is the memcpy limit at one block size.
type MemcpyResult struct {
	BlockBytes      int     `json:"block_bytes"`
	WorkingSetBytes int     `json:"working_set_bytes"`
	Bytes           int64   `json:"bytes" table:"wide"`
	Seconds         float64 `json:"seconds" table:"wide"`
	GBps            float64 `json:"gbps"`
}

// Memcpy measures copy() between two large buffers in blocks of
// o.BlockBytes: the ceiling of any path that copies a block once in memory.
// GB/s are 10^9 bytes copied per second.
func Memcpy(ctx context.Context, o MemcpyOptions) (MemcpyResult, error) {
	if o.BlockBytes < 1 {
		return MemcpyResult{}, fmt.Errorf("bench: memcpy: block_bytes %d must be positive", o.BlockBytes)
	}
	if o.WorkingSetBytes == 0 {
		o.WorkingSetBytes = 256 << 20
	}
	if o.Duration <= 0 {
		o.Duration = time.Second
	}
	blocks := max(1, o.WorkingSetBytes/o.BlockBytes)
	src := make([]byte, blocks*o.BlockBytes)
	dst := make([]byte, len(src))
	for i := range src { // fault every page in before the clock starts
		src[i] = byte(i)
	}
	copy(dst, src)
	var n int64
	start := time.Now()
	deadline := start.Add(o.Duration)
	for i := 0; ; i++ {
		off := (i % blocks) * o.BlockBytes
		n += int64(copy(dst[off:off+o.BlockBytes], src[off:off+o.BlockBytes]))
		if i%64 == 63 {
			if time.Now().After(deadline) {
				break
			}
			if err := ctx.Err(); err != nil {
				return MemcpyResult{}, err
			}
		}
	}
	sec := time.Since(start).Seconds()
	return MemcpyResult{BlockBytes: o.BlockBytes, WorkingSetBytes: len(src), Bytes: n, Seconds: sec, GBps: float64(n) / sec / 1e9}, nil
}
