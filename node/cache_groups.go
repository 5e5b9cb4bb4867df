package node

import (
	"context"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// The gRPC surface of namespaces with groups (hybrid models): their
// conversion, the per-group Lookup answer and the resume read.

// groupsFromProto converts a request's groups; Namespace.Validate checks
// them with the rest (errors name groups[i].field).
func groupsFromProto(pbs []*kvmeshv1.Group) (prefixhash.Groups, error) {
	if len(pbs) > prefixhash.MaxGroups {
		return prefixhash.Groups{}, invalid("namespace.groups", "%d groups; the limit is %d", len(pbs), prefixhash.MaxGroups)
	}
	gs := make([]prefixhash.Group, len(pbs))
	for i, pb := range pbs {
		if pb.GetKind() < 0 || pb.GetKind() > 255 || pb.GetKvLayout() < 0 || pb.GetKvLayout() > 255 || pb.GetScales() < 0 || pb.GetScales() > 255 || pb.GetDtype() < 0 || pb.GetDtype() > 255 {
			return prefixhash.Groups{}, invalid("namespace", "groups[%d]: kind %d, kv_layout %d, dtype %d or scales %d is not a known value",
				i, pb.GetKind(), pb.GetKvLayout(), pb.GetDtype(), pb.GetScales())
		}
		if len(pb.GetLayers()) > prefixhash.MaxLayers {
			return prefixhash.Groups{}, invalid("namespace", "groups[%d].layers: %d layers; the limit is %d", i, len(pb.GetLayers()), prefixhash.MaxLayers)
		}
		g := prefixhash.Group{
			Kind:       prefixhash.GroupKind(pb.GetKind()),
			Window:     int(min(pb.GetWindow(), 1<<30)),
			Layout:     prefixhash.KVLayout(pb.GetKvLayout()),
			DType:      prefixhash.DType(pb.GetDtype()),
			KVHeads:    int(min(pb.GetKvHeads(), 1<<30)),
			HeadDim:    int(min(pb.GetHeadDim(), 1<<30)),
			LatentDim:  int(min(pb.GetLatentDim(), 1<<30)),
			StateBytes: int(min(pb.GetStateBytes(), 1<<30)),
			Scales:     prefixhash.Scales(pb.GetScales()),
			Layers:     make([]int, len(pb.GetLayers())),
		}
		for j, l := range pb.GetLayers() {
			g.Layers[j] = int(min(l, 1<<30))
		}
		gs[i] = g
	}
	out, err := prefixhash.NewGroups(gs...)
	if err != nil {
		return out, invalid("namespace", "%v", err)
	}
	return out, nil
}

// groupsPB converts a namespace's groups for an answer; nil for none.
func groupsPB(gs prefixhash.Groups) []*kvmeshv1.Group {
	var out []*kvmeshv1.Group
	for _, g := range gs.All() {
		pb := &kvmeshv1.Group{Kind: kvmeshv1.GroupKind(g.Kind), Window: uint32(g.Window), KvLayout: kvmeshv1.KVLayout(g.Layout),
			Dtype: kvmeshv1.Dtype(g.DType), KvHeads: uint32(g.KVHeads), HeadDim: uint32(g.HeadDim), LatentDim: uint32(g.LatentDim),
			StateBytes: uint32(g.StateBytes), Scales: kvmeshv1.Scales(g.Scales), Layers: make([]uint32, len(g.Layers))}
		for i, l := range g.Layers {
			pb.Layers[i] = uint32(l)
		}
		out = append(out, pb)
	}
	return out
}

// checkGroupSizes refuses a namespace with groups any of whose records is
// larger than the node's limit.
func (n *Node) checkGroupSizes(ns prefixhash.Namespace) error {
	limit := uint64(n.opts.Limits.MaxBlockBytes)
	hl := uint64(block.NamespaceHeaderLen(ns))
	for g := range ns.Groups.Len() {
		lay := block.GroupLayout(ns, g)
		size := lay.PayloadLen(ns.BlockTokens)
		if size < 0 || hl+uint64(size) > limit {
			return invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_BLOCK_TOO_LARGE, limitMeta(n.opts.Limits.MaxBlockBytes), "namespace",
				"groups[%d]'s records of %s are larger than the node's limit, max_block_bytes=%d", g, ns, limit)
		}
	}
	n.names.note(ns)
	return nil
}

// lookupGroups answers Lookup for a namespace with groups: the hit rule's
// prefix, each group's part, and where the anchor's records are.
func (s *cacheService) lookupGroups(ctx context.Context, ns prefixhash.Namespace, keys []prefixhash.Key, resp *kvmeshv1.LookupResponse) []Location {
	groups := ns.Groups.All()
	hit, locs := s.n.cache.Resume(ctx, groups, ns.BlockTokens, keys)
	resp.CachedBlocks = uint32(hit.Blocks)
	resp.CachedTokens = uint64(hit.Blocks * ns.BlockTokens)
	for g, gr := range groups {
		resp.Groups = append(resp.Groups, &kvmeshv1.GroupLookup{Kind: kvmeshv1.GroupKind(gr.Kind), Blocks: uint32(hit.Groups[g])})
	}
	return locs
}

// resumeRecord is one record a resume read sends: group g's of block i.
type resumeRecord struct{ i, g int }

// resumeRecords lists, block by block and groups in order, the records a
// reader needs to resume at p (prefixhash.Resume's answer).
func resumeRecords(groups []prefixhash.Group, blockTokens, p int) []resumeRecord {
	var out []resumeRecord
	for i := range p {
		for g, gr := range groups {
			switch {
			case gr.Kind.EveryBlock(),
				gr.Kind == prefixhash.GroupSliding && i >= p-gr.WindowBlocks(blockTokens),
				gr.Kind == prefixhash.GroupState && i == p-1:
				out = append(out, resumeRecord{i, g})
			}
		}
	}
	return out
}

// batchGetResume streams what a reader of the prompt whose chain is keys
// (tokens: its tokens) needs to resume at the longest usable prefix.
func (s *cacheService) batchGetResume(ns prefixhash.Namespace, keys []prefixhash.Key, tokens []uint32, stream kvmeshv1.CacheService_BatchGetServer) error {
	ctx := stream.Context()
	groups := ns.Groups.All()
	hit, _ := s.n.cache.Resume(ctx, groups, ns.BlockTokens, keys)
	recs := resumeRecords(groups, ns.BlockTokens, hit.Blocks)
	cb := s.n.cache.ChunkBlocks(ns.BlockTokens)
	rkeys := make([]prefixhash.Key, len(recs))
	cks := make([]prefixhash.Key, len(recs))
	for k, r := range recs {
		rkeys[k] = prefixhash.GroupKey(keys[r.i], r.g)
		cks[k] = prefixhash.ChunkKey(keys, r.i, cb)
	}
	remoteBy := time.Now().Add(s.n.opts.Cluster.GetTimeout)
	largest := 0
	for g := range groups {
		largest = max(largest, ns.GroupBytes(g))
	}
	maxWindow := max(1, maxReadWindow/(block.NamespaceHeaderLen(ns)+largest))
	var frame kvmeshv1.BatchGetResponse
	for lo, window := 0, 1; lo < len(recs); lo, window = lo+window, min(2*window, maxWindow) {
		hi := min(lo+window, len(recs))
		blocks, release, err := s.n.cache.Read(ctx, rkeys[lo:hi], cks[lo:hi], remoteBy)
		if err != nil {
			return err
		}
		for k := lo; k < hi && err == nil; k++ {
			r := recs[k]
			want := wantBlock{parent: ns.Root(), tokens: tokens[r.i*ns.BlockTokens : (r.i+1)*ns.BlockTokens]}
			if r.i > 0 {
				want.parent = keys[r.i-1]
			}
			if err = ctx.Err(); err == nil {
				_, err = s.sendBlockAs(stream, &frame, ns, uint32(r.i), uint32(r.g+1), rkeys[k], want, blocks[k-lo])
			}
		}
		release()
		if err != nil {
			return err
		}
	}
	return nil
}

// putGroup checks a BatchPut header's group (h.group, the index plus one)
// and payload length against ns and returns the group (-1 without groups)
// and the payload size.
func putGroup(ns prefixhash.Namespace, h *kvmeshv1.BlockHeader, index int) (int, int, error) {
	g := int(h.GetGroup()) - 1
	switch {
	case ns.Groups.IsZero() && g >= 0:
		return 0, 0, invalid("block.group", "block %d names group %d; namespace %s has no groups", index, g, ns)
	case ns.Groups.IsZero():
		if h.GetPayloadLen() != uint64(ns.BlockBytes()) {
			return 0, 0, invalid("block.payload_len", "block %d: %d bytes; blocks of %s hold %d payload bytes",
				index, h.GetPayloadLen(), ns, ns.BlockBytes())
		}
		return -1, ns.BlockBytes(), nil
	case g < 0:
		return 0, 0, invalid("block.group", "block %d names no group; namespace %s has groups: give each record's group (its index + 1)", index, ns)
	case g >= ns.Groups.Len():
		return 0, 0, invalid("block.group", "block %d: group %d is unknown to namespace %s, which has %d groups", index, g, ns, ns.Groups.Len())
	}
	want := ns.GroupBytes(g)
	if h.GetPayloadLen() != uint64(want) {
		if gr := ns.Groups.At(g); gr.Kind == prefixhash.GroupState {
			return 0, 0, invalid(fmt.Sprintf("groups[%d].state_bytes", g), "block %d: a state of %d bytes; the group's is %d (%d layers x %d heads x state_bytes %d)",
				index, h.GetPayloadLen(), want, len(gr.Layers), gr.KVHeads, gr.StateBytes)
		}
		return 0, 0, invalid("block.payload_len", "block %d: %d bytes; group %d's records of %s hold %d payload bytes", index, h.GetPayloadLen(), g, ns, want)
	}
	return g, want, nil
}
