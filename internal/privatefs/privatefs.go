package privatefs

import (
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

// Lock locks name as the wrapped FS does (creating it), then narrows its
// mode.
func (fs FS) Lock(name string) (io.Closer, error) {
	c, err := fs.FS.Lock(name)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(name, FileMode); err != nil {
		c.Close()
		return nil, fmt.Errorf("privatefs: %w", err)
	}
	return c, nil
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
