package kvmeshv1

// This file is written by hand; gen.sh leaves it alone.

import (
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
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
	err := proto.Unmarshal(buf.ReadOnlyData(), m)
	if err != nil {
		// gRPC answers any error here with Internal, so a string field
		// that is not UTF-8 (a client's mangled page token, say) would be
		// the server's fault. Such strings are taken with U+FFFD in place
		// of the bad bytes instead, and the handler refuses what they say
		// with InvalidArgument naming the field.
		if b, changed := validUTF8(buf.ReadOnlyData(), m.ProtoReflect().Descriptor(), 0); changed {
			proto.Reset(m)
			if proto.Unmarshal(b, m) == nil {
				return nil
			}
		}
	}
	return err
}

// validUTF8 returns b, the wire encoding of a message of md, with every
// string field (of nested messages too) that is not valid UTF-8 made valid
// by U+FFFD in place of its bad bytes, and whether it changed anything.
// Encodings it cannot parse are returned as they are.
func validUTF8(b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, bool) {
	if depth > 100 {
		return b, false
	}
	var out []byte
	changed := false
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return b, false
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return b, false
		}
		field := rest[:n+m]
		rest = rest[n+m:]
		if fd := md.Fields().ByNumber(num); typ == protowire.BytesType && fd != nil {
			v, _ := protowire.ConsumeBytes(field[n:])
			var fixed []byte
			switch {
			case fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
				fixed = []byte(strings.ToValidUTF8(string(v), "\uFFFD"))
			case fd.Kind() == protoreflect.MessageKind:
				if nb, ch := validUTF8(v, fd.Message(), depth+1); ch {
					fixed = nb
				}
			}
			if fixed != nil {
				out = protowire.AppendBytes(protowire.AppendTag(out, num, typ), fixed)
				changed = true
				continue
			}
		}
		out = append(out, field...)
	}
	return out, changed
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
