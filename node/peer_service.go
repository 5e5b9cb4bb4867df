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

// peerKeys checks the concatenated keys of a peer request.
func peerKeys(raw []byte) ([]prefixhash.Key, error) {
	if len(raw)%prefixhash.KeySize != 0 {
		return nil, invalid("keys", "%d bytes is not a whole number of %d-byte keys", len(raw), prefixhash.KeySize)
	}
	n := len(raw) / prefixhash.KeySize
	if n > maxPeerLookupKeys {
		return nil, invalid("keys", "%d keys in one request; the limit is %d", n, maxPeerLookupKeys)
	}
	keys := make([]prefixhash.Key, n)
	for i := range keys {
		keys[i] = prefixhash.Key(raw[i*prefixhash.KeySize:])
	}
	return keys, nil
}

// scoped returns ctx acting for the tenant a peer request names. Only
// node-wide callers reach PeerService (it needs the cluster scope): the
// scope narrows what they may touch, never widens it.
func scoped(ctx context.Context, sc *kvmeshv1.PeerScope) context.Context {
	if a := auth.AccessFrom(ctx); !a.Scoped && sc.GetScoped() {
		return auth.WithAccess(ctx, auth.Access{Scoped: true, Tag: sc.GetTenant()})
	}
	return ctx
}

// Remove drops keys from this node.
func (s *peerService) Remove(ctx context.Context, req *kvmeshv1.PeerServiceRemoveRequest) (*kvmeshv1.PeerServiceRemoveResponse, error) {
	os, err := s.n.objects()
	if err != nil {
		return nil, err
	}
	keys, err := peerKeys(req.GetKeys())
	if err != nil {
		return nil, err
	}
	found, err := os.Remove(scoped(ctx, req.GetScope()), keys, true)
	if err != nil {
		return nil, statusError(err)
	}
	return &kvmeshv1.PeerServiceRemoveResponse{Found: found}, nil
}

// Retain sets the retention of keys this node holds.
func (s *peerService) Retain(ctx context.Context, req *kvmeshv1.PeerServiceRetainRequest) (*kvmeshv1.PeerServiceRetainResponse, error) {
	os, err := s.n.objects()
	if err != nil {
		return nil, err
	}
	keys, err := peerKeys(req.GetKeys())
	if err != nil {
		return nil, err
	}
	r, err := retentionFrom(req.GetRetention())
	if err != nil {
		return nil, err
	}
	applied, err := os.Retain(scoped(ctx, req.GetScope()), keys, nil, r, true)
	if err != nil {
		return nil, statusError(err)
	}
	return &kvmeshv1.PeerServiceRetainResponse{Applied: applied}, nil
}
