//go:build invariants || race

package invariants

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
)

// Enabled reports whether this build runs the invariant checks.
const Enabled = true

// Leak reports a handle that is collected without having been released.
// Embed it in the handle and call Track when the handle is made, Stop when
// it is released. The zero Leak tracks nothing.
type Leak struct {
	c     runtime.Cleanup
	armed bool
}

// Track arms l for the handle at ptr, which l must live in: if ptr becomes
// unreachable before l.Stop, the process panics naming what (the handle's
// type, "store.Ref") and the stack that made it.
func Track[T any](ptr *T, l *Leak, what string) {
	l.c = runtime.AddCleanup(ptr, leaked, what+" created at:\n"+string(debug.Stack()))
	l.armed = true
}

// Stop disarms l: the handle was released.
func (l *Leak) Stop() {
	if l.armed {
		l.c.Stop()
		l.armed = false
	}
}

// leaked runs on the runtime's cleanup goroutine: stderr first, so that the
// report survives whatever the panic does to buffered output.
func leaked(where string) {
	fmt.Fprintf(os.Stderr, "invariants: leaked, never released: %s\n", where)
	panic("invariants: a handle was collected without Release: " + where)
}
