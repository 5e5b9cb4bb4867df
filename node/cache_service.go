package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// cacheService implements kvmesh.v1.CacheService over the node's Cache.
type cacheService struct {
	kvmeshv1.UnimplementedCacheServiceServer
	n *Node
}

func (s *cacheService) Lookup(ctx context.Context, req *kvmeshv1.LookupRequest) (*kvmeshv1.LookupResponse, error) {
	ns, err := s.n.namespace(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	keys, promptTokens, err := s.n.lookupChain(ns, req)
	if err != nil {
		return nil, err
	}
	resp := &kvmeshv1.LookupResponse{
		PromptBlocks: uint32(len(keys)),
		PromptTokens: uint64(promptTokens),
	}
	var n int
	var locs []Location
	if ns.Groups.IsZero() {
		n, locs = s.n.cache.Locate(ctx, keys, ns.BlockTokens)
	} else {
		locs = s.lookupGroups(ctx, ns, keys, resp)
		n = int(resp.CachedBlocks)
	}
	if n > 0 {
		s.n.names.keep(ns)
	}
	cached := n * ns.BlockTokens
	s.n.metrics.promptTokens.Add(float64(promptTokens))
	s.n.metrics.cachedTokens.Add(float64(cached))
	s.n.metrics.lookups.add(ns.Digest(), promptTokens, cached)
	resp.CachedBlocks, resp.CachedTokens = uint32(n), uint64(cached)
	resp.Runs, resp.Nodes = lookupRuns(locs, s.n.opts.NodeID)
	if !req.GetSummary() {
		resp.Blocks = lookupBlocks(keys[:n], locs, s.n.opts.NodeID)
	}
	return resp, nil
}

// lookupRuns converts the runs of a cached prefix, and makes the table of
// the nodes they name. self stands for the empty Location.Node.
func lookupRuns(locs []Location, self string) ([]*kvmeshv1.CachedRun, []string) {
	runs := make([]*kvmeshv1.CachedRun, 0, len(locs))
	var nodes []string
	for _, l := range locs {
		id := cmp.Or(l.Node, self)
		ni := slices.Index(nodes, id) // a handful of nodes
		if ni < 0 {
			ni = len(nodes)
			nodes = append(nodes, id)
		}
		runs = append(runs, &kvmeshv1.CachedRun{Blocks: uint32(l.Blocks), Node: uint32(ni), Tier: l.Tier})
	}
	return runs, nodes
}

// lookupBlocks lists a cached prefix (keys) block by block, as a full
// Lookup answer does: the messages and their keys share two allocations.
func lookupBlocks(keys []prefixhash.Key, locs []Location, self string) []*kvmeshv1.CachedBlock {
	msgs := make([]kvmeshv1.CachedBlock, len(keys))
	raw := make([]byte, len(keys)*prefixhash.KeySize)
	out := make([]*kvmeshv1.CachedBlock, 0, len(keys))
	for _, l := range locs {
		for range l.Blocks {
			i := len(out)
			k := raw[i*prefixhash.KeySize : (i+1)*prefixhash.KeySize : (i+1)*prefixhash.KeySize]
			copy(k, keys[i][:])
			b := &msgs[i]
			b.Key, b.NodeId, b.Tier = k, cmp.Or(l.Node, self), l.Tier
			out = append(out, b)
		}
	}
	return out
}

// maxReadWindow bounds the bytes of blocks a BatchGet holds at once: read
// from the cache (pinned, or fetched from peers into memory) and not yet
// sent.
const maxReadWindow = 64 * MiB

func (s *cacheService) BatchGet(req *kvmeshv1.BatchGetRequest, stream kvmeshv1.CacheService_BatchGetServer) error {
	ns, err := s.n.namespace(stream.Context(), req.GetNamespace())
	if err != nil {
		return err
	}
	var keys, chunkKeys []prefixhash.Key
	var tokens []uint32 // set for a read by tokens: the blocks must hold them
	switch {
	case len(req.GetKeys()) > 0 && len(req.GetTokens()) > 0:
		return invalid("keys", "set keys or tokens, not both")
	case len(req.GetKeys()) > 0:
		if len(req.GetExtraKeys()) > 0 {
			return invalid("extra_keys", "only with tokens: keys already cover their blocks' extra keys")
		}
		if keys, err = s.n.parseKeys("keys", req.GetKeys()); err != nil {
			return err
		}
		if chunkKeys, err = s.n.parseChunkKeys(req.GetChunkKeys(), len(keys)); err != nil {
			return err
		}
	default:
		if len(req.GetChunkKeys()) > 0 {
			return invalid("chunk_keys", "only with keys: a prompt's chunk keys follow from its tokens")
		}
		if keys, err = s.n.promptKeys(ns, req.GetTokens(), req.GetExtraKeys()); err != nil {
			return err
		}
		tokens = req.GetTokens()
		if !ns.Groups.IsZero() {
			if !req.GetResume() {
				return invalid("resume", "a read by tokens in a namespace with groups reads what resuming needs: set resume (or read records by keys)")
			}
			return s.batchGetResume(ns, keys, tokens, stream)
		}
		chunkKeys = chainChunkKeys(keys, s.n.cache.ChunkBlocks(ns.BlockTokens))
	}
	ctx := stream.Context()
	// The remote part of the whole request is bounded once, so that a
	// dead peer costs one GetTimeout, not one per window.
	remoteBy := time.Now().Add(s.n.opts.Cluster.GetTimeout)
	// Windows grow from one block, so that the first block leaves at once,
	// to maxReadWindow bytes.
	maxWindow := max(1, maxReadWindow/block.EncodedLen(ns.BlockTokens, ns.BlockBytes()))
	var frame kvmeshv1.BatchGetResponse
	for lo, window := 0, 1; lo < len(keys); lo, window = lo+window, min(2*window, maxWindow) {
		hi := min(lo+window, len(keys))
		var cks []prefixhash.Key
		if chunkKeys != nil {
			cks = chunkKeys[lo:hi]
		}
		blocks, release, err := s.n.cache.Read(ctx, keys[lo:hi], cks, remoteBy)
		if err != nil {
			return err
		}
		stop, err := s.sendWindow(ctx, stream, &frame, ns, lo, keys, tokens, hi, blocks, req.GetPrefix() || req.GetResume())
		release()
		if err != nil || stop {
			return err
		}
	}
	return nil
}

// sendWindow streams the blocks read for keys[base:hi], the request's keys
// (a chain from block 0 when tokens, the prompt's, are set). It reports stop
// when prefix is set and a miss ended the stream.
func (s *cacheService) sendWindow(ctx context.Context, stream kvmeshv1.CacheService_BatchGetServer, frame *kvmeshv1.BatchGetResponse,
	ns prefixhash.Namespace, base int, keys []prefixhash.Key, tokens []uint32, hi int, blocks [][]byte, prefix bool) (stop bool, err error) {
	for i := base; i < hi; i++ {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		var want wantBlock
		if tokens != nil {
			want.tokens = tokens[i*ns.BlockTokens : (i+1)*ns.BlockTokens]
			if i == 0 {
				want.parent = ns.Root()
			} else {
				want.parent = keys[i-1]
			}
		}
		found, err := s.sendBlock(stream, frame, ns, uint32(i), keys[i], want, blocks[i-base])
		if err != nil {
			return false, err
		}
		if !found && prefix {
			return true, nil
		}
	}
	return false, nil
}

// chainChunkKeys returns the chunk key of every block of a chain from block
// 0, with chunkBlocks blocks per chunk.
func chainChunkKeys(chain []prefixhash.Key, chunkBlocks int) []prefixhash.Key {
	out := make([]prefixhash.Key, len(chain))
	for i := range chain {
		out[i] = prefixhash.ChunkKey(chain, i, chunkBlocks)
	}
	return out
}

// wantBlock is what a read by tokens asks of a block: its parent and tokens
// (nil tokens: a read by keys, which asks nothing more than the key).
type wantBlock struct {
	parent prefixhash.Key
	tokens []uint32
}

// sendBlock streams encoded block b (nil: a miss) as request index i: one
// miss frame, or the block in chunks of at most ChunkBytes payload bytes. b
// must stay valid until sendBlock returns (Send copies the message). For a
// read by tokens, want is checked before the key: a block holding other
// tokens is refused as such.
func (s *cacheService) sendBlock(stream kvmeshv1.CacheService_BatchGetServer, frame *kvmeshv1.BatchGetResponse,
	ns prefixhash.Namespace, i uint32, key prefixhash.Key, want wantBlock, b []byte) (bool, error) {
	return s.sendBlockAs(stream, frame, ns, i, 0, key, want, b)
}

// sendBlockAs is sendBlock for a record of group group-1 (0: no group),
// which its frames name.
func (s *cacheService) sendBlockAs(stream kvmeshv1.CacheService_BatchGetServer, frame *kvmeshv1.BatchGetResponse,
	ns prefixhash.Namespace, i, group uint32, key prefixhash.Key, want wantBlock, b []byte) (bool, error) {
	miss := func() (bool, error) {
		*frame = kvmeshv1.BatchGetResponse{Index: i, Key: key[:], Last: true, Group: group}
		return false, stream.Send(frame)
	}
	if b == nil {
		return miss()
	}
	blk, err := block.Decode(b, 0)
	if err == nil {
		err = blk.CheckNamespace(ns)
	}
	if err == nil && want.tokens != nil {
		err = blk.CheckTokens(want.parent, want.tokens)
	}
	if err == nil && blk.Key != key {
		err = errors.New("block key differs from the key asked for")
	}
	if err != nil {
		// A block another namespace produced, one holding other tokens,
		// or bytes that fail verification, are never served: the caller
		// recomputes. The log names no key: keys are the tenant's to know.
		reason := refusedVerify
		if errors.Is(err, block.ErrTokens) {
			reason = refusedTokens
		}
		s.n.metrics.dropped.WithLabelValues(reason).Inc()
		s.n.log.Warn("block refused", "reason", reason, "err", err)
		return miss()
	}
	chunk := s.n.opts.Limits.ChunkBytes
	payload := blk.Payload
	*frame = kvmeshv1.BatchGetResponse{
		Index: i, Key: key[:], Found: true, Parent: blk.Parent[:], Tokens: blk.Tokens,
		PayloadLen: uint64(len(payload)), PayloadChecksum: blk.Checksum, ExtraKeys: blk.Extra, Group: group,
	}
	if blk.Group.Set {
		frame.Group = uint32(blk.Group.Index + 1) // a record read by key names its group too
	}
	if blk.Scheme == prefixhash.SchemeVLLM {
		frame.ParentLink = blk.ParentLink[:]
	}
	for off := 0; ; {
		end := min(off+chunk, len(payload))
		frame.Offset, frame.Data, frame.Last = uint64(off), payload[off:end], end == len(payload)
		if err := stream.Send(frame); err != nil {
			return false, err
		}
		if frame.Last {
			break
		}
		off = end
		*frame = kvmeshv1.BatchGetResponse{Index: i}
	}
	s.n.metrics.blocks.WithLabelValues("get").Inc()
	s.n.metrics.bytes.WithLabelValues("get").Add(float64(len(payload)))
	return true, nil
}

// putBlock is the block a BatchPut stream is receiving.
type putBlock struct {
	index  int
	parent prefixhash.Link // what its key chains from (the parent key, or under the vllm scheme its whole hash)
	extra  prefixhash.ExtraKeys
	chunk  prefixhash.Key // its chunk key, when the header named one
	pos    int            // its position in its prompt, -1 when unknown
	group  int            // the group whose record it is, -1 without groups
	tokens []uint32
	sum    uint64 // the client's payload checksum, 0 when not given
	buf    []byte // header room, then the payload as it arrives; nil until its first payload bytes
	hl     int    // header length
	size   int    // header and payload length
	got    int    // payload bytes received
}

func (b *putBlock) payload() []byte { return b.buf[b.hl:] }

func (b *putBlock) payloadLen() int { return b.size - b.hl }

// chunkKey returns the chunk key of the block, whose key is key: the one its
// header named; else, when its position is known, the key of the first
// block of its chunk (*start, updated here as chunks begin); else its own
// key (the block is taken to start a chunk).
func (b *putBlock) chunkKey(key prefixhash.Key, start *prefixhash.Key, chunkBlocks int) prefixhash.Key {
	if b.pos >= 0 && b.pos%chunkBlocks == 0 {
		*start = key
	}
	switch {
	case !b.chunk.IsZero():
		return b.chunk
	case b.pos >= 0:
		return *start
	}
	return key
}

func (s *cacheService) BatchPut(stream kvmeshv1.CacheService_BatchPutServer) error {
	ctx := stream.Context()
	p := &batchPut{s: s, ctx: ctx, tenant: auth.PrincipalFrom(ctx).Tenant}
	defer p.drop()
	for {
		msg, err := recvWithin(ctx, s.n.opts.Limits.ReceiveTimeout, stream.Recv)
		if err == io.EOF {
			if cur := p.cur; cur != nil {
				return invalid("data", "stream ended inside block %d: %d of %d payload bytes", cur.index, cur.got, cur.payloadLen())
			}
			return stream.SendAndClose(&kvmeshv1.BatchPutResponse{Stored: uint32(len(p.keys)), Keys: p.keys})
		}
		if err != nil {
			return err
		}
		if err := p.receive(msg); err != nil {
			return err
		}
	}
}

// batchPut is one BatchPut stream as it is received: its namespace, the
// block being received and the blocks stored.
type batchPut struct {
	s      *cacheService
	ctx    context.Context
	tenant string // the caller's tenant, charged for the block buffer
	nsPB   *kvmeshv1.Namespace
	ns     prefixhash.Namespace
	prev   prefixhash.Link // the last block stored, or the root
	cur    *putBlock
	keys   [][]byte
	blocks int
	next   int            // position of the next block in its prompt, -1 when unknown
	chunk  prefixhash.Key // chunk key of the chunk the known positions are in
	cb     int            // blocks per chunk
	last   *putBlock      // the previous record, in a namespace with groups
}

// receive takes one message of the stream: the namespace (first), a
// block's header, its payload bytes; a block whose last byte came is
// stored.
func (p *batchPut) receive(msg *kvmeshv1.BatchPutRequest) error {
	if err := p.namespace(msg.GetNamespace()); err != nil {
		return err
	}
	if h := msg.GetBlock(); h != nil {
		if err := p.header(h); err != nil {
			return err
		}
	}
	if data := msg.GetData(); len(data) > 0 {
		if err := p.data(data); err != nil {
			return err
		}
	}
	if p.cur != nil && p.cur.buf != nil && p.cur.got == p.cur.payloadLen() {
		return p.store()
	}
	return nil
}

// namespace takes the stream's namespace: required in the first message,
// the same in any later one.
func (p *batchPut) namespace(pb *kvmeshv1.Namespace) error {
	switch {
	case pb != nil && p.nsPB == nil:
		ns, err := p.s.n.namespace(p.ctx, pb)
		if err != nil {
			return err
		}
		p.nsPB, p.ns, p.prev = pb, ns, ns.RootLink()
		p.cb = p.s.n.cache.ChunkBlocks(ns.BlockTokens)
	case pb != nil && !proto.Equal(pb, p.nsPB):
		return invalid("namespace", "changed within the stream; send one stream per namespace")
	case p.nsPB == nil:
		return invalid("namespace", "required in the stream's first message")
	}
	return nil
}

// header starts a block.
func (p *batchPut) header(h *kvmeshv1.BlockHeader) error {
	if cur := p.cur; cur != nil {
		return invalid("block", "block %d started before block %d was complete (%d of %d payload bytes)",
			p.blocks, cur.index, cur.got, cur.payloadLen())
	}
	cur, err := p.s.startBlock(p.ns, h, p.blocks, p.prev)
	if err != nil {
		return err
	}
	named := len(h.GetParent()) > 0 || len(h.GetParentLink()) > 0
	if !named && p.last != nil && cur.group > p.last.group {
		// Another group's record of the previous record's block.
		cur.parent, cur.pos = p.last.parent, p.last.pos
	} else {
		// A stream that has named no parent is a prompt from block 0:
		// its blocks' positions, hence chunk keys, are known.
		if named {
			p.next = -1
		}
		cur.pos = p.next
		if p.next >= 0 {
			p.next++
		}
	}
	p.cur = cur
	p.blocks++
	return nil
}

// data takes payload bytes of the current block, into a buffer charged to
// the node's budget from its first bytes.
func (p *batchPut) data(data []byte) error {
	cur := p.cur
	if cur == nil {
		return invalid("data", "payload bytes before a block header")
	}
	if cur.got+len(data) > cur.payloadLen() {
		return invalid("data", "block %d: more payload bytes than its payload_len of %d", cur.index, cur.payloadLen())
	}
	if cur.buf == nil {
		if err := p.s.n.putBudget.acquire(p.ctx, p.tenant, int64(cur.size), fmt.Sprintf("block %d of the BatchPut stream", cur.index)); err != nil {
			return err
		}
		cur.buf = getBlockBuf(cur.size)
	}
	cur.got += copy(cur.payload()[cur.got:], data)
	return nil
}

// store encodes the complete current block's header, checks its checksum
// and stores it, then gives its buffer back.
func (p *batchPut) store() error {
	cur, ctx := p.cur, p.ctx
	// A tenant's blocks carry its tag (0 for node-wide callers).
	var hdr []byte
	var link prefixhash.Link
	var err error
	if cur.group < 0 {
		hdr, link, err = block.AppendHeaderExt(cur.buf[:0], auth.AccessFrom(ctx).Tag, p.ns, cur.parent, cur.tokens, cur.extra, cur.payload())
	} else {
		hdr, link, err = block.AppendGroupHeader(cur.buf[:0], auth.AccessFrom(ctx).Tag, p.ns, cur.group, cur.parent, cur.tokens, cur.extra,
			block.GroupLayout(p.ns, cur.group).Whole(), cur.payload())
	}
	if err != nil {
		return invalid("block", "block %d: %v", cur.index, err)
	}
	if len(hdr) != cur.hl {
		panic(fmt.Sprintf("node: block %d: header of %d bytes, %d reserved", cur.index, len(hdr), cur.hl))
	}
	key, recKey := link.Key(), link.Key()
	if cur.group >= 0 {
		recKey = prefixhash.GroupKey(key, cur.group)
	}
	if h, _ := block.DecodeHeader(cur.buf, 0); cur.sum != 0 && h.Checksum != cur.sum {
		return invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_BLOCK_CORRUPT, nil, "block.payload_checksum", "block %d: payload checksum %016x, received bytes hash to %016x",
			cur.index, cur.sum, h.Checksum)
	}
	if err := p.s.n.cache.Put(ctx, cur.buf, cur.chunkKey(key, &p.chunk, p.cb)); err != nil {
		if errors.Is(err, ErrQuota) {
			return quotaExceeded(p.ns.Digest(), err)
		}
		return err
	}
	p.s.n.metrics.blocks.WithLabelValues("put").Inc()
	p.s.n.metrics.bytes.WithLabelValues("put").Add(float64(cur.got))
	if len(p.keys) == 0 {
		p.s.n.names.keep(p.ns)
	}
	p.keys = append(p.keys, keyBytes(recKey))
	p.drop()
	p.prev, p.last, p.cur = link, cur, nil
	return nil
}

// drop gives the current block's buffer back, and its bytes to the
// node's budget: from the block's first payload bytes until it is stored,
// or until the stream goes silent for ReceiveTimeout, it is charged.
func (p *batchPut) drop() {
	if cur := p.cur; cur != nil && cur.buf != nil {
		putBlockBuf(cur.buf)
		p.s.n.putBudget.release(p.tenant, int64(cur.size))
		cur.buf = nil
	}
}

// recvWithin returns the next message recv receives, or DeadlineExceeded
// when none arrives within d. gRPC's Recv takes no deadline, so it runs in
// a goroutine of its own; after a timeout the handler returns, which ends
// the stream, and that Recv returns with it (its goroutine then exits).
func recvWithin[T any](ctx context.Context, d time.Duration, recv func() (*T, error)) (*T, error) {
	if d <= 0 {
		return recv()
	}
	type result struct {
		m   *T
		err error
	}
	got := make(chan result, 1)
	go func() {
		m, err := recv()
		got <- result{m, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-got:
		return r.m, r.err
	case <-t.C:
		return nil, status.Errorf(codes.DeadlineExceeded, "no message for %v (receive_timeout): the stream is ended and what it held released; send each message within it", d)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// startBlock checks a block header against the namespace and the limits
// and returns the block to fill. Its buffer comes with its first payload
// bytes.
func (s *cacheService) startBlock(ns prefixhash.Namespace, h *kvmeshv1.BlockHeader, index int, prev prefixhash.Link) (*putBlock, error) {
	if err := s.n.blockLimit("block", index+1); err != nil {
		return nil, err
	}
	parent := prev
	switch pl := h.GetParentLink(); {
	case ns.Scheme == prefixhash.SchemeVLLM && len(pl) > 0:
		if len(pl) != prefixhash.LinkSize {
			return nil, invalid("block.parent_link", "block %d: %d bytes; a vllm parent link is %d", index, len(pl), prefixhash.LinkSize)
		}
		parent = prefixhash.Link(pl)
		if p := h.GetParent(); len(p) > 0 && string(p) != string(pl[:prefixhash.KeySize]) {
			return nil, invalid("block.parent", "block %d: parent is not the first %d bytes of parent_link", index, prefixhash.KeySize)
		}
	case len(pl) > 0:
		return nil, invalid("block.parent_link", "block %d: only the vllm key scheme chains from parent links; give parent", index)
	case ns.Scheme == prefixhash.SchemeVLLM && len(h.GetParent()) > 0:
		k, err := parseKey("block.parent", h.GetParent())
		if err != nil {
			return nil, err
		}
		if k != ns.Root() {
			return nil, invalid("block.parent_link", "block %d: a vllm block below the root needs its parent's 32-byte hash in parent_link", index)
		}
		parent = ns.RootLink()
	case len(h.GetParent()) > 0:
		k, err := parseKey("block.parent", h.GetParent())
		if err != nil {
			return nil, err
		}
		parent = prefixhash.KeyLink(k)
	}
	extra := prefixhash.ExtraKeys(h.GetExtraKeys())
	if err := ns.CheckExtra(extra); err != nil {
		return nil, invalid("block.extra_keys", "block %d: %v", index, err)
	}
	var chunk prefixhash.Key
	if len(h.GetChunkKey()) > 0 {
		var err error
		if chunk, err = parseKey("block.chunk_key", h.GetChunkKey()); err != nil {
			return nil, err
		}
	}
	if len(h.GetTokens()) != ns.BlockTokens {
		return nil, invalid("block.tokens", "block %d has %d tokens; blocks of this namespace hold block_tokens=%d",
			index, len(h.GetTokens()), ns.BlockTokens)
	}
	group, size, err := putGroup(ns, h, index)
	if err != nil {
		return nil, err
	}
	hl := block.NamespaceHeaderLen(ns)
	return &putBlock{index: index, parent: parent, extra: extra, chunk: chunk, group: group, tokens: h.GetTokens(), sum: h.GetPayloadChecksum(), hl: hl, size: hl + size}, nil
}

func (s *cacheService) Exists(ctx context.Context, req *kvmeshv1.ExistsRequest) (*kvmeshv1.ExistsResponse, error) {
	keys, err := s.n.parseKeys("keys", req.GetKeys())
	if err != nil {
		return nil, err
	}
	chunkKeys, err := s.n.parseChunkKeys(req.GetChunkKeys(), len(keys))
	if err != nil {
		return nil, err
	}
	present, err := s.n.cache.Exists(ctx, keys, chunkKeys)
	if err != nil {
		return nil, err
	}
	return &kvmeshv1.ExistsResponse{Present: present}, nil
}

func (s *cacheService) Publish(ctx context.Context, req *kvmeshv1.PublishRequest) (*kvmeshv1.PublishResponse, error) {
	keys, err := s.n.parseKeys("keys", req.GetKeys())
	if err != nil {
		return nil, err
	}
	if len(req.GetChunkKeys()) != len(keys) {
		return nil, invalid("chunk_keys", "%d chunk keys for %d keys; give one per key", len(req.GetChunkKeys()), len(keys))
	}
	chunkKeys, err := s.n.parseChunkKeys(req.GetChunkKeys(), len(keys))
	if err != nil {
		return nil, err
	}
	n, err := s.n.cache.Publish(ctx, keys, chunkKeys)
	if err != nil {
		return nil, err
	}
	return &kvmeshv1.PublishResponse{Queued: uint32(n)}, nil
}

// Stats answers with the node's counters; a tenant sees only its own
// namespaces.
func (s *cacheService) Stats(ctx context.Context, req *kvmeshv1.StatsRequest) (*kvmeshv1.StatsResponse, error) {
	page, err := parsePage(pageStats, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	st := s.n.cache.Stats()
	a := viewOf(ctx)
	resp := &kvmeshv1.StatsResponse{
		NodeId: s.n.opts.NodeID,
		Hits:   uint64(st.Hits), Misses: uint64(st.Misses),
		Evictions: uint64(st.Evictions), Demotions: uint64(st.Demotions), Promotions: uint64(st.Promotions),
		SecondChances: uint64(st.SecondChances), ReusedBlocks: uint64(st.ReusedBlocks), BranchingBlocks: uint64(st.BranchingBlocks),
	}
	for _, t := range st.Tiers {
		resp.Tiers = append(resp.Tiers, &kvmeshv1.TierStats{Name: t.Name, Blocks: uint64(t.Blocks), Bytes: uint64(t.Bytes), CapacityBytes: uint64(t.Capacity),
			EvictedCapacity: uint64(t.Evicted.Capacity), EvictedDemoted: uint64(t.Evicted.Demoted),
			EvictedRefused: uint64(t.Evicted.Refused), EvictedUnadmitted: uint64(t.Evicted.Unadmitted),
			EvictedExpired: uint64(t.Evicted.Expired), WrittenBytes: uint64(t.WrittenBytes)})
	}
	var all []*kvmeshv1.NamespaceStats
	for _, x := range st.Namespaces {
		s.n.names.keepSeen(x.Digest)
		if !a.Allows(x.Tenant) || (a.Scoped && x.Digest == 0) {
			continue
		}
		all = append(all, &kvmeshv1.NamespaceStats{Digest: x.Digest, Blocks: uint64(x.Blocks), Bytes: uint64(x.Bytes), Tokens: uint64(x.Tokens)})
	}
	slices.SortFunc(all, func(a, b *kvmeshv1.NamespaceStats) int { return cmpUint64(a.Digest, b.Digest) })
	resp.Namespaces, resp.NextPageToken = pageOf(pageStats, all, func(x *kvmeshv1.NamespaceStats) []byte { return digestCursor(x.Digest) }, page.cursor, page.size)
	for _, x := range resp.Namespaces {
		x.Model = s.n.names.model(x.Digest)
	}
	return resp, nil
}
