// Package bench holds kvmesh's benchmark suites: workloads, trace replay,
// side-by-side peers (Redis, a raw TCP stream, fio), reports and plots. The
// `kvmesh bench` command runs them.
package bench
