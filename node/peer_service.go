package node

import (
	"context"
	"unsafe"

	"github.com/kvmesh/kvmesh/auth"

	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// maxPeerLookupKeys bounds the keys of one PeerService.Lookup: a prompt of
// the largest batch, with room for a peer configured for more.
const maxPeerLookupKeys = 1 << 20

// peerService implements kvmesh.v1.PeerService: what other nodes ask this
// one. It answers from this node's own tiers only.
type peerService struct {
	kvmeshv1.UnimplementedPeerServiceServer
	n *Node
}

func (s *peerService) Lookup(ctx context.Context, req *kvmeshv1.PeerServiceLookupRequest) (*kvmeshv1.PeerServiceLookupResponse, error) {
	raw := req.GetKeys()
	if len(raw)%prefixhash.KeySize != 0 {
		return nil, invalid("keys", "%d bytes is not a whole number of %d-byte keys", len(raw), prefixhash.KeySize)
	}
	n := len(raw) / prefixhash.KeySize
	if n > maxPeerLookupKeys {
		return nil, invalid("keys", "%d keys in one lookup; the limit is %d", n, maxPeerLookupKeys)
	}
	total := 0
	for _, r := range req.GetRuns() {
		total += int(r)
		if total > n {
			break
		}
	}
	if total != n {
		return nil, invalid("runs", "run lengths add up to %d, not to the %d keys sent", total, n)
	}
	// The request's bytes are the keys, read in place (as lookupChain does).
	keys := unsafe.Slice((*prefixhash.Key)(unsafe.Pointer(unsafe.SliceData(raw))), n)
	counts := make([]uint32, len(req.GetRuns()))
	off := 0
	for i, r := range req.GetRuns() {
		run := keys[off : off+int(r)]
		off += int(r)
		if len(run) > 0 {
			counts[i] = uint32(s.n.cache.LongestPrefix(auth.AccessFrom(ctx), run))
		}
	}
	return &kvmeshv1.PeerServiceLookupResponse{Counts: counts}, nil
}
