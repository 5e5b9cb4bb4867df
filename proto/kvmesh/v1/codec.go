package kvmeshv1

// This file is written by hand; gen.sh leaves it alone.

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Codec is gRPC's proto codec (google.golang.org/grpc/encoding/proto, name
// "proto", the same bytes on the wire) with its own buffers for messages
// past gRPC's pooling threshold: power-of-two classes, handed out without
// being cleared, since every byte of one is written (encoded, or copied in
// from the frames that carried the message) before it is read. gRPC's codec
// always takes mem.DefaultBufferPool, whose classes jump from 32 KiB to
// 1 MiB and are cleared whole on reuse: a 128 KiB Lookup chain cost a 1 MiB
// clear to encode and another to read. Nodes and the Go client force it
// (grpc.ForceServerCodecV2, grpc.ForceCodecV2) on their own connections
// only; nothing global changes.
var Codec encoding.CodecV2 = codec{}

type codec struct{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("kvmeshv1: codec: marshal %T, not a proto.Message", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // Size just computed it
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := buffers.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		buffers.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, buffers)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("kvmeshv1: codec: unmarshal into %T, not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(buffers)
	defer buf.Free()
	// Unmarshal copies bytes fields: nothing of m aliases buf.
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// buffers is Codec's pool: classes 2^minClass..2^maxClass bytes, one
// sync.Pool each (so an idle pool empties over two GC cycles); larger
// buffers are allocated and dropped.
var buffers mem.BufferPool = &classPool{}

const (
	minClass = 10
	maxClass = 26 // 64 MiB, the largest message a node accepts by default
)

type classPool struct {
	pools [maxClass - minClass + 1]sync.Pool
}

// class returns the index of the smallest class that holds n bytes.
func class(n int) int {
	if n <= 1<<minClass {
		return 0
	}
	return bits.Len(uint(n-1)) - minClass
}

func (p *classPool) Get(n int) *[]byte {
	c := class(n)
	if c >= len(p.pools) {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.pools[c].Get().(*[]byte); ok {
		*b = (*b)[:n] // not cleared: see Codec
		return b
	}
	b := make([]byte, n, 1<<(c+minClass))
	return &b
}

func (p *classPool) Put(b *[]byte) {
	c := class(cap(*b))
	if c < len(p.pools) && cap(*b) == 1<<(c+minClass) {
		p.pools[c].Put(b)
	}
}
