// Package invariants switches on the checks that are too costly, or too
// loud, for a production binary (pebble's internal/invariants): the store's
// accounting checked when a Local closes, and leak reports for handles
// (store.Ref, transfer.Result) that become garbage without Release.
//
// The checks are on in a build with the invariants tag, and in every -race
// build, which is how CI runs the tests (go test -race ./...); a normal
// build compiles them away: Enabled is a constant false and Leak is empty.
//
// A broken invariant is a bug: the checks panic with a message that says
// what broke and, for a leak, where the handle was made.
package invariants
