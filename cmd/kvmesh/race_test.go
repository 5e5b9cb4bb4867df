//go:build race

package main

// raceEnabled builds the e2e binary with -race too, which reuses the
// packages this test binary was compiled with and checks the daemon.
const raceEnabled = true
