package client

import (
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// GroupsProto converts a hybrid namespace's groups (prefixhash.Groups) for
// the gRPC API; nil for none.
func GroupsProto(gs prefixhash.Groups) []*kvmeshv1.Group {
	var out []*kvmeshv1.Group
	for _, g := range gs.All() {
		pb := &kvmeshv1.Group{Kind: kvmeshv1.GroupKind(g.Kind), Window: uint32(g.Window), KvLayout: kvmeshv1.KVLayout(g.Layout),
			Dtype: kvmeshv1.Dtype(g.DType), KvHeads: uint32(g.KVHeads), HeadDim: uint32(g.HeadDim), LatentDim: uint32(g.LatentDim),
			StateBytes: uint32(g.StateBytes), Scales: kvmeshv1.Scales(g.Scales)}
		for _, l := range g.Layers {
			pb.Layers = append(pb.Layers, uint32(l))
		}
		out = append(out, pb)
	}
	return out
}
