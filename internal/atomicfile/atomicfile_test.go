package atomicfile

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// version is the content of version v of the crash test's file: 4 MiB, so
// that a write takes long enough to be killed in the middle of, and every
// byte says which version it belongs to.
func version(v int) []byte {
	line := fmt.Appendf(nil, "version %08d\n", v)
	return bytes.Repeat(line, (4<<20)/len(line))
}

// versionOf returns the version a file's content is, or -1 when it is not
// one whole version (torn, empty, mixed).
func versionOf(b []byte) int {
	line, _, ok := bytes.Cut(b, []byte("\n"))
	var v int
	if !ok || len(line) != len("version 00000000") {
		return -1
	}
	v, err := strconv.Atoi(string(line[len("version "):]))
	if err != nil || !bytes.Equal(b, version(v)) {
		return -1
	}
	return v
}

// crashDirEnv and crashFromEnv tell the child where to write, and its first
// version.
const (
	crashDirEnv  = "KVMESH_ATOMICFILE_DIR"
	crashFromEnv = "KVMESH_ATOMICFILE_FROM"
)

// TestWriteCrash: a child writes version after version of a file and says
// each once Write returned; the parent kills it (SIGKILL) as soon as it has
// read a few of them, so most of the time in the middle of a Write.
// The file is then the last version acknowledged or the one after, whole;
// the next Write replaces it and leaves no temporary file.
func TestWriteCrash(t *testing.T) {
	if testkit.InChild(t) {
		writeForever(t, os.Getenv(crashDirEnv), os.Getenv(crashFromEnv))
		return
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	if err := Write(path, version(0), 0o600); err != nil {
		t.Fatal(err)
	}
	last, leftovers := 0, 0
	const rounds = 6
	for round := range rounds {
		cmd := testkit.Child(t)
		cmd.Env = append(cmd.Env, crashDirEnv+"="+dir, crashFromEnv+"="+strconv.Itoa(last+1))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		acks := bufio.NewScanner(out)
		for range 1 + (round*7)%5 { // 1..5 acknowledged writes, then the kill
			if !acks.Scan() {
				cmd.Wait()
				t.Fatalf("round %d: the child stopped before its writes were acknowledged:\n%s", round, stderr.Bytes())
			}
			v, err := strconv.Atoi(acks.Text())
			if err != nil {
				t.Fatalf("round %d: the child said %q", round, acks.Text())
			}
			last = v
		}
		cmd.Process.Signal(syscall.SIGKILL)
		for acks.Scan() { // acknowledged before it died, not read yet
			if v, err := strconv.Atoi(acks.Text()); err == nil {
				last = v
			}
		}
		cmd.Wait()

		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("round %d: after the kill: %v", round, err)
		}
		if v := versionOf(b); v != last && v != last+1 {
			t.Fatalf("round %d: after the kill the file is version %d (-1: not a whole version); want %d, the last acknowledged, or %d", round, v, last, last+1)
		} else {
			last = v
		}
		if _, err := os.Stat(path + TempSuffix); err == nil {
			leftovers++ // killed in the middle of a write: the next one clears it
		}
		last++
		if err := Write(path, version(last), 0o600); err != nil {
			t.Fatalf("round %d: the Write after the kill: %v", round, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Fatalf("round %d: after a Write the directory holds %v; want the file alone", round, entries)
		}
		if b, _ := os.ReadFile(path); versionOf(b) != last {
			t.Fatalf("round %d: the Write after the kill left version %d, want %d", round, versionOf(b), last)
		}
	}
	t.Logf("%d of %d kills left a temporary file, which the next Write cleared", leftovers, rounds)
}

// writeForever is the child: it writes versions from (a number) on and
// prints each once its Write returned, until it is killed.
func writeForever(t *testing.T, dir, from string) {
	v, err := strconv.Atoi(from)
	if err != nil {
		t.Fatalf("child: %s=%q", crashFromEnv, from)
	}
	path := filepath.Join(dir, "state")
	b := version(v)
	for ; ; v++ {
		if err := Write(path, b, 0o600); err != nil {
			t.Fatalf("child: %v", err)
		}
		next := version(v + 1) // before the acknowledgement: the kill that follows it finds a Write running
		fmt.Println(v)         // stdout is a pipe: unbuffered
		b = next
	}
}

// TestWrite: a Write replaces the content with the mode asked for, also
// over a temporary file a crash left; a Write that fails leaves the old
// content and no temporary file.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path+TempSuffix, []byte("torn by a crash"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "one" {
		t.Fatalf("after Write: %q, %v", b, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if err := Write(path, []byte("public"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v; want 0644", fi.Mode(), err)
	}

	// The rename fails: the target is a directory that is not empty.
	target := filepath.Join(dir, "d")
	if err := os.MkdirAll(filepath.Join(target, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("two"), 0o600); err == nil {
		t.Fatal("a Write over a directory succeeded")
	}
	if _, err := os.Stat(target + TempSuffix); err == nil {
		t.Error("a failed Write left its temporary file")
	}
	if err := Write(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600); err == nil {
		t.Error("a Write into a missing directory succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("the directory holds %v; want f and d", entries)
	}
}
