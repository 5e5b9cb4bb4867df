package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/internal/atomicfile"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/store"
)

// Per-namespace quotas. store.Local enforces them (see its package doc,
// Quotas); the node sets the default from Options, changes namespaces' own
// quotas through AdminService.SetQuota, and keeps those in
// DataDir/quotas.json so that a restart does not silently lift them.

// quotaFile is the name of the file, in the data dir, of the namespaces'
// own quotas.
const quotaFile = "quotas.json"

// quotaJSON is one namespace's quota in quotaFile. Tenant, when set, is
// the hex tag of the blocks it binds (store.Quota.Bound); files written
// before it had none: those quotas apply whatever the blocks carry.
type quotaJSON struct {
	DRAMBytes int64  `json:"dram_bytes"`
	NVMeBytes int64  `json:"nvme_bytes"`
	Tenant    string `json:"tenant,omitempty"`
}

// quotasJSON is quotaFile: quotas by namespace digest, in hex.
type quotasJSON struct {
	Namespaces map[string]quotaJSON `json:"namespaces"`
}

// loadQuotas reads the namespaces' own quotas kept in dir; none when the
// file does not exist.
func loadQuotas(dir string) (map[uint64]store.Quota, error) {
	path := filepath.Join(dir, quotaFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node: quotas: %w", err)
	}
	var f quotasJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("node: quotas file %s: %w (fix or remove it)", path, err)
	}
	out := make(map[uint64]store.Quota, len(f.Namespaces))
	for hex, q := range f.Namespaces {
		d, err := strconv.ParseUint(hex, 16, 64)
		if err != nil || q.DRAMBytes < 0 || q.NVMeBytes < 0 {
			return nil, fmt.Errorf("node: quotas file %s: namespace %q: want a 16-digit hex digest and byte counts of 0 or more (fix or remove it)", path, hex)
		}
		sq := store.Quota{DRAM: q.DRAMBytes, NVMe: q.NVMeBytes}
		if q.Tenant != "" {
			if sq.Tenant, err = strconv.ParseUint(q.Tenant, 16, 64); err != nil {
				return nil, fmt.Errorf("node: quotas file %s: namespace %q: tenant %q is not a hex tag (fix or remove it)", path, hex, q.Tenant)
			}
			sq.Bound = true
		}
		out[d] = sq
	}
	return out, nil
}

// saveQuotas writes quotas to dir durably (atomicfile.Write).
func saveQuotas(dir string, quotas map[uint64]store.Quota) error {
	f := quotasJSON{Namespaces: make(map[string]quotaJSON, len(quotas))}
	for d, q := range quotas {
		j := quotaJSON{DRAMBytes: q.DRAM, NVMeBytes: q.NVMe}
		if q.Bound {
			j.Tenant = digestString(q.Tenant)
		}
		f.Namespaces[digestString(d)] = j
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("node: quotas: %w", err)
	}
	path := filepath.Join(dir, quotaFile)
	if err := atomicfile.Write(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("node: save quotas to %s: %w", path, err)
	}
	return nil
}

// quotaCache is a Cache with per-namespace quotas (the production cache).
type quotaCache interface {
	// SetQuota sets (clear: removes) the namespace's own quota and keeps
	// the change.
	SetQuota(digest uint64, q store.Quota, clear bool) error
	// Quotas returns the namespaces' own quotas and the default.
	Quotas() (map[uint64]store.Quota, store.Quota)
}

var _ quotaCache = (*clusterCache)(nil)

func (c *clusterCache) SetQuota(digest uint64, q store.Quota, clear bool) error {
	c.quotaMu.Lock()
	defer c.quotaMu.Unlock()
	var err error
	if clear {
		err = c.local.ClearQuota(digest)
	} else {
		err = c.local.SetQuota(digest, q)
	}
	switch {
	case errors.Is(err, store.ErrQuota):
		// In force; pinned blocks keep the namespace over it until their
		// readers are done.
		c.log.Info("namespace still over its new quota while blocks of it are read", "digest", digestString(digest), "err", err)
	case err != nil:
		return cacheError(err)
	}
	own, _ := c.local.Quotas()
	return saveQuotas(c.opts.DataDir, own)
}

func (c *clusterCache) Quotas() (map[uint64]store.Quota, store.Quota) { return c.local.Quotas() }

func quotaProto(dram, nvme int64) *kvmeshv1.Quota {
	return &kvmeshv1.Quota{DramBytes: uint64(dram), NvmeBytes: uint64(nvme)}
}

// quotaRows returns every namespace this node holds blocks of or has a
// quota for, sorted by digest; to a tenant (access a scoped), only those of
// its own blocks.
func (s *adminService) quotaRows(a auth.Access, qc quotaCache) ([]*kvmeshv1.NamespaceQuota, store.Quota) {
	own, def := qc.Quotas()
	rows := map[uint64]*kvmeshv1.NamespaceQuota{}
	row := func(d uint64) *kvmeshv1.NamespaceQuota {
		r := rows[d]
		if r == nil {
			q, ok := own[d]
			if !ok {
				q = def
			}
			r = &kvmeshv1.NamespaceQuota{Digest: d, Quota: quotaProto(q.DRAM, q.NVMe), Own: ok}
			rows[d] = r
		}
		return r
	}
	for d := range own {
		row(d)
	}
	mine := map[uint64]bool{} // the namespaces a may see
	for _, ns := range s.n.cache.Stats().Namespaces {
		if ns.Digest == 0 {
			continue // recovered blocks not read yet: no namespace, no quota
		}
		if !a.Allows(ns.Tenant) {
			continue
		}
		r := row(ns.Digest)
		mine[ns.Digest] = true
		r.Blocks, r.DramBytes, r.NvmeBytes = uint64(ns.Blocks), uint64(ns.DRAMBytes), uint64(ns.NVMeBytes)
	}
	out := make([]*kvmeshv1.NamespaceQuota, 0, len(rows))
	for d, r := range rows {
		if !a.Scoped || mine[d] {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *kvmeshv1.NamespaceQuota) int { return cmpUint64(a.Digest, b.Digest) })
	return out, def
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *adminService) quotaCache() (quotaCache, error) {
	qc, ok := s.n.cache.(quotaCache)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this node's cache has no per-namespace quotas")
	}
	return qc, nil
}

func (s *adminService) SetQuota(ctx context.Context, req *kvmeshv1.SetQuotaRequest) (*kvmeshv1.SetQuotaResponse, error) {
	qc, err := s.quotaCache()
	if err != nil {
		return nil, err
	}
	digest, err := s.n.namespaceDigest(ctx, req.GetNamespace(), req.GetDigest())
	if err != nil {
		return nil, err
	}
	tag, err := s.quotaOwner(ctx, qc, digest, req.GetNamespace() != nil, req.GetClear())
	if err != nil {
		return nil, err
	}
	q := store.Quota{Tenant: tag, Bound: true}
	if !req.GetClear() {
		const max = 1 << 62
		switch {
		case req.GetQuota() == nil:
			return nil, invalid("quota", "required (or set clear to remove the namespace's own quota)")
		case req.GetQuota().GetDramBytes() > max:
			return nil, invalid("quota.dram_bytes", "%d bytes is too large", req.GetQuota().GetDramBytes())
		case req.GetQuota().GetNvmeBytes() > max:
			return nil, invalid("quota.nvme_bytes", "%d bytes is too large", req.GetQuota().GetNvmeBytes())
		}
		q.DRAM, q.NVMe = int64(req.GetQuota().GetDramBytes()), int64(req.GetQuota().GetNvmeBytes())
	}
	if err := qc.SetQuota(digest, q, req.GetClear()); err != nil {
		return nil, err
	}
	s.n.log.Info("namespace quota set", "digest", digestString(digest), "dram_bytes", q.DRAM, "nvme_bytes", q.NVMe, "cleared", req.GetClear())
	rows, _ := s.quotaRows(viewOf(ctx), qc)
	i, _ := slices.BinarySearchFunc(rows, digest, func(r *kvmeshv1.NamespaceQuota, d uint64) int { return cmpUint64(r.Digest, d) })
	resp := &kvmeshv1.SetQuotaResponse{}
	if i < len(rows) && rows[i].Digest == digest {
		resp.Namespace = rows[i]
	} else { // cleared, and no block held: the default applies
		_, def := qc.Quotas()
		resp.Namespace = &kvmeshv1.NamespaceQuota{Digest: digest, Quota: quotaProto(def.DRAM, def.NVMe)}
	}
	return resp, nil
}

// quotaOwner returns the tag of the blocks a quota on digest will bind
// (store.Quota.Bound): the tag of the namespace's blocks on this node. A
// quota is set only on a namespace that holds blocks here, or, for a
// node-wide caller naming the namespace itself (not its digest), on one that
// will: node-wide blocks (tag 0). A tenant's quota so never applies to
// another's namespace, nor to node-wide blocks that take back a digest the
// tenant wrote under first, and made-up digests cannot grow the quotas
// file. A quota already kept may be cleared by whoever it binds.
func (s *adminService) quotaOwner(ctx context.Context, qc quotaCache, digest uint64, named, clear bool) (uint64, error) {
	view := viewOf(ctx)
	for _, x := range s.n.cache.Stats().Namespaces {
		if x.Digest == digest {
			if !view.Allows(x.Tenant) {
				break // mayNameDigest let it through: named by namespace
			}
			return x.Tenant, nil
		}
	}
	own, _ := qc.Quotas()
	if q, ok := own[digest]; clear && ok && (!view.Scoped || (q.Bound && q.Tenant == view.Tag)) {
		return q.Tenant, nil
	}
	if named && !view.Scoped {
		return 0, nil
	}
	return 0, status.Errorf(codes.FailedPrecondition, "namespace %016x holds no blocks of yours on node %s: a quota is set on a namespace that does (a node-wide caller may name one to come by the namespace itself)",
		digest, s.n.opts.NodeID)
}

func (s *adminService) Quotas(ctx context.Context, req *kvmeshv1.QuotasRequest) (*kvmeshv1.QuotasResponse, error) {
	qc, err := s.quotaCache()
	if err != nil {
		return nil, err
	}
	page, err := parsePage(pageQuotas, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	rows, def := s.quotaRows(viewOf(ctx), qc)
	resp := &kvmeshv1.QuotasResponse{NodeId: s.n.opts.NodeID, DefaultQuota: quotaProto(def.DRAM, def.NVMe)}
	resp.Namespaces, resp.NextPageToken = pageOf(pageQuotas, rows, func(r *kvmeshv1.NamespaceQuota) []byte { return digestCursor(r.Digest) }, page.cursor, page.size)
	return resp, nil
}
