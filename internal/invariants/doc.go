// Package invariants switches on the checks that are too costly, or too
// loud, for a production binary (pebble's internal/invariants), at the
// operations themselves, where a past bug would have shown:
//
//   - tiers: a DRAM read or view of a location that holds no value (an
//     index kept a freed slot, whose stale bytes would be served); an NVMe
//     free of a location the tier no longer holds (freed twice, or in a
//     segment reclaim dropped), and segment counts below zero;
//   - store: an index entry released while still in the table, a list or
//     the prefix tree, or with pins (a child would name a parent that is
//     gone); a block linked to a parent that is no block in the table; the
//     count of live Refs or of operations in flight below zero; and, when
//     a Local closes, its accounting and its index against the tiers
//     (store.Stats.Check; every indexed location held, once);
//   - leak reports for handles (store.Ref, transfer.Result) that become
//     garbage without Release.
//
// Each check has a test that makes the broken state in a child process and
// expects the crash (testkit.ExpectCrash). The store's model tests run the
// accounting and index check after every operation, in every build.
//
// The checks are on in a build with the invariants tag, and in every -race
// build, which is how CI runs the tests (go test -race ./...); a normal
// build compiles them away: Enabled is a constant false and Leak is empty.
//
// A broken invariant is a bug: the checks panic with a message that says
// what broke and, for a leak, where the handle was made.
package invariants
