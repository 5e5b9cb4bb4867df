package block_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func TestObjectRecord(t *testing.T) {
	ns := blocktest.NS()
	o := block.Object{Name: "vllm@tp0@4f3a", Piece: 1, Pieces: 3, Size: 1 << 20, Generation: 99,
		Retention: block.Retention{Pin: block.PinHard, TTL: 90 * time.Second}}
	payload := bytes.Repeat([]byte{7}, 1000)
	b, key, err := block.EncodeObject(nil, 42, ns, o, payload)
	if err != nil {
		t.Fatal(err)
	}
	if want := prefixhash.PieceKey(prefixhash.ObjectKey(ns.Root(), o.Name), 1); key != want {
		t.Fatalf("key %s, want %s", key, want)
	}
	if len(b) != block.ObjectHeaderLen(len(o.Name))+len(payload) || block.ObjectHeaderLen(len(o.Name))%64 != 0 {
		t.Fatalf("record of %d bytes", len(b))
	}
	blk, err := block.Decode(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if blk.Kind != block.KindObject || blk.Object != o || blk.Key != key || blk.Tenant != 42 || !blk.Whole() ||
		!bytes.Equal(blk.Payload, payload) || len(blk.Tokens) != 0 {
		t.Fatalf("decoded %+v", blk.Header)
	}
	if err := blk.CheckObject(ns, o.Name, 1); err != nil {
		t.Fatal(err)
	}
	if err := blk.CheckObject(ns, o.Name, 0); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("wrong piece accepted: %v", err)
	}
	other := ns
	other.TenantSalt = "x"
	if err := blk.CheckObject(other, o.Name, 1); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("other namespace accepted: %v", err)
	}
	// Every byte matters: flip each header byte and the record must fail.
	for i := range block.ObjectHeaderLen(len(o.Name)) {
		bad := bytes.Clone(b)
		bad[i] ^= 0x10
		if _, err := block.Decode(bad, 0); err == nil {
			t.Fatalf("byte %d flipped: accepted", i)
		}
	}
	bad := bytes.Clone(b)
	bad[len(bad)-1] ^= 1
	if _, err := block.Decode(bad, 0); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("payload flipped: %v", err)
	}
	if _, err := block.Decode(b, 999); !errors.Is(err, block.ErrTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
}

func TestObjectRecordRefuses(t *testing.T) {
	ns := blocktest.NS()
	ok := block.Object{Name: "k", Pieces: 1, Size: 3}
	for _, tc := range []struct {
		what string
		edit func(o *block.Object)
	}{
		{"empty name", func(o *block.Object) { o.Name = "" }},
		{"long name", func(o *block.Object) { o.Name = strings.Repeat("n", prefixhash.MaxObjectName+1) }},
		{"not UTF-8", func(o *block.Object) { o.Name = "\xc3\x28" }},
		{"no pieces", func(o *block.Object) { o.Pieces = 0 }},
		{"piece past the count", func(o *block.Object) { o.Piece = 1 }},
		{"piece larger than the object", func(o *block.Object) { o.Size = 2 }},
		{"unknown pin", func(o *block.Object) { o.Retention.Pin = 3 }},
		{"TTL past the field", func(o *block.Object) { o.Retention.TTL = block.MaxObjectTTL + time.Millisecond }},
	} {
		o := ok
		tc.edit(&o)
		if _, _, err := block.EncodeObject(nil, 0, ns, o, []byte("abc")); err == nil {
			t.Errorf("%s: accepted", tc.what)
		}
	}
	// A record with a name that is not UTF-8, forged with a good checksum.
	b, _, err := block.EncodeObject(nil, 0, ns, block.Object{Name: "ab", Pieces: 1, Size: 1}, []byte{1})
	if err != nil {
		t.Fatal(err)
	}
	b[block.FixedHeaderLen] = 0xff
	fixHeaderSum(b, 2)
	if _, err := block.Decode(b, 0); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("non-UTF-8 name: %v", err)
	}
}

// fixHeaderSum rewrites an object header's checksum after an edit.
func fixHeaderSum(b []byte, nameLen int) {
	binary.LittleEndian.PutUint64(b[120:], xxhash.Sum64(append(bytes.Clone(b[:120]), b[128:128+nameLen]...)))
}

// checkObjectReencodes fails t unless the accepted object record blk (of
// data) re-encodes to exactly data.
func checkObjectReencodes(t *testing.T, blk block.Block, data []byte) {
	t.Helper()
	if prefixhash.PieceKey(prefixhash.ObjectKey(blk.Parent, blk.Object.Name), blk.Object.Piece) != blk.Key {
		t.Fatal("accepted an object whose key does not match its name")
	}
	ns := prefixhash.Namespace{Model: "x", DType: prefixhash.Float16, BlockTokens: 1, Layers: 1, KVHeads: 1, HeadDim: 1}
	re, _, err := block.EncodeObject(nil, blk.Tenant, ns, blk.Object, blk.Payload)
	if err != nil {
		t.Fatalf("accepted object does not re-encode: %v", err)
	}
	// Namespace digest, key and root are the namespace's: compare the rest.
	copy(re[16:24], data[16:24])
	copy(re[24:56], data[24:56])
	re[57] = data[57]
	if !bytes.Equal(re[:120], data[:120]) || !bytes.Equal(re[128:], data[128:]) {
		t.Fatal("accepted object re-encodes differently")
	}
}

var updateObjects = flag.Bool("update-objects", false, "rewrite testdata/golden_objects.json (only when the object record changes on purpose)")

// TestGoldenObjects pins object records for other implementations
// (clients/python reproduces them): testdata/golden_objects.json.
func TestGoldenObjects(t *testing.T) {
	type rec struct {
		Name       string `json:"name"`
		Piece      int    `json:"piece"`
		Pieces     int    `json:"pieces"`
		Size       uint64 `json:"size"`
		Generation uint64 `json:"generation"`
		Pin        int    `json:"pin"`
		TTLMillis  int64  `json:"ttl_ms"`
		Tenant     uint64 `json:"tenant"`
		Payload    string `json:"payload"` // hex
		Record     string `json:"record"`  // hex: header and payload
	}
	ns := prefixhash.Namespace{Model: "mooncake", DType: prefixhash.Int8, BlockTokens: 1, Layers: 1, KVHeads: 1, HeadDim: 1}
	var recs []rec
	for i, in := range []rec{
		{Name: "hello_key", Pieces: 1, Size: 5, Generation: 1, Payload: "68656c6c6f"},
		{Name: "model@tp_rank:3@ключ", Piece: 2, Pieces: 3, Size: 300, Generation: 0xfeedface, Pin: 2, TTLMillis: 90000, Tenant: 42, Payload: "000102"},
	} {
		p, _ := hex.DecodeString(in.Payload)
		b, _, err := block.EncodeObject(nil, in.Tenant, ns, block.Object{Name: in.Name, Piece: in.Piece, Pieces: in.Pieces, Size: in.Size,
			Generation: in.Generation, Retention: block.Retention{Pin: block.Pin(in.Pin), TTL: time.Duration(in.TTLMillis) * time.Millisecond}}, p)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		in.Record = hex.EncodeToString(b)
		recs = append(recs, in)
	}
	out, err := json.MarshalIndent(map[string]any{
		"comment":   "object records of namespace mooncake/int8/b1/l1/kv1x1; go test ./block -run TestGoldenObjects -update-objects rewrites it",
		"namespace": map[string]any{"model": "mooncake", "dtype": "int8", "block_tokens": 1, "layers": 1, "kv_heads": 1, "head_dim": 1},
		"records":   recs,
	}, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, '\n')
	const path = "testdata/golden_objects.json"
	if *updateObjects {
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, out) {
		t.Fatalf("%s differs from the records this build encodes; the object record changed", path)
	}
}
