package node

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// revision is the VCS revision the binary was built from. A build without
// VCS stamping (a container image built from a source tree without .git)
// sets it with -ldflags "-X github.com/kvmesh/kvmesh/node.revision=<sha>";
// otherwise it is read from the build info, else "unknown".
var revision string

// buildRevision returns revision, or the one the Go toolchain stamped
// (with "-dirty" for a modified tree), or "unknown".
func buildRevision() string {
	if revision != "" {
		return revision
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "unknown"
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return rev
}

// newBuildInfo is kvmesh_build_info: always 1, its labels say what runs
// (so that a dashboard can join any series to the version of its node).
func newBuildInfo(version string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_build_info",
		Help: "Always 1; the labels name the kvmesh version, VCS revision and Go version the node was built with.",
		ConstLabels: prometheus.Labels{
			"version": version, "revision": buildRevision(), "goversion": runtime.Version(),
		},
	})
	g.Set(1)
	return g
}
