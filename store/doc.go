// Package store is the cache as its callers see it: Local, one node's blocks
// over its tiers, and Cluster, placement and peers on top of Local. It owns
// the caching policy; the block format it stores is package block's.
//
// # Local
//
// Local caches encoded blocks over a memory tier (DRAM) and an optional
// persistent tier (NVMe), both tiers.Tier values the node constructs and
// hands over in Options. The tiers store bytes; Local keeps the only index
// and makes every decision.
//
// Tiers are exclusive: a block lives in exactly one tier. Inclusive caching
// would spend NVMe space and write bandwidth on copies of the hottest blocks,
// which are the ones least likely to need it, and would leave two copies to
// keep consistent on drops; an NVMe hit pays one promotion instead.
//
// Policy:
//
//   - Writes land in DRAM. Put verifies the whole block first; putting a
//     cached block is a cheap no-op that touches it.
//   - DRAM pressure demotes the coldest idle blocks to NVMe, at least
//     Options.DemoteBatchBytes at a time for a write (a promotion: see below) (one tiers.Batcher write when the
//     tier has it), within a sixteenth of the DRAM tier (a batch as large
//     as the tier would empty it at each round, hot blocks and all); with
//     no NVMe, or NVMe refusing, they are dropped. Under
//     tiers.Classed a value only frees room for its own size class: the
//     coldest blocks of the class are moved, and when the class owns no
//     memory, the slab the tier names in Evacuate is emptied.
//   - NVMe pressure (under tiers.Segmented) reclaims the oldest segment:
//     blocks touched since they were written there are read back and
//     rewritten, the rest are dropped, and the segment goes.
//   - An NVMe hit is read, verified and promoted to DRAM: into free room on
//     the block's first hit since it landed on NVMe, making room as a write
//     would (demoting colder blocks) from its second, so that a working set
//     larger than DRAM does not turn every hit into a read plus a demotion
//     write; otherwise it is served from the copy. One promotion at a time
//     makes room, and only the room it needs (one block, not a
//     DemoteBatchBytes batch, whose spare room would go to first hits): a
//     second hit that finds another promotion demoting takes free room
//     only, keeps its mark and may push at a later hit, so that the 8 reads
//     of a prompt in flight do not each wait for a demotion of their own.
//     GetMany reads a prompt's NVMe blocks 8 at a time.
//   - With an HBM tier (Options.HBM, GPU memory) on top of DRAM, writes and
//     promotions land in HBM first; HBM pressure demotes its least recently
//     used blocks into DRAM, never past it; a DRAM hit promotes the block
//     back to HBM. For the index, recency lists and quotas, an HBM block is
//     a memory block; its location says where its bytes are
//     (local_hbm.go). HBM blocks are served from a copy.
//   - Prefix-aware recency: GetMany touches a chain deepest-first (a lookup,
//     LongestPrefix, probes once per block and touches nothing), and a block
//     put (or put again) is placed right behind
//     its parent when the parent is in the same list, so within a chain the
//     ancestors are warmer and leaves are evicted first. A new block whose
//     parent is the coldest block of its class is itself the coldest: it
//     goes straight to NVMe or, memory-only, is evicted at once (Put
//     succeeds) rather than evicting its own parent (counted as
//     TierEvictions.Unadmitted).
//   - A block is linked to its parent when the parent is cached at the time
//     of its Put (or of its resolution after a restart) and belongs to the
//     same namespace. Dropping a block for any reason drops every linked
//     descendant too, in every tier: a node never keeps a descendant whose
//     ancestor it dropped. A block naming another namespace's block as its
//     parent (forged: keys chain from the namespace) is neither linked to
//     nor placed behind it, so one tenant's drops never cascade into
//     another's.
//   - Options.Eviction picks the policy (evict.go). EvictLRU is the
//     reference: the recency above, nothing else. EvictDedup, the default,
//     also knows copies: a block stored with PutCopy is one whose owner,
//     by placement, is another node (the producer's copy Cluster.Put keeps,
//     a block KeepRemote fetched). A copy is listed at the cold end of its
//     tier and stays there when touched, so a full node evicts its copies
//     before any block it owns; it is never linked to a parent or a child
//     (it may go before a block put under it, which its owner's chain
//     does not need); DRAM pressure drops it instead of demoting it; and
//     its owner's Put of the same block makes it an ordinary block. The
//     copy mark is the top bit of the entry's hit counter. EvictReuse is
//     EvictDedup that also knows reuse: a lookup that finds a block
//     touches it (deepest-first) and marks it, as a read does, and eviction
//     passes over a marked block once, moving it to the hot end (a second
//     chance per reuse; the mark is the next bit of the hit counter). A
//     block put under a marked parent moves the parent to the hot end
//     first. Quota trimming stays LRU under every policy. With
//     Options.NVMeReusedOnly (EvictReuse only), DRAM pressure writes to
//     NVMe only the victims marked or read since they were put, and drops
//     the others (NVMe admission, counted as NVMe's
//     TierEvictions.Unadmitted). Every policy keeps retention (retain.go:
//     a retained or reader-held block also keeps its cached ancestors),
//     readers' blocks, parents before children and the groups' retired
//     records first: testdata/scenarios/rules runs each file under each.
//   - Capacity limits are the tiers' own: a tier refuses (tiers.ErrFull)
//     rather than grow, and Local makes room or refuses the write with
//     ErrFull. The index is bounded by Options.MaxBlocks: full, it
//     reclaims an NVMe segment, else drops the coldest idle NVMe block,
//     else memory's. Transient heap buffers are bounded too: one block per
//     promotion in flight, one segment's rewrite set per reclaim, one
//     block in the recovery scan.
//
// # Parts
//
// A put of a part record (the layers and heads of one parallel rank,
// block.Header.Whole false) is assembled into an incomplete block, complete
// and indexed when its parts cover every cell; until then it is in no
// index, goes first when DRAM needs room and expires after
// Options.PartialTTL. Claim lets ranks holding identical bytes send them
// once. See local_parts.go and docs/ARCHITECTURE.md.
//
// # Groups (hybrid models)
//
// A namespace with groups (prefixhash.Groups) stores one record per group
// of each block, group g's under GroupKey(k_i, g); each group is an entry
// of its own in the namespace table (its record size), while a drop, a
// tenant check and stats by digest cover them all, and a quota holds each
// group to it. A full or indexer record hangs from the same group's record
// of the parent block, a sliding or state record from the anchor's (the
// first full group's) record of its own block (block.Header.LinkParent),
// so dropping a full block drops the windows and states that need it.
// Resume applies the hit rule (prefixhash.Resume) to what is held here.
// When a chain grows past them, the window block that fell out of its
// window (unless a branch starts within the window) and the state before
// its newest are retired: listed at the cold end, dropped first when
// memory is needed (before any live block, in any size class), never
// demoted; a read makes a record ordinary again (local_groups.go).
//
// # Objects and retention
//
// Beside blocks the store holds objects' pieces (block.KindObject records,
// issue 33): stored, verified, demoted, promoted, persisted and recovered as
// blocks are, placed by their own key, never linked into a chain. A
// namespace's objects are grouped by encoded size in the namespace table
// (local_ns.go), so that every group, like a namespace's blocks, has one
// size; one account per digest counts blocks and objects together against
// the namespace's quota. Putting a key already cached is a no-op; Remove
// drops values by key (an upsert is a Remove and a Put). Retain gives any
// cached value (an object's piece, a prefix's blocks) a lease, a soft pin
// or a hard pin; an object's writer may ask for one in its record, applied
// as it is stored (retain.go: the policy and its limits).
//
// # Quotas
//
// A namespace (by digest; a tenant is a namespace salt) may hold at most
// its quota of each tier: Options.Quotas, else Options.DefaultQuota, in
// encoded block bytes per tier, 0 for unlimited (the default); SetQuota,
// ClearQuota and SetDefaultQuota change them at run time. Stats reports each
// namespace's bytes per tier beside its quota. The bytes a namespace holds
// in a tier never exceed its quota there, whatever runs concurrently: every
// write and move into a tier reserves its bytes first, within the quota.
//
//   - A write (or a promotion) that would take its namespace past its DRAM
//     quota first makes room among the namespace's own blocks, by the
//     policy above restricted to the namespace: its coldest idle DRAM
//     blocks are demoted (at most DemoteBatchBytes, or a sixteenth of the
//     quota, at a time), leaves first. A new block whose parent is the
//     namespace's coldest DRAM block, or is in NVMe, is colder than what it
//     would displace: it goes to NVMe, or is evicted at once.
//   - A demotion, by quota or by the node's own pressure, counts against
//     the namespace's NVMe quota: the namespace drops its own coldest NVMe
//     blocks (with their descendants; the NVMe list keeps a chain's leaves
//     behind their parents) to make room, or the demoted block is dropped.
//   - When no room can be made in DRAM (the namespace's blocks there are
//     pinned or moving, or a block exceeds the quota), the block goes to
//     NVMe within that quota; a namespace with a DRAM quota below one block
//     lives in NVMe only. When neither tier has room within quota, the Put
//     fails with ErrQuota (gRPC ResourceExhausted). A promotion that finds
//     no room is served from its copy and stays in NVMe.
//   - A namespace over its quota never evicts or demotes another's blocks.
//     Blocks of a namespace within its quota go only by the node's own
//     pressure: when the quotas add up to more than the tiers hold, the
//     tiers are shared as before, coldest first. NVMe space is reclaimed by
//     whole segments, oldest first, whoever wrote them: a quota bounds the
//     bytes a namespace keeps, not the segment churn its writes cause.
//   - Lowering a quota trims the namespace at once; blocks pinned meanwhile
//     keep it over until its next write makes room (SetQuota says so with
//     ErrQuota). Blocks recovered after a restart count when their header
//     is read (until then they are digest 0, which has no quota); one its
//     namespace's NVMe quota has no room for is evicted.
//
// Finding a namespace's coldest blocks in recency lists shared by all
// namespaces costs a walk past other namespaces' blocks; a cold cursor per
// namespace and tier (quota.go) keeps that walk amortized O(1) per block
// moved (BenchmarkQuotaPut: flat with 65536 idle blocks of another
// namespace in the way). The quota state is per namespace; the index entry
// is unchanged but for one flag bit.
//
// # Index
//
// One 52-byte entry per block (key, tier, location, recency links, parent
// and children links, namespace id, pins, hits, flags) in pages of a slab
// addressed by uint32, found through an open-addressing table of uint32
// slots keyed by the key's own bits. The block size is kept once per
// namespace, since a namespace digest fixes it. No pointers: the GC never
// scans the index. BenchmarkIndexBytesPerBlock measures about 60 bytes per
// block at a million blocks, table included (target: 64).
//
// # Pins and verification
//
// Get returns a Ref: the block's bytes, verified, pinned until Release.
// Blocks in a tiers.Viewer tier are served in place (the Ref aliases tier
// memory; Local checks the header's key, or the whole block with
// Options.VerifyMemoryHits); others are copied out. A pinned block is never
// freed, moved or evicted: eviction skips it, a drop (DropNamespace, a
// cascade) removes it from the index at once but frees its bytes at the last
// Release. Bytes read from a tier are always verified before they are
// served or moved: block.Decode (header and payload checksums, key), or, for
// a read from NVMe (a hit, a segment's rewrite, the recovery scan) when the
// tier checks every byte it reads against the sum taken when it was written
// (tiers.Checked) and VerifyMemoryHits is off, that check and the header's
// (block.DecodeFramed: checksum, length, key), so the payload is hashed once
// per read, not twice. A read that returns tiers.ErrCorrupt, or bytes that fail
// verification, drop the block and its descendants, count a corrupt drop and
// answer ErrNotFound. An NVMe hit is read into a buffer pooled by size,
// returned at Release.
//
// # Restart
//
// Open rebuilds the index from a tiers.Recoverable NVMe tier (key, location
// and length of every block that survived). Those blocks serve hits at once;
// their namespace and parent are learnt when each is first read, and a
// background scan reads them all once (Options.SkipRecoveryScan turns it
// off). DropNamespace applies to unread recovered blocks when they are read.
//
// # Concurrency
//
// All methods of Local and Ref are safe for concurrent use (a Ref's Release
// must still be called once). One mutex guards the index; it is never held
// across tier I/O or a copy of a block. A mover (demotion, promotion,
// segment rewrite, recovery read) marks its entries under the lock, copies
// without it and commits under it again; a Get of a block in NVMe that
// another mover holds waits for it (or for its context). A persistent-tier
// writer holds Local.diskMu shared from its write until the index knows the
// new location, so a segment is never dropped under a value the index cannot
// see yet. A dropped block's NVMe location is freed after the lock is
// released, so reclaim may drop its segment first: reclaim marks such a
// location (Local.mu.orphans), and the free, under diskMu shared, skips it.
// Close stops the recovery scan, waits for operations in flight and
// closes the tiers, or returns ErrPinned while Refs are live.
package store
