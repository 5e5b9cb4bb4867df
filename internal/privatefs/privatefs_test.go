package privatefs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/kvmesh/kvmesh/internal/privatefs"
)

// TestPebbleFilesArePrivate opens a pebble database through FS under a
// permissive umask, writes, flushes and reopens it, and finds every file
// 0600 and every directory 0700: MANIFEST, OPTIONS, LOCK, WAL, sstables.
func TestPebbleFilesArePrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "db", "nested")
	for range 2 {
		db, err := pebble.Open(dir, &pebble.Options{FS: privatefs.New(nil)})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Set([]byte("k"), []byte("v"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var files int
	err := filepath.WalkDir(filepath.Dir(dir), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := privatefs.FileMode
		if d.IsDir() {
			want = privatefs.DirMode
		} else {
			files++
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, info.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 4 {
		t.Fatalf("pebble left %d files; want MANIFEST, OPTIONS, LOCK, a WAL and an sstable", files)
	}
	if _, err := os.Stat(filepath.Join(dir, "LOCK")); err != nil {
		t.Fatal(err)
	}
}
