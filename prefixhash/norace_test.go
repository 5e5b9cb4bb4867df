//go:build !race

package prefixhash

const raceEnabled = false
