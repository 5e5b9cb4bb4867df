package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// bulk moves block payloads: the gRPC streams (grpcBulk), or the node's
// data plane with the gRPC streams behind it (dataBulk, dataplane.go).
type bulk interface {
	// get reads keys and calls fn for each block in order, misses
	// included, stopping after the first miss when prefix is set. Every
	// key is answered (up to that miss) or an error is returned.
	// chunkKeys (nil: unknown) place the keys in the cluster. With fresh,
	// each payload is a new slice the caller keeps; without it, payload
	// and tokens are valid only during fn. part, when not zero, is the
	// part of every block to read (a rank's, rank.go): the payloads fn
	// gets are then that part's bytes.
	get(ctx context.Context, ns prefixhash.Namespace, part block.Part, keys, chunkKeys []prefixhash.Key, prefix, fresh bool, fn func(Block) error) error
	// put stores blocks and returns their keys in order.
	put(ctx context.Context, ns prefixhash.Namespace, blocks []putItem) ([]prefixhash.Key, error)
}

// putItem is one block to store, or one part of it. payload is read during
// put only.
type putItem struct {
	// part is the part of the block payload holds (Prompt.Rank); zero: the
	// whole block. Parts travel over the data plane only: the gRPC API
	// carries whole blocks.
	part    block.Part
	parent  prefixhash.Link // what its key chains from (KeyLink of the parent key but under the vllm scheme)
	extra   prefixhash.ExtraKeys
	key     prefixhash.Key // the key the client expects
	chunk   prefixhash.Key // its chunk key; zero when unknown
	tokens  []uint32
	payload []byte
	// group is the group whose record this is, in a namespace with groups;
	// -1 otherwise.
	group int
}

// errStream is wrapped by errors about a malformed answer from the node.
var errStream = errors.New("client: malformed stream from node")

// grpcBulk moves payloads over CacheService's BatchGet and BatchPut streams.
type grpcBulk struct{ c *Client }

func (g *grpcBulk) get(ctx context.Context, ns prefixhash.Namespace, part block.Part, keys, chunkKeys []prefixhash.Key, prefix, fresh bool, fn func(Block) error) error {
	req := &kvmeshv1.BatchGetRequest{Namespace: NamespaceProto(ns), Keys: make([][]byte, len(keys)), Prefix: prefix}
	for i := range keys {
		req.Keys[i] = keys[i][:]
	}
	if chunkKeys != nil {
		req.ChunkKeys = make([][]byte, len(chunkKeys))
		for i := range chunkKeys {
			req.ChunkKeys[i] = chunkKeys[i][:]
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream if we stop reading early
	stream, err := g.c.cache.BatchGet(ctx, req)
	if err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errStream, fmt.Sprintf(format, args...))
	}
	layout := block.LayoutOf(ns)
	var (
		cur     Block
		sum     uint64
		want    int // payload bytes of the current block
		buf     []byte
		pbuf    []byte // the part read, when part is set
		next    int    // the index the next block must have
		inBlock bool   // a hit's frames are arriving
		stopped bool   // prefix: a miss ended the stream
	)
	for {
		f, err := stream.Recv()
		if err == io.EOF {
			if inBlock || !stopped && next < len(keys) {
				return bad("stream ended after %d of %d blocks", next, len(keys))
			}
			return nil
		}
		if err != nil {
			return err
		}
		if !inBlock {
			// The first frame of the next block.
			if stopped || int(f.GetIndex()) != next || next >= len(keys) {
				return bad("frame for block %d, expected block %d", f.GetIndex(), next)
			}
			if string(f.GetKey()) != string(keys[next][:]) {
				return bad("block %d: key %x, asked for %s", next, f.GetKey(), keys[next])
			}
			cur = Block{Index: next, Key: keys[next], Found: f.GetFound()}
			if !cur.Found {
				next++
				stopped = prefix
				if err := fn(cur); err != nil {
					return err
				}
				continue
			}
			if copy(cur.Parent[:], f.GetParent()) != prefixhash.KeySize || len(f.GetParent()) != prefixhash.KeySize {
				return bad("block %d: parent of %d bytes", next, len(f.GetParent()))
			}
			cur.Tokens, cur.Extra = f.GetTokens(), f.GetExtraKeys()
			link := prefixhash.KeyLink(cur.Parent)
			if ns.Scheme == prefixhash.SchemeVLLM {
				if len(f.GetParentLink()) != prefixhash.LinkSize {
					return bad("block %d: parent link of %d bytes", next, len(f.GetParentLink()))
				}
				link = prefixhash.Link(f.GetParentLink())
			}
			lay, group, err := recordLayout(ns, f.GetGroup())
			if err != nil {
				return bad("block %d: %v", next, err)
			}
			chain := prefixhash.BlockLink(ns.Scheme, link, cur.Tokens, cur.Extra).Key()
			if group >= 0 {
				chain, cur.Group = prefixhash.GroupKey(chain, group), group
			}
			if link.Key() != cur.Parent || chain != cur.Key {
				return bad("block %d: key is not H(parent ‖ tokens ‖ extra keys)", next)
			}
			if n := f.GetPayloadLen(); n == 0 || n > uint64(g.c.opts.MaxBlockBytes) {
				return bad("block %d: payload of %d bytes (limit %d)", next, n, g.c.opts.MaxBlockBytes)
			}
			if n, whole := f.GetPayloadLen(), lay.PayloadLen(len(cur.Tokens)); n != uint64(whole) {
				// A part of the block, or another layout: not the block.
				return bad("block %d: payload of %d bytes, a block of %s holds %d", next, n, ns, whole)
			}
			want = int(f.GetPayloadLen())
			if fresh || cap(buf) < want {
				buf = make([]byte, want)
			}
			cur.Payload = buf[:0]
			sum = f.GetPayloadChecksum()
			inBlock = true
		} else if int(f.GetIndex()) != next {
			return bad("frame for block %d inside block %d", f.GetIndex(), next)
		}
		if f.GetOffset() != uint64(len(cur.Payload)) || len(cur.Payload)+len(f.GetData()) > want {
			return bad("block %d: %d bytes at offset %d, have %d of %d", next, len(f.GetData()), f.GetOffset(), len(cur.Payload), want)
		}
		cur.Payload = append(cur.Payload, f.GetData()...)
		if !f.GetLast() {
			continue
		}
		if len(cur.Payload) != want {
			return bad("block %d: %d payload bytes, %d announced", next, len(cur.Payload), want)
		}
		if got := xxhash.Sum64(cur.Payload); got != sum {
			return bad("block %d: payload checksum %016x, announced %016x", next, got, sum)
		}
		inBlock = false
		next++
		if part != (block.Part{}) {
			// BatchGet reads whole blocks: the part is cut out here.
			if fresh {
				pbuf = nil
			}
			pbuf = layout.ExtractPart(pbuf[:0], cur.Payload, len(cur.Tokens), part)
			cur.Payload = pbuf
		}
		if err := fn(cur); err != nil {
			return err
		}
	}
}

func (g *grpcBulk) put(ctx context.Context, ns prefixhash.Namespace, blocks []putItem) ([]prefixhash.Key, error) {
	for i, b := range blocks {
		if b.part != (block.Part{}) {
			return nil, fmt.Errorf("%w: block %s (%s)", errPartsNeedDataPlane, blocks[i].key, b.part)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := g.c.cache.BatchPut(ctx)
	if err != nil {
		return nil, err
	}
	chunk := g.c.opts.ChunkBytes
	msg := &kvmeshv1.BatchPutRequest{Namespace: NamespaceProto(ns)}
	for _, b := range blocks {
		parent := b.parent.Key()
		msg.Block = &kvmeshv1.BlockHeader{
			Parent: parent[:], Tokens: b.tokens, ExtraKeys: b.extra,
			PayloadLen: uint64(len(b.payload)), PayloadChecksum: xxhash.Sum64(b.payload),
		}
		if ns.Scheme == prefixhash.SchemeVLLM {
			msg.Block.ParentLink = b.parent[:]
		}
		if b.group >= 0 {
			msg.Block.Group = uint32(b.group + 1)
		}
		if !b.chunk.IsZero() {
			msg.Block.ChunkKey = b.chunk[:]
		}
		for off := 0; off < len(b.payload); off += chunk {
			msg.Data = b.payload[off:min(off+chunk, len(b.payload))]
			if err := stream.Send(msg); err != nil {
				// The node ended the stream; CloseAndRecv has its status.
				_, err := stream.CloseAndRecv()
				return nil, err
			}
			msg.Namespace, msg.Block = nil, nil
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	if len(resp.GetKeys()) != len(blocks) {
		return nil, fmt.Errorf("%w: %d keys for %d blocks stored", errStream, len(resp.GetKeys()), len(blocks))
	}
	keys := make([]prefixhash.Key, len(blocks))
	for i, k := range resp.GetKeys() {
		copy(keys[i][:], k)
		if want := blocks[i].key; keys[i] != want {
			return nil, fmt.Errorf("%w: block %d stored as %s, expected %s", errStream, i, keys[i], want)
		}
	}
	return keys, nil
}
