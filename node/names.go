package node

import (
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// maxNames bounds the namespaces whose model ids a node remembers.
const maxNames = 4096

// names remembers the model id of each namespace digest the node has seen
// (its prefill engine's, and those named by requests), so that Stats can
// show which model a namespace's cached tokens belong to. The cache itself
// stores digests only. Past maxNames, new names are not remembered. Every
// request notes its namespace, so the common case (a name already known)
// takes no lock.
type names struct {
	m sync.Map // uint64 digest → string model id
	n atomic.Int64
}

func (n *names) note(ns prefixhash.Namespace) {
	d := ns.Digest()
	if _, ok := n.m.Load(d); ok || n.n.Load() >= maxNames {
		return
	}
	if _, loaded := n.m.LoadOrStore(d, ns.Model); !loaded {
		n.n.Add(1)
	}
}

// model returns the model id of the namespace with digest d, or "".
func (n *names) model(d uint64) string {
	if v, ok := n.m.Load(d); ok {
		return v.(string)
	}
	return ""
}
