package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/store"
)

// objectStore is what ObjectService needs of the node's Cache beside Put
// and Read: removing and retaining by key, across the cluster or here only
// (what a peer asks). clusterCache implements it.
type objectStore interface {
	// Remove drops keys from every node the cache reaches (here only
	// with local), whatever their retention, and reports per key whether
	// any held it.
	Remove(ctx context.Context, keys []prefixhash.Key, local bool) ([]bool, error)
	// Retain sets the retention of keys on the nodes that should hold
	// them (chunkKeys as in Cache.Read), or here only with local, and
	// reports per key whether any applied it. A retention over a limit
	// wraps ErrQuota or store.ErrRetentionTTL.
	Retain(ctx context.Context, keys, chunkKeys []prefixhash.Key, r block.Retention, local bool) ([]bool, error)
}

// objectService implements kvmesh.v1.ObjectService: object records in and
// out (the client encodes and verifies them; the node verifies what it
// stores), removal by key and retention.
type objectService struct {
	kvmeshv1.UnimplementedObjectServiceServer
	n *Node
}

// objects returns the node's cache as an objectStore.
func (n *Node) objects() (objectStore, error) {
	os, ok := n.cache.(objectStore)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this node's cache does not hold objects")
	}
	return os, nil
}

// Put stores the records of the stream, one result each.
func (s *objectService) Put(stream kvmeshv1.ObjectService_PutServer) error {
	ctx := stream.Context()
	tenant := auth.PrincipalFrom(ctx).Tenant
	var (
		results []*kvmeshv1.ObjectResult
		buf     []byte // the record being received, charged to putBudget
		got     int
	)
	release := func() {
		if buf != nil {
			putBlockBuf(buf)
			s.n.putBudget.release(tenant, int64(len(buf)))
			buf = nil
		}
	}
	defer release()
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			if buf != nil {
				return invalid("data", "stream ended inside record %d: %d of %d bytes", len(results), got, len(buf))
			}
			return stream.SendAndClose(&kvmeshv1.ObjectServicePutResponse{Results: results})
		}
		if err != nil {
			return err
		}
		if int(msg.GetIndex()) != len(results) {
			return invalid("index", "chunk of record %d, expected record %d", msg.GetIndex(), len(results))
		}
		if buf == nil {
			n := msg.GetRecordLen()
			if n < block.FixedHeaderLen || n > uint64(s.n.opts.Limits.MaxBlockBytes) {
				return invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_BLOCK_TOO_LARGE, limitMeta(s.n.opts.Limits.MaxBlockBytes), "record_len",
					"record %d: %d bytes is outside %d..%d (max_block_bytes)", len(results), n, block.FixedHeaderLen, s.n.opts.Limits.MaxBlockBytes)
			}
			if len(results) >= s.n.opts.Limits.MaxBatchBlocks {
				return invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_TOO_MANY_BLOCKS, limitMeta(s.n.opts.Limits.MaxBatchBlocks), "index",
					"more than %d records in one stream", s.n.opts.Limits.MaxBatchBlocks)
			}
			if err := s.n.putBudget.acquire(ctx, tenant, int64(n), fmt.Sprintf("record %d of the Put stream", len(results))); err != nil {
				return err
			}
			buf, got = getBlockBuf(int(n)), 0
		}
		if msg.GetOffset() != uint64(got) || got+len(msg.GetData()) > len(buf) {
			return invalid("data", "record %d: %d bytes at offset %d, %d of %d received", len(results), len(msg.GetData()), msg.GetOffset(), got, len(buf))
		}
		got += copy(buf[got:], msg.GetData())
		if got < len(buf) {
			continue
		}
		results = append(results, s.putRecord(ctx, buf))
		release()
	}
}

// putRecord stores one verified object record, placed by its own key.
func (s *objectService) putRecord(ctx context.Context, rec []byte) *kvmeshv1.ObjectResult {
	h, err := block.DecodeHeader(rec, 0)
	if err == nil && h.Kind != block.KindObject {
		err = fmt.Errorf("%w: a block, not an object record (blocks go through CacheService)", block.ErrCorrupt)
	}
	if err != nil {
		return &kvmeshv1.ObjectResult{Status: kvmeshv1.ItemStatus_ITEM_STATUS_INVALID, Message: err.Error()}
	}
	res := &kvmeshv1.ObjectResult{Key: keyBytes(h.Key), Status: kvmeshv1.ItemStatus_ITEM_STATUS_OK}
	if err := s.n.cache.Put(ctx, rec, h.Key); err != nil {
		res.Status, res.Message = itemStatus(err), err.Error()
		return res
	}
	s.n.metrics.blocks.WithLabelValues("put").Inc()
	s.n.metrics.bytes.WithLabelValues("put").Add(float64(len(rec)))
	return res
}

// itemStatus is the per-item form of statusError.
func itemStatus(err error) kvmeshv1.ItemStatus {
	switch code := status.Code(statusError(err)); {
	case errors.Is(err, store.ErrTenant) || code == codes.PermissionDenied:
		return kvmeshv1.ItemStatus_ITEM_STATUS_DENIED
	case code == codes.ResourceExhausted:
		return kvmeshv1.ItemStatus_ITEM_STATUS_NO_ROOM
	}
	return kvmeshv1.ItemStatus_ITEM_STATUS_INVALID
}

// Get streams records by key, from here or the keys' owners.
func (s *objectService) Get(req *kvmeshv1.ObjectServiceGetRequest, stream kvmeshv1.ObjectService_GetServer) error {
	keys, err := s.n.parseKeys("keys", req.GetKeys())
	if err != nil {
		return err
	}
	ctx := stream.Context()
	remoteBy := time.Now().Add(s.n.opts.Cluster.GetTimeout)
	chunk := s.n.opts.Limits.ChunkBytes
	var frame kvmeshv1.ObjectServiceGetResponse
	// A window at a time, so that a batch of large records does not pin
	// them all at once.
	for lo := 0; lo < len(keys); {
		hi := min(len(keys), lo+16)
		recs, release, err := s.n.cache.Read(ctx, keys[lo:hi], keys[lo:hi], remoteBy)
		if err != nil {
			return err
		}
		for j, rec := range recs {
			i := uint32(lo + j)
			if rec != nil {
				if h, err := block.DecodeHeader(rec, 0); err != nil || h.Kind != block.KindObject || h.Key != keys[lo+j] {
					rec = nil // not an object's record under its key: a miss
				}
			}
			if rec == nil {
				frame = kvmeshv1.ObjectServiceGetResponse{Index: i, Last: true}
				if err := stream.Send(&frame); err != nil {
					release()
					return err
				}
				continue
			}
			for off := 0; ; {
				end := min(off+chunk, len(rec))
				frame = kvmeshv1.ObjectServiceGetResponse{Index: i, Found: true, RecordLen: uint64(len(rec)),
					Offset: uint64(off), Data: rec[off:end], Last: end == len(rec)}
				if err := stream.Send(&frame); err != nil {
					release()
					return err
				}
				if frame.Last {
					break
				}
				off = end
			}
			s.n.metrics.blocks.WithLabelValues("get").Inc()
			s.n.metrics.bytes.WithLabelValues("get").Add(float64(len(rec)))
		}
		release()
		lo = hi
	}
	return nil
}

// Remove drops keys from every member.
func (s *objectService) Remove(ctx context.Context, req *kvmeshv1.ObjectServiceRemoveRequest) (*kvmeshv1.ObjectServiceRemoveResponse, error) {
	os, err := s.n.objects()
	if err != nil {
		return nil, err
	}
	keys, err := s.n.parseKeys("keys", req.GetKeys())
	if err != nil {
		return nil, err
	}
	found, err := os.Remove(ctx, keys, false)
	if err != nil {
		return nil, statusError(err)
	}
	return &kvmeshv1.ObjectServiceRemoveResponse{Found: found}, nil
}

// Retain sets the retention of keys on their owners.
func (s *objectService) Retain(ctx context.Context, req *kvmeshv1.ObjectServiceRetainRequest) (*kvmeshv1.ObjectServiceRetainResponse, error) {
	os, err := s.n.objects()
	if err != nil {
		return nil, err
	}
	keys, err := s.n.parseKeys("keys", req.GetKeys())
	if err != nil {
		return nil, err
	}
	chunkKeys, err := s.n.parseChunkKeys(req.GetChunkKeys(), len(keys))
	if err != nil {
		return nil, err
	}
	r, err := retentionFrom(req.GetRetention())
	if err != nil {
		return nil, err
	}
	applied, err := os.Retain(ctx, keys, chunkKeys, r, false)
	if err != nil {
		return nil, statusError(err)
	}
	return &kvmeshv1.ObjectServiceRetainResponse{Applied: applied}, nil
}

// retentionFrom checks a Retention message.
func retentionFrom(pb *kvmeshv1.Retention) (block.Retention, error) {
	var r block.Retention
	switch pb.GetPin() {
	case kvmeshv1.Pin_PIN_UNSPECIFIED:
	case kvmeshv1.Pin_PIN_SOFT:
		r.Pin = block.PinSoft
	case kvmeshv1.Pin_PIN_HARD:
		r.Pin = block.PinHard
	default:
		return r, invalid("retention.pin", "unknown pin %d", pb.GetPin())
	}
	if ms := pb.GetTtlMs(); ms > uint64(block.MaxObjectTTL/time.Millisecond) {
		return r, invalid("retention.ttl_ms", "%d ms is over %v", ms, block.MaxObjectTTL)
	}
	r.TTL = time.Duration(pb.GetTtlMs()) * time.Millisecond
	return r, nil
}

// retentionProto is retentionFrom's inverse.
func retentionProto(r block.Retention) *kvmeshv1.Retention {
	return &kvmeshv1.Retention{Pin: kvmeshv1.Pin(r.Pin), TtlMs: uint64(r.TTL / time.Millisecond)}
}
