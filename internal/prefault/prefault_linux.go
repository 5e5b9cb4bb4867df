package prefault

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MinBytes is the smallest write Write populates for: below it, the
// system call costs about what the faults it saves do.
const MinBytes = 64 << 10

var pageMask = uintptr(unix.Getpagesize() - 1)

// Write maps the pages under b writable in this process, allocating those
// not yet in memory, so that writing b then takes no page fault. b must lie
// in a shared writable mapping whose pages around it are this process's to
// touch (the page-aligned span covering b is populated, and populating
// writes nothing). It does nothing for b shorter than MinBytes or where the
// kernel cannot populate (it is only speed: the write faults as before).
func Write(b []byte) {
	if len(b) < MinBytes {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	end := start + uintptr(len(b))
	lo := start &^ pageMask
	hi := (end + pageMask) &^ pageMask
	// The span reaches past b into its pages' neighbours: a raw call, as
	// no Go slice may name them.
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, lo, hi-lo, unix.MADV_POPULATE_WRITE)
}

// All backs the whole of mem, a shared writable mapping whose start is
// page-aligned, with memory: in one call where the kernel has
// MADV_POPULATE_WRITE, else by writing a zero into each page (for new
// pages, what they hold).
func All(mem []byte) error {
	err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	if err == nil || !errors.Is(err, unix.EINVAL) {
		return err
	}
	page := unix.Getpagesize()
	for i := 0; i < len(mem); i += page {
		mem[i] = 0
	}
	return nil
}

// Resident counts the pages of mem, a mapping whose start is page-aligned,
// that are in memory (mincore): what Write and All back, and what a tier
// returns to the kernel takes away.
func Resident(mem []byte) (int, error) {
	page := unix.Getpagesize()
	vec := make([]byte, (len(mem)+page-1)/page)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(mem))), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return 0, errno
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n, nil
}
