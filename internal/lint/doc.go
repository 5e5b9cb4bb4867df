// Package lint holds tests that check rules of STYLE.md over the whole
// repository's source (Go, shell and Python files), the way pebble's
// internal/lint does. It has no code of its own.
//
// ports_test.go: a server in a test, a benchmark or a script binds port 0
// and reports the address it got; a port found by listening on port 0,
// closing and handing the number to another process races with every
// other process on the host (CI once failed with "bind: address already in
// use" this way).
//
// deps_test.go: formats are leaf packages. block depends on prefixhash,
// xxhash and the standard library only, and neither it nor client nor
// prefill links store, tiers or pebble (go list -deps); client, node, store
// and transfer link no test-support package (transfertest, certtest,
// blocktest).
//
// layers_test.go: the serving packages (gossip, openai, router) depend on
// node neither directly nor through another package (go list -deps; their
// tests may start nodes), and no Go file, test or not, imports a package
// under cmd/; no back-edge for want of a small type (gpu does not import
// tiers, store does not import transfer); no Go file over 800 lines
// (generated code aside; the files and directories still over it are
// listed, each with why).
//
// ci_test.go: CI cannot pass vacuously. Every Fuzz function of the tree is
// in .ci/run's fuzz smoke, at the package that holds it (or in a counted
// allowance list, with its reason), and every test or benchmark CI's
// scripts run by name (-run, -bench) matches a function of the package it
// gives, through .ci/named, which fails a step that ran nothing.
//
// style_test.go: STYLE.md's rules that a parser can check. client imports
// neither store nor tiers; an exported sentinel error made by errors.New
// says its package first ("store: block not found"); a test waits with
// testkit.WaitFor, never time.Sleep, except in the listed files, each with
// its reason. staticcheck runs beside these in .ci/run.
package lint
