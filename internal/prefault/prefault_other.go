//go:build !linux

package prefault

import "errors"

// MinBytes is the smallest write Write populates for.
const MinBytes = 64 << 10

// Write does nothing where the kernel has no MADV_POPULATE_WRITE.
func Write(b []byte) {}

// All writes a zero into each page of mem.
func All(mem []byte) error {
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 0
	}
	return nil
}

// Resident is not known where there is no mincore.
func Resident(mem []byte) (int, error) { return 0, errors.ErrUnsupported }
