package testkit

import (
	"testing"
	"time"
)

// WaitLimit is how long WaitFor waits before it fails the test: long enough
// for a -race run on a loaded 2-core CI machine, where a gossip round or a
// node's start can take seconds. It bounds a broken test, it measures
// nothing.
const WaitLimit = time.Minute

// WaitFor polls cond until it returns true, or fails the test with what
// (the condition awaited, in words) after WaitLimit. It polls every
// millisecond at first, backing off to every 10 ms, so a condition that
// holds soon is seen soon and a slow one costs little CPU. cond runs on the
// calling goroutine.
//
// This is the one place a test sleeps: waiting on a condition with a
// deadline, never sleeping for a guessed time (STYLE.md; internal/lint
// checks).
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitFor(t, WaitLimit, what, cond)
}

func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}
