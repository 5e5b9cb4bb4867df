package node

import (
	"container/list"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Bounds of the model-name table.
const (
	// maxNames bounds the namespaces whose model ids a node keeps: those
	// that stored blocks or were found holding some.
	maxNames = 4096
	// maxSeenNames bounds the names of other namespaces requests named,
	// kept least recently named first out.
	maxSeenNames = 1024
)

// names remembers the namespaces of digests, so that Stats can show which
// model a namespace's cached tokens belong to, and KV events name the model
// and LoRA of a block (the cache stores digests only). Any request may name any namespace, so names that only a
// request named live in a small LRU (seen) that a flood of made-up names
// churns without harm; a name moves to the kept table, which such a flood
// cannot reach, once its namespace holds blocks: a BatchPut stored some, a
// Lookup found some, or Stats listed it. Every request notes its namespace,
// so the common case (a kept name) takes no lock.
type names struct {
	kept sync.Map // uint64 digest → prefixhash.Namespace
	n    atomic.Int64

	mu struct {
		sync.Mutex
		seen  map[uint64]*list.Element // of *seenName
		order list.List                // front: most recently named
	}
}

type seenName struct {
	digest uint64
	ns     prefixhash.Namespace
}

// note records the model id of a namespace a request named.
func (n *names) note(ns prefixhash.Namespace) {
	d := ns.Digest()
	if _, ok := n.kept.Load(d); ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mu.seen == nil {
		n.mu.seen = make(map[uint64]*list.Element)
	}
	if e, ok := n.mu.seen[d]; ok {
		n.mu.order.MoveToFront(e)
		return
	}
	n.mu.seen[d] = n.mu.order.PushFront(&seenName{digest: d, ns: ns})
	if n.mu.order.Len() > maxSeenNames {
		last := n.mu.order.Back()
		n.mu.order.Remove(last)
		delete(n.mu.seen, last.Value.(*seenName).digest)
	}
}

// keep records the model id of a namespace that holds blocks, for good
// (up to maxNames).
func (n *names) keep(ns prefixhash.Namespace) { n.keepNamespace(ns.Digest(), ns) }

// keepSeen keeps the name of digest d, a namespace that holds blocks, if a
// request named it recently.
func (n *names) keepSeen(d uint64) {
	if _, ok := n.kept.Load(d); ok {
		return
	}
	n.mu.Lock()
	e, ok := n.mu.seen[d]
	n.mu.Unlock()
	if ok {
		n.keepNamespace(d, e.Value.(*seenName).ns)
	}
}

func (n *names) keepNamespace(d uint64, ns prefixhash.Namespace) {
	if _, ok := n.kept.Load(d); ok || n.n.Load() >= maxNames {
		return
	}
	if _, loaded := n.kept.LoadOrStore(d, ns); !loaded {
		n.n.Add(1)
	}
}

// model returns the model id of the namespace with digest d, or "".
func (n *names) model(d uint64) string {
	ns, _ := n.Namespace(d)
	return ns.Model
}

// Namespace returns the namespace with digest d, if a request named it
// (kvevents.Names).
func (n *names) Namespace(d uint64) (prefixhash.Namespace, bool) {
	if v, ok := n.kept.Load(d); ok {
		return v.(prefixhash.Namespace), true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.mu.seen[d]; ok {
		return e.Value.(*seenName).ns, true
	}
	return prefixhash.Namespace{}, false
}
