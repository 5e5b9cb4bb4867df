// Package atomicfile replaces a small file's content all at once and
// durably: a reader, or the node after a crash, finds the old content or
// the new, never a torn, empty or lost file. The node keeps its id, its
// quotas, its ready file and its callback secret this way.
//
// Write puts the new content in a temporary file beside the target (the
// target's name and ".tmp"), syncs it, renames it over the target and
// syncs the directory, so that the rename itself survives a power loss. A
// Write that fails removes its temporary file; a crash in the middle of
// one may leave it, and the next Write to the same path truncates and
// renames it away. Writes to one path must not run at once (the callers
// write their file from one goroutine, or under a lock).
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// TempSuffix names the temporary file of a Write: path + TempSuffix.
const TempSuffix = ".tmp"

// Write replaces the file at path with b, with mode perm (whatever the
// umask): old content or new, even across a crash. The directory must
// exist.
func Write(path string, b []byte, perm fs.FileMode) (err error) {
	tmp := path + TempSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp) // nothing there once renamed
		}
	}()
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(perm) // a stale temporary file keeps its mode through O_TRUNC
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("atomicfile: sync %s: %w", dir, err)
	}
	return nil
}
