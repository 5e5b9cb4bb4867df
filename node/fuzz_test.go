package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// putStream replays canned BatchPut messages to the handler.
type putStream struct {
	grpc.ServerStream
	msgs []*kvmeshv1.BatchPutRequest
	resp *kvmeshv1.BatchPutResponse
}

func (s *putStream) Context() context.Context { return context.Background() }

func (s *putStream) Recv() (*kvmeshv1.BatchPutRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (s *putStream) SendAndClose(r *kvmeshv1.BatchPutResponse) error {
	s.resp = r
	return nil
}

// FuzzBatchPut feeds the BatchPut handler arbitrary streams, as a broken or
// hostile client could send: it must never panic, never hand the cache a
// block that does not verify, and report as stored exactly what it stored.
func FuzzBatchPut(f *testing.F) {
	ns := client.NamespaceProto(testNS)
	tokens, payloads := prompt(1, 8)
	valid := []*kvmeshv1.BatchPutRequest{
		{Namespace: ns, Block: &kvmeshv1.BlockHeader{Tokens: tokens[:4], PayloadLen: uint64(len(payloads[0]))}, Data: payloads[0][:100]},
		{Data: payloads[0][100:]},
		{Block: &kvmeshv1.BlockHeader{Tokens: tokens[4:8], PayloadLen: uint64(len(payloads[1]))}, Data: payloads[1]},
	}
	var seed []byte
	for _, m := range valid {
		b, _ := proto.Marshal(m)
		seed = append(append(seed, byte(len(b)>>8), byte(len(b))), b...)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	opts := Options{Limits: LimitOptions{MaxBatchBlocks: 4}, Logger: slog.New(slog.DiscardHandler)}
	opts.EnsureDefaults()
	n := &Node{opts: opts, log: opts.Logger, metrics: newMetrics(newFakeCache(0), metricsOptions{}), putBudget: newBudget(opts.Limits.MaxInFlightBytes)}
	svc := &cacheService{n: n}
	f.Fuzz(func(t *testing.T, data []byte) {
		var msgs []*kvmeshv1.BatchPutRequest
		for len(data) >= 2 && len(msgs) < 16 {
			l := min(int(data[0])<<8|int(data[1]), len(data)-2)
			m := &kvmeshv1.BatchPutRequest{}
			if proto.Unmarshal(data[2:2+l], m) == nil {
				msgs = append(msgs, m)
			}
			data = data[2+l:]
		}
		cache := newFakeCache(1 << 20)
		n.cache = cache
		s := &putStream{msgs: msgs}
		err := svc.BatchPut(s)
		if used := n.putBudget.inUse(); used != 0 {
			t.Fatalf("the stream returned (%v) holding %d bytes of the budget", err, used)
		}
		if errors.Is(err, block.ErrCorrupt) {
			t.Fatalf("the handler passed the cache a corrupt block: %v", err)
		}
		if err != nil {
			return
		}
		unique := map[string]bool{}
		for _, k := range s.resp.GetKeys() {
			if !cache.Contains([16]byte(k)) {
				t.Fatalf("answered key %x as stored; the cache lacks it", k)
			}
			unique[string(k)] = true
		}
		if held := cache.Stats().Tiers[0].Blocks; int64(len(unique)) != held || int(s.resp.GetStored()) != len(s.resp.GetKeys()) {
			t.Fatalf("answered %d stored (%d keys, %d distinct), the cache holds %d", s.resp.GetStored(), len(s.resp.GetKeys()), len(unique), held)
		}
	})
}
