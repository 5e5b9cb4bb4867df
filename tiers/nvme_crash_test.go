package tiers

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// The crash test runs the test binary again as a child (TestCrashChild) that
// writes to an NVMe tier from several goroutines and prints a line for every
// value as soon as its Put returned; the parent kills it with SIGKILL at a
// random moment, reopens the directory and checks that every acknowledged
// value is there, intact, and that nothing it reads back is wrong.
const (
	crashDirEnv   = "KVMESH_NVME_CRASH_DIR"
	crashRoundEnv = "KVMESH_NVME_CRASH_ROUND"
	crashWorkers  = 4
	crashPuts     = 60 // calls per worker per round
)

func nvmeCrashOptions(dir string) NVMeOptions {
	o := nvmeTestOptions(dir)
	o.SegmentSize, o.Capacity, o.WriteBuffer = 1<<20, 1<<30, 64<<10
	return o
}

// nvmeCrashLen is the length of the value stored under k in the crash test: up
// to 16 KB, or to 100 KB for one key in five (large values take the
// zero-copy path).
func nvmeCrashLen(k prefixhash.Key) int {
	if k.Hi()%5 == 0 {
		return int(k.Lo() % 100_000)
	}
	return int(k.Lo() % 16_000)
}

func TestNVMeCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: -short")
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(11, 12))
	required := make(map[prefixhash.Key]bool) // acknowledged and not freed
	const rounds = 6
	deadline := time.Now().Add(30 * time.Second)
	var acked, killed int
	for round := 1; round <= rounds && time.Now().Before(deadline); round++ {
		// Kill at a random acknowledgement count; 0 kills during open and
		// recovery.
		killAt := rng.IntN(400)
		if rng.IntN(8) == 0 {
			killAt = 0
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashRoundEnv+"="+strconv.Itoa(round))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		kill := func() {
			if err := cmd.Process.Signal(syscall.SIGKILL); err == nil {
				killed++
			}
		}
		if killAt == 0 {
			kill()
		}
		sc := bufio.NewScanner(out)
		var acks int
		for sc.Scan() {
			kind, hexKey, ok := strings.Cut(sc.Text(), " ")
			if !ok || (kind != "A" && kind != "F") {
				continue
			}
			k, err := prefixhash.ParseKey(hexKey)
			if err != nil {
				continue // a line cut short by the kill
			}
			if kind == "F" {
				delete(required, k)
				continue
			}
			required[k] = true
			acked++
			if acks++; acks == killAt {
				kill()
			}
		}
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); err != nil && !(ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL) {
			t.Fatalf("round %d: child: %v\n%s", round, err, stderr.Bytes())
		}
		nvmeCheckCrashDir(t, dir, round, required)
	}
	t.Logf("%d values acknowledged, %d children killed, %d values required at the end", acked, killed, len(required))
}

// nvmeCheckCrashDir reopens dir and checks every value it holds and every value
// required.
func nvmeCheckCrashDir(t *testing.T, dir string, round int, required map[prefixhash.Key]bool) {
	t.Helper()
	n, err := OpenNVMe(nvmeCrashOptions(dir))
	if err != nil {
		t.Fatalf("round %d: reopen: %v", round, err)
	}
	defer n.Close()
	found := make(map[prefixhash.Key]bool)
	err = n.Range(func(r Record) bool {
		if r.Len != nvmeCrashLen(r.Key) {
			t.Errorf("round %d: %v recovered with length %d, want %d", round, r.Key, r.Len, nvmeCrashLen(r.Key))
			return false
		}
		got := make([]byte, r.Len)
		if err := n.Read(r.Loc, got); err != nil {
			t.Errorf("round %d: read %v: %v", round, r.Key, err)
			return false
		}
		if !bytes.Equal(got, nvmeTestVal(r.Key, r.Len)) {
			t.Errorf("round %d: %v: wrong bytes", round, r.Key)
			return false
		}
		found[r.Key] = true
		return true
	})
	if err != nil {
		t.Fatalf("round %d: Range: %v", round, err)
	}
	if t.Failed() {
		t.FailNow()
	}
	for k := range required {
		if !found[k] {
			t.Fatalf("round %d: acknowledged %v lost", round, k)
		}
	}
}

// TestCrashChild is the child of TestNVMeCrash; it does nothing unless
// crashDirEnv is set.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("the child of TestNVMeCrash")
	}
	round, _ := strconv.Atoi(os.Getenv(crashRoundEnv))
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
		os.Exit(3)
	}
	n, err := OpenNVMe(nvmeCrashOptions(dir))
	if err != nil {
		fail("open: %v", err)
	}
	var outMu sync.Mutex
	say := func(kind string, k prefixhash.Key) {
		outMu.Lock()
		os.Stdout.WriteString(kind + " " + k.String() + "\n")
		outMu.Unlock()
	}
	// As an owner would: free some recovered values and, every other round,
	// drop the oldest segment. Each is announced before it happens.
	var recovered []Record
	if err := n.Range(func(r Record) bool { recovered = append(recovered, r); return true }); err != nil {
		fail("range: %v", err)
	}
	for i, r := range recovered {
		if i%10 == round%10 {
			say("F", r.Key)
			n.Free(r.Loc)
		}
	}
	if round%2 == 0 {
		if seg, recs, ok, err := n.OldestSegment(); err != nil {
			fail("oldest: %v", err)
		} else if ok {
			for _, r := range recs {
				say("F", r.Key)
			}
			if err := n.DropSegment(seg); err != nil {
				fail("drop: %v", err)
			}
		}
	}
	var wg sync.WaitGroup
	for w := range crashWorkers {
		wg.Go(func() {
			for i := 0; i < crashPuts; i++ {
				k := nvmeTestKey(uint64(round)<<40 | uint64(w)<<32 | uint64(i)<<2)
				if i%3 != 0 {
					if _, err := n.Put(k, nvmeTestVal(k, nvmeCrashLen(k))); err != nil {
						fail("put: %v", err)
					}
					say("A", k)
					continue
				}
				keys := make([]prefixhash.Key, 1+i%4)
				vals := make([][]byte, len(keys))
				for j := range keys {
					keys[j] = nvmeTestKey(uint64(round)<<40 | uint64(w)<<32 | uint64(i)<<2 | uint64(j))
					vals[j] = nvmeTestVal(keys[j], nvmeCrashLen(keys[j]))
				}
				if stored, err := n.PutBatch(keys, vals, make([]Loc, len(keys))); err != nil {
					fail("put batch: %d stored: %v", stored, err)
				}
				for _, k := range keys {
					say("A", k)
				}
			}
		})
	}
	wg.Wait()
	if err := n.Close(); err != nil {
		fail("close: %v", err)
	}
}
