package tiers

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A reserved slot is filled through a second mapping of the arena's memfd,
// as a same-host client fills it, and reads back through the tier.
func TestDRAMReserveThroughSharedMapping(t *testing.T) {
	d := newTestDRAM(t, DRAMOptions{Capacity: 4 << 20, SlabSize: 1 << 20})
	mem, fd := d.Arena()
	other, err := unix.Mmap(fd, 0, len(mem), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(other)

	want := bytes.Repeat([]byte("kvmesh-reserve!"), 1000)
	loc, buf, err := d.Reserve(testKey(1), len(want))
	if err != nil {
		t.Fatal(err)
	}
	if len(buf) != len(want) || cap(buf) != len(want) {
		t.Fatalf("reserved %d bytes (cap %d), want %d", len(buf), cap(buf), len(want))
	}
	off := int(uintptr(unsafe.Pointer(&buf[0])) - uintptr(unsafe.Pointer(&mem[0])))
	copy(other[off:], want)
	got := make([]byte, len(want))
	if err := d.Read(loc, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes written through the shared mapping differ from the tier's")
	}
	if s := d.Stats(); s.Values != 1 || s.Stored != int64(len(want)) {
		t.Fatalf("stats %+v after one reservation", s)
	}
	// Freeing abandons the reservation: the slab goes back to the pool.
	d.Free(loc)
	if s := d.Stats(); s.Values != 0 || s.Reserved != 0 {
		t.Fatalf("stats %+v after freeing the only reservation", s)
	}
	if _, _, err := d.Reserve(testKey(2), 8<<20); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("reserving more than a slab: %v, want ErrTooLarge", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Reserve(testKey(3), 64); !errors.Is(err, ErrClosed) {
		t.Fatalf("reserve after Close: %v, want ErrClosed", err)
	}
	if m, fd := d.Arena(); m != nil || fd != -1 {
		t.Fatal("Arena after Close returned a mapping")
	}
}
