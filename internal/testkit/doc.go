// Package testkit holds the helpers kvmesh's tests share, so that each is
// written once (raft's rafttest, pebble's internal/testutils):
//
//   - WaitFor, the one way a test waits on a condition;
//   - ExpectCrash, InChild and CollectGarbage, for a test whose point is
//     that the process dies (the invariants build's leak reports);
//   - Child, the same child process for a parent that kills it itself
//     (the crash tests of files written in place: atomicfile);
//   - Log, what fake servers were asked, in order.
//
// The data-plane transports' conformance suite, which imports transfer,
// is transfer/transporttest.
//
// It is imported by tests only; no production package links it
// (internal/lint checks).
package testkit
