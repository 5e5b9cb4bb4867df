//go:build !(ucx && linux && cgo)

package main

// buildTags are the tags the e2e binary is built with: this test binary's.
var buildTags []string
