package node

import (
	"sync"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// maxNames bounds the namespaces whose model ids a node remembers.
const maxNames = 4096

// names remembers the model id of each namespace digest the node has seen
// (its prefill engine's, and those named by requests), so that Stats can
// show which model a namespace's cached tokens belong to. The cache itself
// stores digests only. Past maxNames, new names are not remembered.
type names struct {
	mu sync.Mutex
	m  map[uint64]string
}

func (n *names) note(ns prefixhash.Namespace) {
	d := ns.Digest()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = make(map[uint64]string)
	}
	if _, ok := n.m[d]; ok || len(n.m) >= maxNames {
		return
	}
	n.m[d] = ns.Model
}

// model returns the model id of the namespace with digest d, or "".
func (n *names) model(d uint64) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.m[d]
}
