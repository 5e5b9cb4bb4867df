package client

import (
	"context"
	"io"
	"testing"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// frameNode answers BatchGet with canned frames.
type frameNode struct {
	kvmeshv1.CacheServiceClient
	frames []*kvmeshv1.BatchGetResponse
}

type frameStream struct {
	grpc.ClientStream
	frames []*kvmeshv1.BatchGetResponse
}

func (s *frameStream) Recv() (*kvmeshv1.BatchGetResponse, error) {
	if len(s.frames) == 0 {
		return nil, io.EOF
	}
	f := s.frames[0]
	s.frames = s.frames[1:]
	return f, nil
}

func (n *frameNode) BatchGet(context.Context, *kvmeshv1.BatchGetRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[kvmeshv1.BatchGetResponse], error) {
	return &frameStream{frames: n.frames}, nil
}

// FuzzGetFrames feeds the client's BatchGet reassembly arbitrary frames, as
// a broken or hostile node could send: it must never panic, and every block
// it delivers must be the one asked for, intact.
func FuzzGetFrames(f *testing.F) {
	keys := prefixhash.Keys(testNS, []uint32{1, 2, 3, 4, 5, 6, 7, 8})
	payload := make([]byte, testNS.BlockBytes())
	root := testNS.Root()
	valid := []*kvmeshv1.BatchGetResponse{
		{Index: 0, Key: keys[0][:], Found: true, Parent: root[:], Tokens: []uint32{1, 2, 3, 4},
			PayloadLen: uint64(len(payload)), PayloadChecksum: xxhash.Sum64(payload), Data: payload[:10]},
		{Index: 0, Offset: 10, Data: payload[10:], Last: true},
		{Index: 1, Key: keys[1][:], Last: true},
	}
	f.Add(encodeFrames(valid))
	f.Add(encodeFrames(valid[:1]))
	f.Add([]byte{3, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		var frames []*kvmeshv1.BatchGetResponse
		for len(data) > 0 && len(frames) < 32 {
			n := min(int(data[0]), len(data)-1)
			fr := &kvmeshv1.BatchGetResponse{}
			if proto.Unmarshal(data[1:1+n], fr) == nil {
				frames = append(frames, fr)
			}
			data = data[1+n:]
		}
		c, err := New(nil, Options{MaxBlockBytes: 1 << 16, Transport: TransportGRPC})
		if err != nil {
			t.Fatal(err)
		}
		c.cache = &frameNode{frames: frames}
		_ = c.bulk.get(context.Background(), testNS, block.Part{}, keys, nil, false, false, func(b Block) error {
			if b.Key != keys[b.Index] {
				t.Fatalf("delivered block %d with key %s, asked for %s", b.Index, b.Key, keys[b.Index])
			}
			if b.Found && (prefixhash.BlockKey(b.Parent, b.Tokens) != b.Key || len(b.Payload) == 0) {
				t.Fatalf("delivered block %d does not verify", b.Index)
			}
			return nil
		})
	})
}

func encodeFrames(frames []*kvmeshv1.BatchGetResponse) []byte {
	var out []byte
	for _, f := range frames {
		b, _ := proto.Marshal(f)
		if len(b) > 255 {
			b = b[:255]
		}
		out = append(append(out, byte(len(b))), b...)
	}
	return out
}
