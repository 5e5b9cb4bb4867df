package privatefs

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

// Modes of what FS makes.
const (
	FileMode os.FileMode = 0o600
	DirMode  os.FileMode = 0o700
)

// FS is a vfs.FS whose files are FileMode and directories DirMode.
type FS struct {
	vfs.FS
}

var _ vfs.FS = FS{}

// New wraps fs (vfs.Default when nil).
func New(fs vfs.FS) FS {
	if fs == nil {
		fs = vfs.Default
	}
	return FS{FS: fs}
}

// Create creates name as the wrapped FS does, then narrows its mode.
func (fs FS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	return private(fs.FS.Create(name, category))
}

// OpenReadWrite opens (or creates) name as the wrapped FS does, then
// narrows its mode.
func (fs FS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return private(fs.FS.OpenReadWrite(name, category, opts...))
}

// ReuseForWrite renames oldname to newname and opens it as the wrapped FS
// does, then narrows its mode.
func (fs FS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	return private(fs.FS.ReuseForWrite(oldname, newname, category))
}

// MkdirAll makes dir and its missing parents DirMode, whatever perm asks.
func (fs FS) MkdirAll(dir string, _ os.FileMode) error {
	return fs.FS.MkdirAll(dir, DirMode)
}

// LockedError is Lock's error when another process holds the lock: PID
// names it (0 when the kernel does not say, as across PID namespaces).
type LockedError struct {
	Path string
	PID  int
	Err  error
}

func (e *LockedError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("privatefs: %s is locked by process %d", e.Path, e.PID)
	}
	return fmt.Sprintf("privatefs: %s is locked by another process", e.Path)
}

func (e *LockedError) Unwrap() error { return e.Err }

// Lock locks name as the wrapped FS does (creating it), then narrows its
// mode. When another process holds the lock, the error is a *LockedError
// naming it.
func (fs FS) Lock(name string) (io.Closer, error) {
	c, err := fs.FS.Lock(name)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return nil, &LockedError{Path: name, PID: lockHolder(name), Err: err}
	}
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(name, FileMode); err != nil {
		c.Close()
		return nil, fmt.Errorf("privatefs: %w", err)
	}
	return c, nil
}

// lockHolder returns the id of the process that holds a write lock on
// name (fcntl F_GETLK), or 0.
func lockHolder(name string) int {
	f, err := os.Open(name)
	if err != nil {
		return 0
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk); err != nil || lk.Type == unix.F_UNLCK {
		return 0
	}
	return int(lk.Pid)
}

// Unwrap returns the wrapped FS.
func (fs FS) Unwrap() vfs.FS { return fs.FS }

// private narrows the mode of a file just opened for writing through its
// descriptor, so that a rename in between cannot redirect it. A file with
// no descriptor (an in-memory FS) has no mode to narrow.
func private(f vfs.File, err error) (vfs.File, error) {
	if err != nil || f.Fd() == vfs.InvalidFd {
		return f, err
	}
	if err := unix.Fchmod(int(f.Fd()), uint32(FileMode)); err != nil {
		f.Close()
		return nil, fmt.Errorf("privatefs: fchmod: %w", err)
	}
	return f, nil
}
