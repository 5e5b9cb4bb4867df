package node

import (
	"fmt"
	"net/http"
	"net/http/pprof"
)

// livez answers 200 while the process serves HTTP at all, stopping
// included: a liveness probe that failed during a graceful stop would
// kill the node before it handed its blocks over.
func (n *Node) livez(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// readyz answers 200 once the node takes requests, 503 before and while it
// stops, with the reason. The cache is open by then (Open recovers the NVMe
// tier before it returns), so what is left is that Serve has started and,
// for a node of a cluster, that membership has joined: no seeds to join, or
// one of them answered.
func (n *Node) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if why := n.notReady(); why != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, why)
		return
	}
	fmt.Fprintln(w, "ok")
}

// notReady says why the node is not ready, or "" when it is.
func (n *Node) notReady() string {
	switch {
	case n.stopping.Load():
		return "stopping"
	case !n.serving.Load():
		return "starting"
	case n.cluster != nil && !n.cluster.members.Joined():
		return "joining: no seed of --join has answered yet"
	}
	return ""
}

// registerPprof serves net/http/pprof's handlers under /debug/pprof/ on mux
// (not on http.DefaultServeMux, which the package's init fills and no one
// serves here).
func registerPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
