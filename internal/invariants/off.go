//go:build !invariants && !race

package invariants

// Enabled reports whether this build runs the invariant checks.
const Enabled = false

// Leak is empty in a build without invariants.
type Leak struct{}

// Track does nothing in a build without invariants.
func Track[T any](ptr *T, l *Leak, what string) {}

// Stop does nothing in a build without invariants.
func (l *Leak) Stop() {}
