// Package testkit holds the helpers kvmesh's tests share, so that each is
// written once (raft's rafttest, pebble's internal/testutils):
//
//   - WaitFor, the one way a test waits on a condition;
//   - ExpectCrash, InChild and CollectGarbage, for a test whose point is
//     that the process dies (the invariants build's leak reports);
//   - transportsuite, beside it, the conformance suite of the data-plane
//     transports.
//
// It is imported by tests only; no production package links it
// (internal/lint checks).
package testkit
