package node

import (
	"context"
	"errors"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/store"
)

// cacheService implements kvmesh.v1.CacheService over the node's Cache.
type cacheService struct {
	kvmeshv1.UnimplementedCacheServiceServer
	n *Node
}

func (s *cacheService) Lookup(ctx context.Context, req *kvmeshv1.LookupRequest) (*kvmeshv1.LookupResponse, error) {
	ns, err := s.n.namespace(req.GetNamespace())
	if err != nil {
		return nil, err
	}
	keys, err := s.n.promptKeys(ns, req.GetTokens())
	if err != nil {
		return nil, err
	}
	hit := s.n.cache.LongestPrefix(keys)
	blocks := make([]*kvmeshv1.CachedBlock, 0, hit)
	for _, k := range keys[:hit] {
		info, ok := s.n.cache.Info(k)
		if !ok {
			break // evicted since LongestPrefix: the prefix ends here
		}
		blocks = append(blocks, &kvmeshv1.CachedBlock{Key: keyBytes(k), NodeId: s.n.opts.NodeID, Tier: info.Tier})
	}
	cached := len(blocks) * ns.BlockTokens
	s.n.metrics.promptTokens.Add(float64(len(req.GetTokens())))
	s.n.metrics.cachedTokens.Add(float64(cached))
	return &kvmeshv1.LookupResponse{
		CachedBlocks: uint32(len(blocks)),
		CachedTokens: uint64(cached),
		PromptBlocks: uint32(len(keys)),
		PromptTokens: uint64(len(req.GetTokens())),
		Blocks:       blocks,
	}, nil
}

func (s *cacheService) BatchGet(req *kvmeshv1.BatchGetRequest, stream kvmeshv1.CacheService_BatchGetServer) error {
	ns, err := s.n.namespace(req.GetNamespace())
	if err != nil {
		return err
	}
	var keys []prefixhash.Key
	switch {
	case len(req.GetKeys()) > 0 && len(req.GetTokens()) > 0:
		return invalid("keys", "set keys or tokens, not both")
	case len(req.GetKeys()) > 0:
		keys, err = s.n.parseKeys("keys", req.GetKeys())
	default:
		keys, err = s.n.promptKeys(ns, req.GetTokens())
	}
	if err != nil {
		return err
	}
	ctx := stream.Context()
	var frame kvmeshv1.BatchGetResponse
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		found, err := s.sendBlock(ctx, stream, &frame, ns, uint32(i), k)
		if err != nil {
			return err
		}
		if !found && req.GetPrefix() {
			return nil
		}
	}
	return nil
}

// sendBlock streams block key as request index i: one miss frame, or the
// block in chunks of at most ChunkBytes payload bytes. The block stays
// pinned until its last frame is sent (Send copies the message).
func (s *cacheService) sendBlock(ctx context.Context, stream kvmeshv1.CacheService_BatchGetServer,
	frame *kvmeshv1.BatchGetResponse, ns prefixhash.Namespace, i uint32, key prefixhash.Key) (bool, error) {
	miss := func() (bool, error) {
		*frame = kvmeshv1.BatchGetResponse{Index: i, Key: key[:], Last: true}
		return false, stream.Send(frame)
	}
	ref, err := s.n.cache.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return miss()
	}
	if err != nil {
		return false, err
	}
	defer ref.Release()
	b, err := store.Decode(ref.Bytes(), 0)
	if err == nil {
		err = b.CheckNamespace(ns)
	}
	if err == nil && b.Key != key {
		err = errors.New("block key differs from the key asked for")
	}
	if err != nil {
		// A block another namespace produced, or bytes that fail
		// verification, are never served: the caller recomputes.
		s.n.metrics.dropped.Inc()
		s.n.log.Warn("block refused", "key", key.String(), "err", err)
		return miss()
	}
	chunk := s.n.opts.ChunkBytes
	payload := b.Payload
	*frame = kvmeshv1.BatchGetResponse{
		Index: i, Key: key[:], Found: true, Parent: b.Parent[:], Tokens: b.Tokens,
		PayloadLen: uint64(len(payload)), PayloadChecksum: b.Checksum,
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
	parent prefixhash.Key
	tokens []uint32
	sum    uint64 // the client's payload checksum, 0 when not given
	buf    []byte // header room, then the payload as it arrives
	hl     int    // header length
	got    int    // payload bytes received
}

func (b *putBlock) payload() []byte { return b.buf[b.hl:] }

func (s *cacheService) BatchPut(stream kvmeshv1.CacheService_BatchPutServer) error {
	ctx := stream.Context()
	var (
		nsPB   *kvmeshv1.Namespace
		ns     prefixhash.Namespace
		prev   prefixhash.Key // the last block stored, or the root
		cur    *putBlock
		buf    []byte // reused for every block of the stream
		keys   [][]byte
		blocks int
	)
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			if cur != nil {
				return invalid("data", "stream ended inside block %d: %d of %d payload bytes", cur.index, cur.got, len(cur.payload()))
			}
			return stream.SendAndClose(&kvmeshv1.BatchPutResponse{Stored: uint32(len(keys)), Keys: keys})
		}
		if err != nil {
			return err
		}
		if pb := msg.GetNamespace(); pb != nil {
			if nsPB == nil {
				if ns, err = s.n.namespace(pb); err != nil {
					return err
				}
				nsPB, prev = pb, ns.Root()
			} else if !proto.Equal(pb, nsPB) {
				return invalid("namespace", "changed within the stream; send one stream per namespace")
			}
		}
		if nsPB == nil {
			return invalid("namespace", "required in the stream's first message")
		}
		if h := msg.GetBlock(); h != nil {
			if cur != nil {
				return invalid("block", "block %d started before block %d was complete (%d of %d payload bytes)",
					blocks, cur.index, cur.got, len(cur.payload()))
			}
			if cur, err = s.startBlock(ns, h, blocks, prev, &buf); err != nil {
				return err
			}
			blocks++
		}
		if data := msg.GetData(); len(data) > 0 {
			if cur == nil {
				return invalid("data", "payload bytes before a block header")
			}
			if cur.got+len(data) > len(cur.payload()) {
				return invalid("data", "block %d: more payload bytes than its payload_len of %d", cur.index, len(cur.payload()))
			}
			cur.got += copy(cur.payload()[cur.got:], data)
		}
		if cur != nil && cur.got == len(cur.payload()) {
			_, key, err := store.AppendHeader(cur.buf[:0], ns, cur.parent, cur.tokens, cur.payload())
			if err != nil {
				return invalid("block", "block %d: %v", cur.index, err)
			}
			if h, _ := store.DecodeHeader(cur.buf, 0); cur.sum != 0 && h.Checksum != cur.sum {
				return invalid("block.payload_checksum", "block %d: payload checksum %016x, received bytes hash to %016x",
					cur.index, cur.sum, h.Checksum)
			}
			if err := s.n.cache.Put(ctx, cur.buf); err != nil {
				return err
			}
			s.n.metrics.blocks.WithLabelValues("put").Inc()
			s.n.metrics.bytes.WithLabelValues("put").Add(float64(cur.got))
			keys = append(keys, keyBytes(key))
			prev, cur = key, nil
		}
	}
}

// startBlock checks a block header against the namespace and the limits
// and returns the block to fill, in *buf (grown as needed).
func (s *cacheService) startBlock(ns prefixhash.Namespace, h *kvmeshv1.BlockHeader, index int, prev prefixhash.Key, buf *[]byte) (*putBlock, error) {
	if err := s.n.blockLimit("block", index+1); err != nil {
		return nil, err
	}
	parent := prev
	if len(h.GetParent()) > 0 {
		var err error
		if parent, err = parseKey("block.parent", h.GetParent()); err != nil {
			return nil, err
		}
	}
	if len(h.GetTokens()) != ns.BlockTokens {
		return nil, invalid("block.tokens", "block %d has %d tokens; blocks of this namespace hold block_tokens=%d",
			index, len(h.GetTokens()), ns.BlockTokens)
	}
	if h.GetPayloadLen() != uint64(ns.BlockBytes()) {
		return nil, invalid("block.payload_len", "block %d: %d bytes; blocks of %s hold %d payload bytes",
			index, h.GetPayloadLen(), ns, ns.BlockBytes())
	}
	hl := store.HeaderLen(ns.BlockTokens)
	size := hl + ns.BlockBytes()
	if cap(*buf) < size {
		*buf = make([]byte, size)
	}
	return &putBlock{index: index, parent: parent, tokens: h.GetTokens(), sum: h.GetPayloadChecksum(), buf: (*buf)[:size], hl: hl}, nil
}

func (s *cacheService) Exists(_ context.Context, req *kvmeshv1.ExistsRequest) (*kvmeshv1.ExistsResponse, error) {
	keys, err := s.n.parseKeys("keys", req.GetKeys())
	if err != nil {
		return nil, err
	}
	present := make([]bool, len(keys))
	for i, k := range keys {
		present[i] = s.n.cache.Contains(k)
	}
	return &kvmeshv1.ExistsResponse{Present: present}, nil
}

func (s *cacheService) Stats(context.Context, *kvmeshv1.StatsRequest) (*kvmeshv1.StatsResponse, error) {
	st := s.n.cache.Stats()
	resp := &kvmeshv1.StatsResponse{
		NodeId: s.n.opts.NodeID,
		Hits:   uint64(st.Hits), Misses: uint64(st.Misses),
		Evictions: uint64(st.Evictions), Demotions: uint64(st.Demotions), Promotions: uint64(st.Promotions),
	}
	for _, t := range st.Tiers {
		resp.Tiers = append(resp.Tiers, &kvmeshv1.TierStats{Name: t.Name, Blocks: uint64(t.Blocks), Bytes: uint64(t.Bytes), CapacityBytes: uint64(t.Capacity)})
	}
	for _, x := range st.Namespaces {
		resp.Namespaces = append(resp.Namespaces, &kvmeshv1.NamespaceStats{Digest: x.Digest, Blocks: uint64(x.Blocks), Bytes: uint64(x.Bytes), Tokens: uint64(x.Tokens),
			Model: s.n.names.model(x.Digest)})
	}
	return resp, nil
}
