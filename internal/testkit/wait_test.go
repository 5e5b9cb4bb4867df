package testkit

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

// TestWaitForPolls: WaitFor returns once cond holds, having called it until
// then and not after.
func TestWaitForPolls(t *testing.T) {
	var calls atomic.Int32
	WaitFor(t, "the fifth call", func() bool { return calls.Add(1) == 5 })
	if n := calls.Load(); n != 5 {
		t.Fatalf("cond called %d times, want 5", n)
	}
}

// TestWaitForFails: a condition that never holds fails the test with what
// was awaited, once the limit has passed.
func TestWaitForFails(t *testing.T) {
	f := &fatalTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != f {
				panic(r)
			}
		}()
		waitFor(f, 0, "the impossible", func() bool { return false })
	}()
	if !strings.Contains(f.msg, "the impossible") {
		t.Fatalf("WaitFor failed with %q, want a message naming what it waited for", f.msg)
	}
}

// fatalTB records a Fatalf and unwinds instead of ending the test, so that
// WaitFor's failure can be observed.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}
