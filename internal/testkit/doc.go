// Package testkit holds the helpers kvmesh's tests share, so that each is
// written once (raft's rafttest, pebble's internal/testutils): WaitFor, the
// one way a test waits on a condition. It is imported by tests only; no
// production package links it (internal/lint checks).
package testkit
