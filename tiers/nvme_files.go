package tiers

import "golang.org/x/sys/unix"

// fileOps are the system calls the NVMe tier's data path makes on segment
// files: writes, reads and syncs. They are the seam where tests inject
// EIO, ENOSPC and short transfers (pebble's vfs and errorfs), without a
// failing disk. Opening, recovery and directory syncs call the system
// directly.
type fileOps interface {
	Pwritev(fd int, iov [][]byte, off int64) (int, error)
	Preadv(fd int, iov [][]byte, off int64) (int, error)
	Fdatasync(fd int) error
}

// sysFiles are the system's calls, what every NVMe tier uses outside tests.
type sysFiles struct{}

var _ fileOps = sysFiles{}

func (sysFiles) Pwritev(fd int, iov [][]byte, off int64) (int, error) {
	return unix.Pwritev(fd, iov, off)
}

func (sysFiles) Preadv(fd int, iov [][]byte, off int64) (int, error) {
	return unix.Preadv(fd, iov, off)
}

func (sysFiles) Fdatasync(fd int) error { return unix.Fdatasync(fd) }
