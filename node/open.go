package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/internal/privatefs"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/tiers"
)

// Open opens the node's store, store.Local over a DRAM tier of DRAMBytes and
// an NVMe tier of NVMeBytes under DataDir/nvme (recovering what an earlier
// run left there), starts its data plane (TCP on DataAddr, shared memory on
// ShmSocket), joins the cluster (gossip on GossipAddr, seeds in Join) and
// returns the node serving the cluster through its gRPC API, ready to Serve.
// A node with no seeds is a cluster of one that others may join.
func Open(opts Options) (*Node, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := opts.validateGossip(); err != nil {
		return nil, err
	}
	if err := checkHBM(opts); err != nil {
		return nil, err
	}
	if err := checkBackend(opts); err != nil {
		return nil, err
	}
	// The data dir holds cached blocks and the node's state: its user's
	// alone (directories 0700, files 0600).
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: data dir: %w", err)
	}
	if err := resolveNodeID(&opts); err != nil {
		return nil, err
	}
	if opts.Listen.ShmSocket != ShmOff {
		abs, err := filepath.Abs(opts.Listen.ShmSocket)
		if err != nil {
			return nil, fmt.Errorf("node: option ShmSocket: %w", err)
		}
		opts.Listen.ShmSocket = abs
		if err := opts.Validate(); err != nil {
			return nil, err
		}
	}
	tokens, err := tokenSet(&opts.Security)
	if err != nil {
		return nil, err
	}
	quotas, err := loadQuotas(opts.DataDir)
	if err != nil {
		return nil, err
	}
	events, err := openEvents(opts)
	if err != nil {
		return nil, err
	}
	local, err := openLocal(opts, quotas, events.store())
	if le := (*privatefs.LockedError)(nil); errors.As(err, &le) {
		events.close()
		who := "another process"
		if le.PID > 0 {
			who = fmt.Sprintf("process %d", le.PID)
		}
		return nil, &OptionError{Field: "DataDir", Msg: fmt.Sprintf("%s is in use by %s (another kvmesh serve?); stop it, or give this node a data dir of its own", opts.DataDir, who)}
	}
	if err != nil {
		events.close()
		return nil, err
	}
	lis, err := listen(opts)
	if err != nil {
		local.Close()
		events.close()
		return nil, err
	}
	peerSeconds := newPeerHistogram()
	cc, err := startCluster(opts, local, lis.grpc.Addr().String(), lis.http.Addr().String(), peerSeconds, tokens)
	if err != nil {
		lis.close()
		local.Close()
		events.close()
		return nil, err
	}
	n := newNode(opts, cc, lis, tokens, append([]prometheus.Collector{peerSeconds, newClusterCollector(cc)}, events.collectors()...)...)
	n.cluster = cc
	events.bind(&n.names)
	n.events = events
	if err := n.openPrefill(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// openLocal opens the tiers under opts.DataDir and store.Local over them,
// with the namespaces' own quotas (those kept in the data dir).
func openLocal(opts Options, quotas map[uint64]store.Quota, events store.Events) (*store.Local, error) {
	// A slot of either tier must hold the largest block and the tier's
	// 64-byte slot header.
	const slotHeader = 64
	hbm, err := openHBM(opts)
	if err != nil {
		return nil, err
	}
	closeHBM := func() {
		if hbm != nil {
			hbm.Close()
		}
	}
	dramOpts := tiers.DRAMOptions{Capacity: opts.Tiers.DRAMBytes, Populate: opts.Tiers.DRAMPopulate}
	if need := int64(opts.Limits.MaxBlockBytes) + slotHeader; need > tiers.DefaultSlabSize {
		dramOpts.SlabSize = roundUp(need, 64*KiB)
	}
	dram, err := tiers.NewDRAM(dramOpts)
	if err != nil {
		closeHBM()
		return nil, fmt.Errorf("node: DRAM tier of %d bytes: %w", opts.Tiers.DRAMBytes, err)
	}
	nvmeOpts := tiers.NVMeOptions{Dir: filepath.Join(opts.DataDir, "nvme"), Capacity: opts.Tiers.NVMeBytes, Logger: opts.Logger}
	if need := int64(opts.Limits.MaxBlockBytes) + slotHeader; need > 64*MiB {
		nvmeOpts.SegmentSize = roundUp(need, 4*KiB)
	}
	nvme, err := tiers.OpenNVMe(nvmeOpts)
	if err != nil {
		dram.Close()
		closeHBM()
		return nil, fmt.Errorf("node: NVMe tier in %s: %w", nvmeOpts.Dir, err)
	}
	local, err := store.Open(store.Options{HBM: hbm, DRAM: dram, NVMe: nvme, MaxBlockBytes: opts.Limits.MaxBlockBytes, MaxBlocks: opts.Tiers.MaxBlocks, Eviction: store.Eviction(opts.Tiers.Eviction), NVMeReusedOnly: opts.Tiers.NVMeAdmission == "reused",
		PartialTTL: opts.Tiers.PartialTTL, ClaimTTL: opts.Tiers.ClaimTTL,
		MaxRetentionTTL: opts.Tiers.MaxRetentionTTL, MaxPinnedFraction: opts.Tiers.MaxPinnedFraction, Events: events,
		Quotas: quotas, DefaultQuota: store.Quota{DRAM: opts.Tiers.QuotaDRAMBytes, NVMe: opts.Tiers.QuotaNVMeBytes}})
	if err != nil {
		dram.Close()
		nvme.Close()
		closeHBM()
		return nil, fmt.Errorf("node: open cache: %w", err)
	}
	return local, nil
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// cacheError translates store's sentinels into the Cache contract's.
func cacheError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, store.ErrFull), errors.Is(err, store.ErrQuota):
		return fmt.Errorf("%w: %w", ErrFull, err)
	case errors.Is(err, store.ErrLayout):
		return fmt.Errorf("%w: %w", block.ErrCorrupt, err)
	case errors.Is(err, store.ErrClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// localStats converts store.Local's counters.
func localStats(l *store.Local) CacheStats {
	s := l.Stats()
	// A move between HBM and DRAM is one tier down or up like the others.
	out := CacheStats{Hits: s.Hits, Misses: s.Misses, Evictions: s.Evictions,
		Demotions: s.Demotions + s.HBMDemotions, Promotions: s.Promotions + s.HBMPromotions,
		PromotionsDeferred: s.PromotionsDeferred, QuotaRefused: s.QuotaRefused, CorruptDrops: s.CorruptDrops,
		Retained: int64(s.Retained), PinnedBytes: s.PinnedBytes, Removed: s.Removed,
		Parts: PartStats{Open: int64(s.PartialsOpen), Bytes: s.PartialBytes, Stored: s.PartsStored, Completed: s.PartsCompleted,
			Conflicts: s.PartConflicts, Expired: s.PartialsExpired, Dropped: s.PartialsDropped, Claims: s.Claims},
		SecondChances: s.SecondChances, ReusedBlocks: s.ReusedBlocks, BranchingBlocks: s.BranchingBlocks}
	for _, t := range s.Tiers {
		out.Tiers = append(out.Tiers, TierStats{Name: t.Name, Blocks: t.Blocks, Bytes: t.Bytes, Capacity: t.Capacity, Warm: t.Warm, Evicted: t.Evicted,
			WrittenBytes: t.WrittenBytes})
	}
	for _, n := range s.Namespaces {
		out.Namespaces = append(out.Namespaces, NamespaceStats{Digest: n.Digest, Tenant: n.Tenant, Blocks: n.Blocks, Bytes: n.Bytes, Tokens: n.Tokens,
			DRAMBytes: n.DRAMBytes, NVMeBytes: n.NVMeBytes, QuotaDRAM: n.Quota.DRAM, QuotaNVMe: n.Quota.NVMe})
	}
	return out
}
