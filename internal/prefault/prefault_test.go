//go:build linux

package prefault

import (
	"testing"

	"golang.org/x/sys/unix"
)

func resident(t *testing.T, mem []byte) int {
	t.Helper()
	n, err := Resident(mem)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func memfd(t *testing.T, size int) []byte {
	t.Helper()
	fd, err := unix.MemfdCreate("prefault-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

// TestWrite checks that Write backs the pages under a slice (and only the
// span around it), leaves their bytes alone, and skips small slices.
func TestWrite(t *testing.T) {
	page := unix.Getpagesize()
	mem := memfd(t, 64*page)
	mem[20*page+7] = 42
	b := mem[3*page+100 : 3*page+100+MinBytes] // unaligned at both ends
	Write(b)
	want := (MinBytes + 100 + page - 1) / page
	if got := resident(t, mem); got != want && got != want+1 {
		t.Fatalf("%d pages resident after Write of %d bytes, want %d (or %d with the page written before)", got, len(b), want, want+1)
	}
	if got := resident(t, mem[:3*page]); got != 0 {
		t.Fatalf("%d pages before the span resident", got)
	}
	if mem[20*page+7] != 42 {
		t.Fatal("Write changed a byte")
	}
	Write(mem[40*page : 40*page+MinBytes-1])
	if got := resident(t, mem[40*page:]); got != 0 {
		t.Fatalf("Write of %d bytes populated %d pages", MinBytes-1, got)
	}
}

func TestAll(t *testing.T) {
	page := unix.Getpagesize()
	mem := memfd(t, 16*page)
	if err := All(mem); err != nil {
		t.Fatal(err)
	}
	if got := resident(t, mem); got != 16 {
		t.Fatalf("%d of 16 pages resident after All", got)
	}
}
