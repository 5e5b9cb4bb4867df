package kvmeshv1

import (
	"bytes"
	"slices"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestCodecRoundTrip: messages below and above gRPC's pooling threshold,
// and of every size class in turn (so that each reuses a dirty buffer of a
// larger message first), encode to the bytes gRPC's own codec writes and
// decode to what was encoded, also from a message cut into many buffers as
// the transport delivers it.
func TestCodecRoundTrip(t *testing.T) {
	grpcCodec := encoding.GetCodecV2("proto")
	var msgs []*LookupRequest
	for _, n := range []int{0, 1, 100, 8192, 4096, 8192, 64, 3000} { // keys
		chain := bytes.Repeat([]byte{byte(n), 0xa5}, 8*n)
		msgs = append(msgs, &LookupRequest{Namespace: &Namespace{Model: "m", BlockTokens: 16}, Chain: chain, PromptTokens: uint64(16 * n), Summary: n%2 == 0})
	}
	for i, m := range msgs {
		data, err := Codec.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := grpcCodec.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data.Materialize(), want.Materialize()) {
			t.Fatalf("message %d: Codec's bytes differ from gRPC's proto codec's", i)
		}
		want.Free()
		// As the transport hands it over: 16 KiB frames, one buffer each.
		raw := data.Materialize()
		data.Free()
		var frames mem.BufferSlice
		for len(raw) > 0 {
			n := min(len(raw), 16<<10)
			frames = append(frames, mem.SliceBuffer(bytes.Clone(raw[:n])))
			raw = raw[n:]
		}
		got := &LookupRequest{}
		if err := Codec.Unmarshal(frames, got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, m) {
			t.Fatalf("message %d: decoded %d chain bytes, want %d", i, len(got.GetChain()), len(m.GetChain()))
		}
	}
	if _, err := Codec.Marshal("not a message"); err == nil {
		t.Fatal("Marshal of a string succeeded")
	}
}

func TestClassPool(t *testing.T) {
	for _, n := range []int{1, 1 << minClass, 1<<minClass + 1, 100 << 10, 1 << maxClass, 1<<maxClass + 1} {
		b := buffers.Get(n)
		if len(*b) != n || cap(*b) < n {
			t.Fatalf("Get(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		if c := class(n); c < maxClass-minClass+1 && cap(*b) != 1<<(c+minClass) {
			t.Fatalf("Get(%d): cap %d, not its class's %d", n, cap(*b), 1<<(c+minClass))
		}
		buffers.Put(b)
	}
}

// TestCodecInvalidUTF8: a request whose string fields (top-level, and in a
// nested message) are not UTF-8 decodes with U+FFFD in place of the bad
// bytes, rather than failing (gRPC would answer that Internal); every other
// field decodes as sent, and bytes fields keep any bytes.
func TestCodecInvalidUTF8(t *testing.T) {
	good, err := proto.Marshal(&LookupRequest{Namespace: &Namespace{Model: "m", BlockTokens: 16}, Chain: []byte{0xff, 0xfe}, PromptTokens: 32})
	if err != nil {
		t.Fatal(err)
	}
	// Stats' page_token (field 2) and a namespace's model (field 1 of
	// field 1 of LookupRequest), not UTF-8.
	stats := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte("ab\xffcd"))
	stats = protowire.AppendVarint(protowire.AppendTag(stats, 1, protowire.VarintType), 7)
	ns := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("\xc3model"))
	lookup := protowire.AppendBytes(protowire.AppendTag(slices.Clone(good), 1, protowire.BytesType), ns)

	var s StatsRequest
	if err := Codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(stats)}, &s); err != nil {
		t.Fatalf("Stats with a page token that is not UTF-8: %v", err)
	}
	if s.GetPageToken() != "ab\uFFFDcd" || s.GetPageSize() != 7 {
		t.Errorf("decoded %q, page size %d", s.GetPageToken(), s.GetPageSize())
	}
	var l LookupRequest
	if err := Codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(lookup)}, &l); err != nil {
		t.Fatalf("Lookup with a model that is not UTF-8: %v", err)
	}
	if l.GetNamespace().GetModel() != "\uFFFDmodel" || !bytes.Equal(l.GetChain(), []byte{0xff, 0xfe}) || l.GetPromptTokens() != 32 {
		t.Errorf("decoded %+v", &l)
	}
	if err := Codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x05, 'a'})}, &l); err == nil {
		t.Error("a truncated message decoded")
	}
}
