package node

import (
	"context"
	"errors"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/store"
)

// adminService implements kvmesh.v1.AdminService.
type adminService struct {
	kvmeshv1.UnimplementedAdminServiceServer
	n *Node
}

// Members lists every live member, this node first, then the others by
// id, with its state, addresses and tiers (used bytes for this node only),
// a page at a time. A node built by New answers with itself alone.
func (s *adminService) Members(_ context.Context, req *kvmeshv1.MembersRequest) (*kvmeshv1.MembersResponse, error) {
	page, err := parsePage(pageMembers, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	self, others := s.members()
	resp := &kvmeshv1.MembersResponse{SelfId: s.n.opts.NodeID, ChunkTokens: uint32(s.n.opts.Cluster.ChunkTokens)}
	size := page.size
	if page.first {
		resp.Members, size = append(resp.Members, self), size-1
	}
	var rest []*kvmeshv1.Member
	rest, resp.NextPageToken = pageOf(pageMembers, others, func(m *kvmeshv1.Member) []byte { return []byte(m.Id) }, page.cursor, size)
	resp.Members = append(resp.Members, rest...)
	return resp, nil
}

// members returns this node and the other live members, sorted by id.
func (s *adminService) members() (self *kvmeshv1.Member, others []*kvmeshv1.Member) {
	n := s.n
	self = &kvmeshv1.Member{
		Id:       n.opts.NodeID,
		State:    "alive",
		GrpcAddr: n.GRPCAddr(),
		HttpAddr: n.HTTPAddr(),
		Version:  n.opts.Version,
	}
	for _, t := range n.cache.Stats().Tiers {
		self.Tiers = append(self.Tiers, &kvmeshv1.TierCapacity{Name: t.Name, CapacityBytes: uint64(t.Capacity), UsedBytes: uint64(t.Bytes)})
	}
	c := n.cluster
	if c == nil {
		return self, nil
	}
	self.GrpcAddr, self.HttpAddr, self.DataAddr = c.grpcAddr, c.httpAddr, c.dataAddr
	self.GossipAddr, self.ShmSocket, self.HostId, self.RdmaDevices = c.members.GossipAddr(), c.shmPath, c.hostID, c.rdma
	self.Fabric = c.fab.desc
	ms, _ := c.members.Members()
	for _, m := range ms {
		if m.ID == n.opts.NodeID {
			self.State = m.State
			continue
		}
		others = append(others, &kvmeshv1.Member{
			Id: m.ID, State: m.State, GrpcAddr: m.Meta.GRPCAddr, HttpAddr: m.Meta.HTTPAddr, DataAddr: m.Meta.DataAddr,
			GossipAddr: m.GossipAddr, Version: m.Meta.Version, RdmaDevices: m.Meta.RDMA, Fabric: m.Meta.Fabric,
			Tiers: []*kvmeshv1.TierCapacity{{Name: "dram", CapacityBytes: uint64(m.Meta.DRAMBytes)}, {Name: "nvme", CapacityBytes: uint64(m.Meta.NVMeBytes)}},
		})
	}
	slices.SortFunc(others, func(a, b *kvmeshv1.Member) int { return strings.Compare(a.Id, b.Id) })
	return self, others
}

func (s *adminService) DropNamespace(ctx context.Context, req *kvmeshv1.DropNamespaceRequest) (*kvmeshv1.DropNamespaceResponse, error) {
	digest, err := s.n.namespaceDigest(ctx, req.GetNamespace(), req.GetDigest())
	if err != nil {
		return nil, err
	}
	dropped, err := s.n.cache.DropNamespace(digest)
	if err != nil {
		return nil, err
	}
	s.n.log.Info("namespace dropped", "digest", digestString(digest), "blocks", dropped)
	return &kvmeshv1.DropNamespaceResponse{DroppedBlocks: uint64(dropped)}, nil
}

func (s *adminService) BlockInfo(ctx context.Context, req *kvmeshv1.BlockInfoRequest) (*kvmeshv1.BlockInfoResponse, error) {
	key, err := parseKey("key", req.GetKey())
	if err != nil {
		return nil, err
	}
	notCached := status.Errorf(codes.NotFound, "block %s is not cached on node %s", key, s.n.opts.NodeID)
	info, ok := s.n.cache.Info(viewOf(ctx), key)
	if !ok {
		return nil, notCached
	}
	ref, err := s.n.cache.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil, notCached
	}
	if err != nil {
		return nil, err
	}
	defer ref.Release()
	h, err := block.DecodeHeader(ref.Bytes(), 0)
	if err != nil {
		return nil, status.Errorf(codes.DataLoss, "block %s: %v", key, err)
	}
	resp := &kvmeshv1.BlockInfoResponse{
		Key: keyBytes(h.Key), Parent: keyBytes(h.Parent), NamespaceDigest: h.Namespace,
		Tokens: append([]uint32(nil), h.Tokens...),
		NodeId: s.n.opts.NodeID, Tier: info.Tier,
		PayloadLen: uint64(h.PayloadLen), EncodedLen: uint64(len(ref.Bytes())),
		Dtype:   kvmeshv1.Dtype(h.Layout.DType),
		Layers:  uint32(h.Layout.Layers),
		KvHeads: uint32(h.Layout.KVHeads), HeadDim: uint32(h.Layout.HeadDim),
	}
	//lint:ignore SA1019 key format 2 clients read the layer range: [0, layers)
	resp.LayerEnd = resp.Layers
	return resp, nil
}

// partialLister is the Cache of a node that assembles blocks from parts.
type partialLister interface {
	Partials(a auth.Access) []store.PartialInfo
}

// Partials lists the node's incomplete blocks, oldest first.
func (s *adminService) Partials(ctx context.Context, req *kvmeshv1.PartialsRequest) (*kvmeshv1.PartialsResponse, error) {
	pl, ok := s.n.cache.(partialLister)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this node's cache does not assemble parts")
	}
	ps := pl.Partials(viewOf(ctx))
	limit := int(req.GetLimit())
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	resp := &kvmeshv1.PartialsResponse{Total: uint32(len(ps))}
	for _, p := range ps[:min(limit, len(ps))] {
		b := &kvmeshv1.PartialBlock{Key: keyBytes(p.Key), NamespaceDigest: p.Namespace, Tokens: uint32(p.Tokens),
			Layers: uint32(p.Layers), Heads: uint32(p.Heads), Covered: uint32(p.Covered),
			AgeSeconds: p.Age.Seconds(), Bytes: uint64(p.Bytes)}
		for _, r := range p.Parts {
			b.Parts = append(b.Parts, &kvmeshv1.PartRange{L0: uint32(r.L0), L1: uint32(r.L1), H0: uint32(r.H0), H1: uint32(r.H1)})
		}
		resp.Blocks = append(resp.Blocks, b)
	}
	return resp, nil
}

// WhoAmI tells the caller whom its token authenticates and the namespace
// salt the node applies for it (clients that compute keys need it).
func (s *adminService) WhoAmI(ctx context.Context, _ *kvmeshv1.WhoAmIRequest) (*kvmeshv1.WhoAmIResponse, error) {
	p := auth.PrincipalFrom(ctx)
	resp := &kvmeshv1.WhoAmIResponse{Tenant: p.Tenant, NamespaceSalt: p.Salt, TenantTag: p.Tag}
	for _, sc := range []auth.Scope{auth.Read, auth.Write, auth.Admin, auth.Cluster} {
		if p.Can(sc) {
			resp.Scopes = append(resp.Scopes, sc.String())
		}
	}
	return resp, nil
}
