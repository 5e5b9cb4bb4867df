package store

import (
	"context"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Objects (issue 33) are stored as the records block.EncodeObject builds:
// one per piece, each under its own key, verified, placed, demoted,
// promoted, persisted and recovered as blocks are. What differs is kept
// here and in the namespace table (local_ns.go: object groups): an object
// record has no parent to link to and no chain to place it in; it is
// removed by name (Remove), which a block is not; and its writer may ask
// for a retention (retain.go) that the store applies as it stores it.
//
// Putting an object whose key is cached already is a no-op, as for a
// block (Mooncake's put keeps the first value); an upsert is a Remove and
// a Put.

// Remove drops the cached values of keys that ctx's access may see,
// whatever their retention (a block takes its cached descendants with it),
// and reports per key whether it was there. Values pinned by a reader stay
// readable through its Ref and are freed at its release.
func (l *Local) Remove(ctx context.Context, keys []prefixhash.Key) ([]bool, error) {
	a := auth.AccessFrom(ctx)
	var fr []freeLoc
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	found := make([]bool, len(keys))
	for k, key := range keys {
		i := l.mu.x.find(key)
		if i == 0 || !l.mu.ns.allows(a, l.mu.x.at(i).ns) {
			continue
		}
		l.dropLocked(i, reasonRemove, &fr)
		found[k] = true
	}
	l.mu.Unlock()
	l.freeAll(fr)
	l.exit()
	return found, nil
}
