package kvevents_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func ptr[T any](v T) *T { return &v }

// TestEncodeDecode round-trips batches, and checks the bytes of one against
// what msgspec's array_like, omit_defaults encoding makes of it.
func TestEncodeDecode(t *testing.T) {
	b := kvevents.Batch{TS: 1.5, Events: []kvevents.Event{
		{Tag: kvevents.TagBlockStored, BlockHashes: [][]byte{{1, 2}}, TokenIDs: []uint32{7, 1 << 31}, BlockSize: 2, Medium: "CPU"},
		{Tag: kvevents.TagBlockStored, BlockHashes: [][]byte{{3}}, ParentBlockHash: []byte{1, 2}, TokenIDs: []uint32{}, BlockSize: 16,
			Medium: "GPU", LoRAName: ptr("a"), ExtraKeys: [][]any{{[]byte("mm")}}, GroupIdx: ptr(1), KVCacheSpecKind: "sliding_window",
			KVCacheSpecSlidingWindow: ptr(128)},
		{Tag: kvevents.TagBlockRemoved, BlockHashes: [][]byte{{1, 2}, {3}}, Medium: "DISK"},
		{Tag: kvevents.TagBlockRemoved, BlockHashes: [][]byte{{4}}, GroupIdx: ptr(0)},
		{Tag: kvevents.TagAllBlocksCleared},
	}}
	enc, err := kvevents.Encode(nil, &b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := kvevents.Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, b) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, b)
	}
	// [1.5, [["AllBlocksCleared"]], nil]: fixarray(3), float64 1.5, fixarray(1), fixarray(1), fixstr(16), nil
	// (the rank always there, as vLLM sends it and llm-d's decoder wants it).
	one, _ := kvevents.Encode(nil, &kvevents.Batch{TS: 1.5, Events: []kvevents.Event{{Tag: kvevents.TagAllBlocksCleared}}})
	want := append(append([]byte{0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xb0}, "AllBlocksCleared"...), 0xc0)
	if !bytes.Equal(one, want) {
		t.Fatalf("encoding % x, want % x", one, want)
	}
	// An int hash (a vLLM that publishes int hashes) decodes as 8 bytes.
	intHash := []byte{0x92, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xac}
	intHash = append(append(intHash, "BlockRemoved"...), 0x91, 0x2a)
	if got, err := kvevents.Decode(intHash); err != nil || !bytes.Equal(got.Events[0].BlockHashes[0], []byte{0, 0, 0, 0, 0, 0, 0, 42}) {
		t.Fatalf("int hash: %+v %v", got, err)
	}
	for _, bad := range [][]byte{nil, {0x90}, {0x92, 0xc0, 0x90}, append([]byte{0x92, 0x01, 0x91, 0x91, 0xa3}, "Foo"...)} {
		if _, err := kvevents.Decode(bad); err == nil {
			t.Errorf("Decode(% x) accepted", bad)
		}
	}
}

// TestDecodeClaimedLengths: a header that claims billions of elements, or
// nesting a million deep, is refused before anything is built (the msgpack
// library allocates what a length claims; the fuzzer found a 11-byte
// payload that took the process's memory).
func TestDecodeClaimedLengths(t *testing.T) {
	deep := bytes.Repeat([]byte{0x91}, 1<<20)
	for name, bad := range map[string][]byte{
		"map32":   []byte("\xdf3\x9f\xb1\x9e\x83k5\x92\x950"), // testdata/fuzz/FuzzDecode/33f73b6a39213a62
		"array32": {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0},
		"inner":   {0x92, 0x01, 0xdd, 0x10, 0, 0, 0, 0x90},
		"deep":    append(deep, 0xc0),
	} {
		if _, err := kvevents.Decode(bad); !errors.Is(err, kvevents.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

// FuzzDecode: arbitrary bytes never panic the decoder, and what it accepts
// re-encodes to something it decodes the same.
func FuzzDecode(f *testing.F) {
	b := kvevents.Batch{TS: 2, Events: []kvevents.Event{
		{Tag: kvevents.TagBlockStored, BlockHashes: [][]byte{{1}}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "CPU", GroupIdx: ptr(2)},
		{Tag: kvevents.TagBlockRemoved, BlockHashes: [][]byte{{1}}, Medium: "CPU"}, {Tag: kvevents.TagAllBlocksCleared}}}
	enc, _ := kvevents.Encode(nil, &b)
	f.Add(enc)
	f.Add([]byte{0x92, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x90})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := kvevents.Decode(data)
		if err != nil {
			return
		}
		re, err := kvevents.Encode(nil, &got)
		if err != nil {
			return // e.g. extra keys of types Encode does not write
		}
		again, err := kvevents.Decode(re)
		if err != nil || len(again.Events) != len(got.Events) {
			t.Fatalf("re-encoded batch: %v", err)
		}
	})
}

// fakeNames resolves the namespaces of the tests.
type fakeNames map[uint64]prefixhash.Namespace

func (n fakeNames) Namespace(d uint64) (prefixhash.Namespace, bool) { ns, ok := n[d]; return ns, ok }

// received collects what a subscriber gets.
type received struct {
	mu   sync.Mutex
	msgs []kvevents.Message
}

func (r *received) add(m kvevents.Message) bool {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
	return true
}

func (r *received) events(topic string) []kvevents.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []kvevents.Event
	for _, m := range r.msgs {
		if topic == "" || m.Topic == topic {
			out = append(out, m.Batch.Events...)
		}
	}
	return out
}

// TestPublisher: blocks stored and removed through the store's calls are
// published on the namespace's topic, with vLLM's hashes under the vllm
// scheme, in batches whose sequence numbers a replay answers.
func TestPublisher(t *testing.T) {
	kv := prefixhash.Namespace{Model: "m/kvmesh", DType: prefixhash.Float16, BlockTokens: 4, Layers: 1, KVHeads: 1, HeadDim: 2}
	vl := kv
	vl.Model, vl.Scheme, vl.HashSeed, vl.LoRA = "m/vllm", prefixhash.SchemeVLLM, "0", "adapter"
	p, err := kvevents.New(kvevents.Options{Addr: "tcp://127.0.0.1:0", ReplayAddr: "tcp://127.0.0.1:0", NodeID: "n1",
		Names: fakeNames{kv.Digest(): kv, vl.Digest(): vl}, BatchInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r received
	done := make(chan error, 1)
	go func() { done <- kvevents.Subscribe(ctx, p.Addr(), "kv@n1@", r.add) }()
	// A PUB drops what is sent before the subscription lands: publish
	// until the subscriber has something.
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	kvRec := encode(t, kv, tokens)
	testkit.WaitFor(t, "the subscriber to receive a batch", func() bool {
		p.BlockStored("CPU", kvRec[0])
		return len(r.events("")) > 0
	})
	vlRec := encode(t, vl, tokens)
	p.BlockStored("CPU", vlRec[0])
	p.BlockStored("CPU", vlRec[1])
	p.BlockRemoved("CPU", hdr(t, vlRec[1]).Key, vl.Digest())
	p.BlockStored("DISK", vlRec[1])
	p.BlockStored("GPU", kvRec[1])
	p.AllBlocksCleared(kv.Digest())
	testkit.WaitFor(t, "the events", func() bool {
		kvs := r.events("kv@n1@m/kvmesh")
		return len(r.events("kv@n1@m/vllm")) >= 4 && len(kvs) > 0 && kvs[len(kvs)-1].Tag == kvevents.TagAllBlocksCleared
	})
	kvs := r.events("kv@n1@m/kvmesh")
	evs := append(r.events("kv@n1@m/vllm"), kvs[len(kvs)-2:]...)
	links, _ := prefixhash.LinksExtra(vl, tokens, nil)
	k0, k1 := hdr(t, kvRec[0]).Key, hdr(t, kvRec[1]).Key
	want := []kvevents.Event{
		{Tag: kvevents.TagBlockStored, BlockHashes: [][]byte{links[0][:]}, TokenIDs: tokens[:4], BlockSize: 4, Medium: "CPU", LoRAName: ptr("adapter"),
			ExtraKeys: [][]any{{"adapter"}}},
		{Tag: kvevents.TagBlockStored, BlockHashes: [][]byte{links[1][:]}, ParentBlockHash: links[0][:], TokenIDs: tokens[4:], BlockSize: 4,
			Medium: "CPU", LoRAName: ptr("adapter"), ExtraKeys: [][]any{{"adapter"}}},
		{Tag: kvevents.TagBlockRemoved, BlockHashes: [][]byte{links[1][:]}, Medium: "CPU"},
		{Tag: kvevents.TagBlockStored, BlockHashes: [][]byte{links[1][:]}, ParentBlockHash: links[0][:], TokenIDs: tokens[4:], BlockSize: 4,
			Medium: "DISK", LoRAName: ptr("adapter"), ExtraKeys: [][]any{{"adapter"}}},
		{Tag: kvevents.TagBlockStored, BlockHashes: [][]byte{k1[:]}, ParentBlockHash: k0[:],
			TokenIDs: tokens[4:], BlockSize: 4, Medium: "GPU"},
		{Tag: kvevents.TagAllBlocksCleared},
	}
	if !reflect.DeepEqual(evs[:6], want) {
		t.Fatalf("events:\n got %+v\nwant %+v", evs[:6], want)
	}
	r.mu.Lock()
	msgs := append([]kvevents.Message(nil), r.msgs...)
	r.mu.Unlock()
	topics := map[string]bool{}
	for k, m := range msgs {
		topics[m.Topic] = true
		if m.Err != nil || k > 0 && m.Seq != msgs[k-1].Seq+1 {
			t.Fatalf("message %d: seq %d after %d, %v", k, m.Seq, msgs[k-1].Seq, m.Err)
		}
	}
	if !topics["kv@n1@m/vllm"] || !topics["kv@n1@m/kvmesh"] {
		t.Fatalf("topics %v", topics)
	}
	// A replay from the first of them answers them all again, in order.
	var replayed []uint64
	if err := kvevents.Replay(ctx, p.ReplayAddr(), msgs[0].Seq, func(m kvevents.Message) bool {
		replayed = append(replayed, m.Seq)
		return m.Err == nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(replayed) < len(msgs) || replayed[0] != msgs[0].Seq {
		t.Fatalf("replayed %v, published %d from %d", replayed, len(msgs), msgs[0].Seq)
	}
	cancel()
	<-done
}

// TestPublisherNeverBlocks: with the queue full, the store's calls return
// at once and the events are counted as dropped.
func TestPublisherNeverBlocks(t *testing.T) {
	kv := prefixhash.Namespace{Model: "m", DType: prefixhash.Float16, BlockTokens: 4, Layers: 1, KVHeads: 1, HeadDim: 2}
	p, err := kvevents.New(kvevents.Options{Addr: "tcp://127.0.0.1:0", QueueEvents: 4, BatchInterval: time.Hour, BatchEvents: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec := encode(t, kv, []uint32{1, 2, 3, 4})[0]
	for range 10000 {
		p.BlockStored("CPU", rec)
	}
	if s := p.Stats(); s.Dropped == 0 {
		t.Fatalf("nothing dropped: %+v", s)
	}
}

func encode(t *testing.T, ns prefixhash.Namespace, tokens []uint32) [][]byte {
	t.Helper()
	return encodeExtra(t, ns, tokens, nil)
}

// encodeExtra is encode for blocks with extra keys (extra[i]: block i's).
func encodeExtra(t *testing.T, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys) [][]byte {
	t.Helper()
	links, err := prefixhash.LinksExtra(ns, tokens, extra)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	parent := ns.RootLink()
	for i := range links {
		var e prefixhash.ExtraKeys
		if i < len(extra) {
			e = extra[i]
		}
		b, _, err := block.AppendHeaderExt(nil, 0, ns, parent, tokens[i*ns.BlockTokens:(i+1)*ns.BlockTokens], e, make([]byte, ns.BlockBytes()))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append(b, make([]byte, ns.BlockBytes())...))
		parent = links[i]
	}
	return out
}

func hdr(t *testing.T, rec []byte) block.Header {
	t.Helper()
	h, err := block.DecodeHeader(rec, 0)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestVLLMExtraValues: a vllm-scheme block's extra keys are published as
// the values vLLM's engine publishes (strings, [identifier, offset]).
func TestVLLMExtraValues(t *testing.T) {
	vl := prefixhash.Namespace{Model: "m", DType: prefixhash.Float16, BlockTokens: 4, Layers: 1, KVHeads: 1, HeadDim: 2,
		Scheme: prefixhash.SchemeVLLM, HashSeed: "0", ExtraKeyBytes: 64}
	p, err := kvevents.New(kvevents.Options{Addr: "tcp://127.0.0.1:0", NodeID: "n", BatchInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tokens := []uint32{1, 2, 3, 4}
	extra := []prefixhash.ExtraKeys{{prefixhash.VLLMMultimodalKey("img", -3), prefixhash.VLLMBytes([]byte{1, 2})}}
	rec := encodeExtra(t, vl, tokens, extra)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r received
	go kvevents.Subscribe(ctx, p.Addr(), "", r.add)
	testkit.WaitFor(t, "the subscriber to receive a batch", func() bool {
		p.BlockStored("CPU", rec)
		return len(r.events("")) > 0
	})
	got := r.events("")[0].ExtraKeys
	want := [][]any{{[]any{"img", int64(-3)}, []byte{1, 2}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("extra keys %#v, want %#v", got, want)
	}
}
