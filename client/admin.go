package client

import (
	"context"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// The node's counters and the operators' calls (AdminService), in Go types.
// The lists that grow with the cache or the cluster come from the node a
// page at a time; these calls follow the pages and return the whole list.

// pageSize is the page_size the client asks for: the node's largest.
const pageSize = 1000

// maxPages bounds the pages one call follows: a node that keeps answering
// with a next page (a bug, or a list growing as fast as it is read) cannot
// hold a call forever.
const maxPages = 10000

// Stats are a node's cache counters.
type Stats struct {
	NodeID string
	Tiers  []TierStats
	// Block reads that found / did not find their block, since the node
	// started.
	Hits, Misses int64
	// Blocks dropped, moved one tier down, moved one tier up.
	Evictions, Demotions, Promotions int64
	// Namespaces the node holds blocks of, by digest (those of the caller's
	// tenant only, for a tenant).
	Namespaces []NamespaceStats
	// SecondChances and ReusedBlocks are the eviction policy's own signal,
	// zero but under --eviction reuse: blocks passed over at the cold end
	// because they were asked for again, and the cached blocks marked so.
	SecondChances, ReusedBlocks int64
	// BranchingBlocks are the cached blocks with two or more cached
	// children: where cached chains fork (a shared system prompt).
	BranchingBlocks int64
}

// TierStats are one tier's counters.
type TierStats struct {
	Name          string // "hbm", "dram" or "nvme"
	Blocks        int64
	Bytes         int64 // encoded blocks held
	CapacityBytes int64
	// WrittenBytes counts the bytes written to the tier since the node
	// started (NVMe: demotions, direct writes, rewrites; 0 for the others).
	WrittenBytes int64
	// Evicted counts the blocks that left the tier since the node started,
	// by reason.
	Evicted TierEvictions
}

// TierEvictions are the blocks that left a tier, by reason.
type TierEvictions struct {
	Capacity   int64 // dropped from the node for room (descendants included)
	Demoted    int64 // moved one tier down
	Refused    int64 // writes refused for lack of room
	Unadmitted int64 // writes accepted but evicted at once, colder than everything held (NVMe: demotions admission refused)
	Expired    int64 // dropped for room after their lease's or pin's TTL lapsed, not read since
}

// NamespaceStats are what one namespace holds on the node.
type NamespaceStats struct {
	Digest                uint64
	Blocks, Bytes, Tokens int64
	// Model is the namespace's model id when the node knows it, else "".
	Model string
}

// Stats returns the node's cache counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := pages(func(token string) (string, error) {
		var resp *kvmeshv1.StatsResponse
		err := c.retry(ctx, func(ctx context.Context) (err error) {
			resp, err = c.cache.Stats(ctx, &kvmeshv1.StatsRequest{PageSize: pageSize, PageToken: token})
			return err
		})
		if err != nil {
			return "", callError("stats", err)
		}
		if token == "" { // the counters of the first page
			st = Stats{NodeID: resp.GetNodeId(), Hits: int64(resp.GetHits()), Misses: int64(resp.GetMisses()),
				Evictions: int64(resp.GetEvictions()), Demotions: int64(resp.GetDemotions()), Promotions: int64(resp.GetPromotions()),
				SecondChances: int64(resp.GetSecondChances()), ReusedBlocks: int64(resp.GetReusedBlocks()),
				BranchingBlocks: int64(resp.GetBranchingBlocks())}
			for _, t := range resp.GetTiers() {
				st.Tiers = append(st.Tiers, TierStats{Name: t.GetName(), Blocks: int64(t.GetBlocks()), Bytes: int64(t.GetBytes()), CapacityBytes: int64(t.GetCapacityBytes()),
					WrittenBytes: int64(t.GetWrittenBytes()),
					Evicted: TierEvictions{Capacity: int64(t.GetEvictedCapacity()), Demoted: int64(t.GetEvictedDemoted()),
						Refused: int64(t.GetEvictedRefused()), Unadmitted: int64(t.GetEvictedUnadmitted()), Expired: int64(t.GetEvictedExpired())}})
			}
		}
		for _, x := range resp.GetNamespaces() {
			st.Namespaces = append(st.Namespaces, NamespaceStats{Digest: x.GetDigest(), Blocks: int64(x.GetBlocks()), Bytes: int64(x.GetBytes()),
				Tokens: int64(x.GetTokens()), Model: x.GetModel()})
		}
		return resp.GetNextPageToken(), nil
	})
	return st, err
}

// pages calls page with the token of each page, the empty token first,
// until it returns no next token.
func pages(page func(token string) (next string, err error)) error {
	token := ""
	for range maxPages {
		next, err := page(token)
		if err != nil || next == "" {
			return err
		}
		token = next
	}
	return fmt.Errorf("%w after %d pages", errTooManyPages, maxPages)
}

// Cluster is the membership a node sees.
type Cluster struct {
	// SelfID is the id of the node asked; Members[0] is that node.
	SelfID  string
	Members []Member
	// ChunkTokens is the size of a placement chunk in tokens, the same on
	// every member.
	ChunkTokens int
}

// Member is one live node of the cluster.
type Member struct {
	ID    string // stable; placement hashes it
	State string // "alive"
	// Addresses it serves on; empty when that endpoint is off.
	GRPCAddr, HTTPAddr, DataAddr, GossipAddr string
	Tiers                                    []TierCapacity
	Version                                  string // the kvmesh version it runs
	// ShmSocket is its shared-memory data plane's unix socket, usable by
	// clients on the host whose id is HostID; empty when it is off.
	ShmSocket, HostID string
	RDMADevices       []string
	// Fabric is how the node reads other nodes: "tcp", or "ucx" with its
	// UCX version and transports.
	Fabric string
}

// TierCapacity is one tier of a member.
type TierCapacity struct {
	Name          string
	CapacityBytes int64
	UsedBytes     int64 // known for the node asked only; 0 for the others
}

// Members lists the nodes the node knows, itself first.
func (c *Client) Members(ctx context.Context) (Cluster, error) {
	var cl Cluster
	err := pages(func(token string) (string, error) {
		resp, err := c.membersPage(ctx, pageSize, token)
		if err != nil {
			return "", err
		}
		cl.SelfID, cl.ChunkTokens = resp.GetSelfId(), int(resp.GetChunkTokens())
		for _, m := range resp.GetMembers() {
			cl.Members = append(cl.Members, memberOf(m))
		}
		return resp.GetNextPageToken(), nil
	})
	return cl, err
}

func (c *Client) membersPage(ctx context.Context, size int32, token string) (*kvmeshv1.MembersResponse, error) {
	var resp *kvmeshv1.MembersResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.Members(ctx, &kvmeshv1.MembersRequest{PageSize: size, PageToken: token})
		return err
	})
	if err != nil {
		return nil, callError("members", err)
	}
	return resp, nil
}

func memberOf(m *kvmeshv1.Member) Member {
	out := Member{ID: m.GetId(), State: m.GetState(), GRPCAddr: m.GetGrpcAddr(), HTTPAddr: m.GetHttpAddr(), DataAddr: m.GetDataAddr(),
		GossipAddr: m.GetGossipAddr(), Version: m.GetVersion(), ShmSocket: m.GetShmSocket(), HostID: m.GetHostId(), RDMADevices: m.GetRdmaDevices(), Fabric: m.GetFabric()}
	for _, t := range m.GetTiers() {
		out.Tiers = append(out.Tiers, TierCapacity{Name: t.GetName(), CapacityBytes: int64(t.GetCapacityBytes()), UsedBytes: int64(t.GetUsedBytes())})
	}
	return out
}

// BlockInfo describes one cached block.
type BlockInfo struct {
	Key, Parent     prefixhash.Key
	NamespaceDigest uint64
	Tokens          []uint32
	// Where it is: the node asked, and its tier there.
	NodeID, Tier string
	// Payload bytes, and the encoded block's size (header and payload).
	PayloadLen, EncodedLen int
	// The payload layout.
	DType                    prefixhash.DType
	Layers, KVHeads, HeadDim int
	KVLayout                 prefixhash.KVLayout
	LatentDim, StateBytes    int
	// Group is the group whose record this is in a namespace with groups
	// (-1: none); the layout above is the group's. Chain is the block's
	// chain key (Key for a block without groups).
	Group        int
	GroupKind    prefixhash.GroupKind
	WindowBlocks int
	Chain        prefixhash.Key
	// Object is set for an object's piece (its name, piece, pieces and
	// size; no tokens, no layout), nil for a block.
	Object *block.Object
	// Retention is its pin and the TTL left on the node.
	Retention block.Retention
}

// BlockInfo describes one cached block; the error matches ErrNotFound when
// the node does not hold it.
func (c *Client) BlockInfo(ctx context.Context, key prefixhash.Key) (BlockInfo, error) {
	var resp *kvmeshv1.BlockInfoResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.BlockInfo(ctx, &kvmeshv1.BlockInfoRequest{Key: key[:]})
		return err
	})
	if err != nil {
		return BlockInfo{}, callError("block info", err)
	}
	b := BlockInfo{NamespaceDigest: resp.GetNamespaceDigest(), Tokens: resp.GetTokens(), NodeID: resp.GetNodeId(), Tier: resp.GetTier(),
		PayloadLen: int(resp.GetPayloadLen()), EncodedLen: int(resp.GetEncodedLen()), DType: prefixhash.DType(resp.GetDtype()),
		Layers: int(resp.GetLayers()), KVHeads: int(resp.GetKvHeads()), HeadDim: int(resp.GetHeadDim()),
		KVLayout: prefixhash.KVLayout(resp.GetKvLayout()), LatentDim: int(resp.GetLatentDim()), StateBytes: int(resp.GetStateBytes()),
		Group: int(resp.GetGroup()) - 1, GroupKind: prefixhash.GroupKind(resp.GetGroupKind()), WindowBlocks: int(resp.GetWindowBlocks())}
	copy(b.Key[:], resp.GetKey())
	b.Chain = b.Key
	if len(resp.GetChainKey()) == prefixhash.KeySize {
		copy(b.Chain[:], resp.GetChainKey())
	}
	copy(b.Parent[:], resp.GetParent())
	if resp.GetObject() {
		b.Object = &block.Object{Name: resp.GetObjectName(), Piece: int(resp.GetObjectPiece()), Pieces: int(resp.GetObjectPieces()), Size: resp.GetObjectSize()}
	}
	if r := resp.GetRetention(); r != nil {
		b.Retention = block.Retention{Pin: block.Pin(r.GetPin()), TTL: time.Duration(r.GetTtlMs()) * time.Millisecond}
	}
	return b, nil
}

// DropNamespace removes every block of ns from the node and returns how
// many it removed. It is not retried.
func (c *Client) DropNamespace(ctx context.Context, ns prefixhash.Namespace) (int, error) {
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return 0, err
	}
	var resp *kvmeshv1.DropNamespaceResponse
	err = c.once(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.DropNamespace(ctx, &kvmeshv1.DropNamespaceRequest{Namespace: NamespaceProto(ns)})
		return err
	})
	if err != nil {
		return 0, callError("drop namespace", err)
	}
	return int(resp.GetDroppedBlocks()), nil
}

// Quota bounds the encoded block bytes one namespace may hold in each tier
// of one node; 0 is unlimited.
type Quota struct {
	DRAMBytes, NVMeBytes int64
}

// NamespaceQuota is one namespace's quota and usage on a node.
type NamespaceQuota struct {
	Digest uint64
	// Quota is the quota in force: the namespace's own (Own) or the node's
	// default.
	Quota Quota
	Own   bool
	// What the namespace holds on the node.
	Blocks, DRAMBytes, NVMeBytes int64
}

// Quotas are a node's quotas.
type Quotas struct {
	NodeID string
	// Default is the quota of every namespace without its own.
	Default Quota
	// Namespaces the node holds blocks of or has a quota for, by digest.
	Namespaces []NamespaceQuota
}

// SetQuota sets ns's own quota on the node (in place of the node's default;
// kept across its restarts) and returns the namespace's usage and quota
// after the change. Quotas are per node. It is retried: setting a quota
// twice is harmless.
func (c *Client) SetQuota(ctx context.Context, ns prefixhash.Namespace, q Quota) (NamespaceQuota, error) {
	return c.setQuota(ctx, ns, &kvmeshv1.Quota{DramBytes: uint64(max(q.DRAMBytes, 0)), NvmeBytes: uint64(max(q.NVMeBytes, 0))})
}

// ClearQuota removes ns's own quota on the node: its default applies again.
func (c *Client) ClearQuota(ctx context.Context, ns prefixhash.Namespace) (NamespaceQuota, error) {
	return c.setQuota(ctx, ns, nil)
}

func (c *Client) setQuota(ctx context.Context, ns prefixhash.Namespace, q *kvmeshv1.Quota) (NamespaceQuota, error) {
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return NamespaceQuota{}, err
	}
	req := &kvmeshv1.SetQuotaRequest{Namespace: NamespaceProto(ns), Quota: q, Clear: q == nil}
	var resp *kvmeshv1.SetQuotaResponse
	err = c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.SetQuota(ctx, req)
		return err
	})
	if err != nil {
		return NamespaceQuota{}, callError("set quota", err)
	}
	return namespaceQuotaOf(resp.GetNamespace()), nil
}

// Quotas returns the node's default quota and every namespace's usage and
// quota there.
func (c *Client) Quotas(ctx context.Context) (Quotas, error) {
	var qs Quotas
	err := pages(func(token string) (string, error) {
		var resp *kvmeshv1.QuotasResponse
		err := c.retry(ctx, func(ctx context.Context) (err error) {
			resp, err = c.admin.Quotas(ctx, &kvmeshv1.QuotasRequest{PageSize: pageSize, PageToken: token})
			return err
		})
		if err != nil {
			return "", callError("quotas", err)
		}
		qs.NodeID, qs.Default = resp.GetNodeId(), quotaOf(resp.GetDefaultQuota())
		for _, r := range resp.GetNamespaces() {
			qs.Namespaces = append(qs.Namespaces, namespaceQuotaOf(r))
		}
		return resp.GetNextPageToken(), nil
	})
	return qs, err
}

func quotaOf(q *kvmeshv1.Quota) Quota {
	return Quota{DRAMBytes: int64(q.GetDramBytes()), NVMeBytes: int64(q.GetNvmeBytes())}
}

func namespaceQuotaOf(r *kvmeshv1.NamespaceQuota) NamespaceQuota {
	return NamespaceQuota{Digest: r.GetDigest(), Quota: quotaOf(r.GetQuota()), Own: r.GetOwn(),
		Blocks: int64(r.GetBlocks()), DRAMBytes: int64(r.GetDramBytes()), NVMeBytes: int64(r.GetNvmeBytes())}
}
