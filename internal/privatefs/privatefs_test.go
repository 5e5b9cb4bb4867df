package privatefs_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// holdEnv makes the test binary a child that holds the lock on the file it
// names until its stdin closes.
const holdEnv = "KVMESH_PRIVATEFS_HOLD"

func TestMain(m *testing.M) {
	if path := os.Getenv(holdEnv); path != "" {
		c, err := privatefs.New(nil).Lock(path)
		if err != nil {
			fmt.Println("lock:", err)
			os.Exit(1)
		}
		fmt.Println("locked")
		io.Copy(io.Discard, os.Stdin)
		c.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestLockNamesHolder: a lock another process holds is refused with a
// LockedError that names the process.
func TestLockNamesHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "LOCK")
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), holdEnv+"="+path)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		child.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	_, err = privatefs.New(nil).Lock(path)
	var le *privatefs.LockedError
	if !errors.As(err, &le) || le.PID != child.Process.Pid || !strings.Contains(err.Error(), fmt.Sprintf("process %d", child.Process.Pid)) {
		t.Fatalf("Lock of a file another process holds: %v; want a LockedError naming process %d", err, child.Process.Pid)
	}
}
