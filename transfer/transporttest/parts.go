package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// partNamespaces are the layouts the part tests read: split K/V (8 KV
// heads, so TP 1, 2, 4 and 8 each split them) whose blocks are 128 KiB,
// so that a read of a dozen is larger than one answer of the suite's
// harnesses and takes several rounds, and latent (MLA), where every rank
// reads the whole latent.
func partNamespaces() []prefixhash.Namespace {
	return []prefixhash.Namespace{
		{Model: "transporttest/split", DType: prefixhash.Float16, BlockTokens: 16, Layers: 4, KVHeads: 8, HeadDim: 64},
		{Model: "transporttest/mla", DType: prefixhash.BFloat16, BlockTokens: 16, Layers: 3, Layout: prefixhash.LatentKV, LatentDim: 96},
	}
}

// PartBlocks encodes n whole blocks of ns, a chain of distinct payloads,
// and returns their keys and encodings.
func PartBlocks(ns prefixhash.Namespace, n int) ([]prefixhash.Key, [][]byte, error) {
	keys, blocks := make([]prefixhash.Key, n), make([][]byte, n)
	parent := ns.Root()
	for i := range n {
		tokens := make([]uint32, ns.BlockTokens)
		for j := range tokens {
			tokens[j] = uint32(i*ns.BlockTokens + j)
		}
		b, k, err := block.Encode(nil, ns, parent, tokens, value(i, ns.BlockBytes()))
		if err != nil {
			return nil, nil, err
		}
		keys[i], blocks[i], parent = k, b, k
	}
	return keys, blocks, nil
}

// rankParts returns every rank's part of a block of ns at tp × pp.
func rankParts(t *testing.T, ns prefixhash.Namespace, tp, pp int) []block.Part {
	t.Helper()
	var parts []block.Part
	for pr := range pp {
		for tr := range tp {
			p, err := block.RankPart(ns, tr, tp, pr, pp)
			if err != nil {
				t.Fatalf("RankPart(tp %d/%d, pp %d/%d): %v", tr, tp, pr, pp, err)
			}
			parts = append(parts, p)
		}
	}
	return parts
}

// checkPart reports whether rec is the record of part p of whole: it
// decodes (block.Decode: header, key, its own checksum), names p, and its
// payload is ExtractPart of whole's.
func checkPart(rec, whole []byte, p block.Part) error {
	wb, err := block.Decode(whole, 0)
	if err != nil {
		return err
	}
	b, err := block.Decode(rec, 0)
	if err != nil {
		return fmt.Errorf("part %s does not decode: %w", p, err)
	}
	want := wb.Layout.ExtractPart(nil, wb.Payload, len(wb.Tokens), p)
	switch {
	case b.Part != p || b.Key != wb.Key:
		return fmt.Errorf("asked for %s of %s, got %s of %s", p, wb.Key, b.Part, b.Key)
	case !bytes.Equal(b.Payload, want):
		return fmt.Errorf("part %s: payload differs from the whole block's slice", p)
	case p == wb.Layout.Whole() && !bytes.Equal(rec, whole):
		return fmt.Errorf("the whole range is not the whole block")
	}
	return nil
}

// partReads: GetParts of every rank's slice at TP 1, 2, 4 and 8 and PP 1
// and 2, a dozen blocks per call (several answers), with misses between:
// each record decodes as the part asked for, its bytes those of the
// whole block; the whole range is the block itself.
func partReads(t *testing.T, h Harness) {
	st := NewStore()
	p := dial(t, h, h.Serve(t, st)).(transfer.PartPeer)
	ctx := context.Background()
	for _, ns := range partNamespaces() {
		keys, blocks, err := PartBlocks(ns, 12)
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			st.Set(k, blocks[i])
		}
		missing := key(2000)
		for _, tp := range []int{1, 2, 4, 8} {
			for _, pp := range []int{1, 2} {
				for _, part := range rankParts(t, ns, tp, pp) {
					ask := []prefixhash.Key{missing}
					ask = append(ask, keys...)
					parts := make([]block.Part, len(ask))
					for i := range parts {
						parts[i] = part
					}
					r, err := p.GetParts(ctx, ask, parts)
					if err != nil {
						t.Fatalf("%s tp %d pp %d %s: %v", ns.Model, tp, pp, part, err)
					}
					if r.Status[0] != transfer.StatusMiss {
						t.Errorf("%s: a missing block's part is %v", ns.Model, r.Status[0])
					}
					for i, k := range keys {
						if r.Status[i+1] != transfer.StatusOK {
							t.Fatalf("%s %s of block %d (%s): %v", ns.Model, part, i, k, r.Status[i+1])
						}
						if err := checkPart(r.Values[i+1], blocks[i], part); err != nil {
							t.Fatalf("%s tp %d pp %d block %d: %v", ns.Model, tp, pp, i, err)
						}
					}
					r.Release()
				}
			}
		}
	}
	if h.Idle != nil {
		testkit.WaitFor(t, h.Transport.Name()+" server to hold nothing once every result is released", h.Idle)
	}
}

// badParts: ranges that are not parts of their blocks are StatusError,
// item by item, beside good ones in the same call, and the connection
// keeps serving: a Get and a GetParts after them are answered.
func badParts(t *testing.T, h Harness) {
	st := NewStore()
	p := dial(t, h, h.Serve(t, st)).(transfer.PartPeer)
	ctx := context.Background()
	ns := partNamespaces()[0]
	keys, blocks, err := PartBlocks(ns, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		st.Set(k, blocks[i])
	}
	good := block.Part{L0: 1, L1: 3, H0: 4, H1: 8}
	notBlock := key(3000)
	st.Set(notBlock, value(7, 500)) // a value that is no block: no part of it
	bad := []block.Part{
		{L0: 0, L1: 5, H0: 0, H1: 8},  // layers past the end
		{L0: 2, L1: 2, H0: 0, H1: 8},  // no layers
		{L0: 0, L1: 4, H0: 2, H1: 5},  // heads not an aligned slice
		{L0: 0, L1: 4, H0: 0, H1: 16}, // heads past the end
		{L0: 0, L1: 4, H0: 0, H1: 0},
		{L0: 1<<32 - 1, L1: 1<<32 - 1, H0: 1<<32 - 1, H1: 1<<32 - 1},
	}
	ask, parts := []prefixhash.Key{keys[0]}, []block.Part{good}
	for _, b := range bad {
		ask, parts = append(ask, keys[1]), append(parts, b)
	}
	ask, parts = append(ask, notBlock, keys[1]), append(parts, good, good)
	for round := range 2 {
		r, err := p.GetParts(ctx, ask, parts)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i := range ask {
			want := transfer.StatusError
			if parts[i] == good && ask[i] != notBlock {
				want = transfer.StatusOK
				whole := blocks[0]
				if ask[i] == keys[1] {
					whole = blocks[1]
				}
				if r.Status[i] == want {
					if err := checkPart(r.Values[i], whole, good); err != nil {
						t.Fatalf("round %d item %d: %v", round, i, err)
					}
				}
			}
			if r.Status[i] != want {
				t.Errorf("round %d item %d (%s): %v, want %v", round, i, parts[i], r.Status[i], want)
			}
		}
		r.Release()
	}
	// Negative ranges never reach the wire.
	if _, err := p.GetParts(ctx, keys[:1], []block.Part{{L0: -1, L1: 1, H0: 0, H1: 8}}); !errors.Is(err, block.ErrBadPart) {
		t.Fatalf("a negative range: %v, want ErrBadPart", err)
	}
	if _, err := p.GetParts(ctx, keys, []block.Part{good}); err == nil {
		t.Fatal("GetParts of 2 keys and 1 part succeeded")
	}
	r, err := p.Get(ctx, keys)
	if err != nil {
		t.Fatalf("Get after bad ranges: %v", err)
	}
	if err := check(st, keys, r); err != nil {
		t.Fatal(err)
	}
	r.Release()
}

// claims: Claim answers each item as the sink says (ClaimWrite the first
// time, ClaimClaimed after, ClaimCovered once that part was put,
// ClaimComplete for a whole block held); a part put again with other
// bytes is StatusConflict, with the same bytes OK.
func claims(t *testing.T, h Harness) {
	st := NewStore()
	p := dial(t, h, h.Serve(t, st)).(transfer.PartPeer)
	ctx := context.Background()
	ns := partNamespaces()[1] // latent: every rank writes the same bytes
	keys, blocks, err := PartBlocks(ns, 2)
	if err != nil {
		t.Fatal(err)
	}
	st.Set(keys[0], blocks[0])
	stage := block.Part{L0: 0, L1: 2, H0: 0, H1: 1}
	ask := []prefixhash.Key{keys[0], keys[1], keys[1]}
	parts := []block.Part{stage, stage, {L0: 2, L1: 3, H0: 0, H1: 1}}
	got, err := p.Claim(ctx, ask, parts)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if want := []block.ClaimStatus{block.ClaimComplete, block.ClaimWrite, block.ClaimWrite}; !equalClaims(got, want) {
		t.Fatalf("first claims: %v, want %v", got, want)
	}
	if got, err = p.Claim(ctx, ask[1:2], parts[1:2]); err != nil || !equalClaims(got, []block.ClaimStatus{block.ClaimClaimed}) {
		t.Fatalf("second claim: %v, %v; want claimed", got, err)
	}
	rec, err := block.AppendPartRecord(nil, blocks[1], stage)
	if err != nil {
		t.Fatal(err)
	}
	// The same part of the same block (same tokens, same key) with other
	// bytes: a writer that disagrees.
	wb, err := block.Decode(blocks[1], 0)
	if err != nil {
		t.Fatal(err)
	}
	otherPayload := wb.Layout.ExtractPart(nil, wb.Payload, len(wb.Tokens), stage)
	otherPayload[0] ^= 1
	other, _, err := block.AppendPartHeaderExt(nil, 0, ns, wb.ParentLink, wb.Tokens, nil, stage, otherPayload)
	if err != nil {
		t.Fatal(err)
	}
	other = append(other, otherPayload...)
	sts, err := p.Put(ctx, []prefixhash.Key{keys[1], keys[1], keys[1]}, [][]byte{rec, rec, other})
	if err != nil {
		t.Fatalf("Put of parts: %v", err)
	}
	if want := []transfer.Status{transfer.StatusOK, transfer.StatusOK, transfer.StatusConflict}; fmt.Sprint(sts) != fmt.Sprint(want) {
		t.Fatalf("part puts: %v, want %v", sts, want)
	}
	if stored, ok := st.Part(keys[1], stage); !ok || !bytes.Equal(stored, rec) {
		t.Fatal("the conflicting part replaced the stored one")
	}
	if got, err = p.Claim(ctx, ask[1:2], parts[1:2]); err != nil || !equalClaims(got, []block.ClaimStatus{block.ClaimCovered}) {
		t.Fatalf("claim of a put part: %v, %v; want covered", got, err)
	}
	if _, err := p.Claim(ctx, ask, parts[:1]); err == nil {
		t.Fatal("Claim of 3 keys and 1 part succeeded")
	}
}

func equalClaims(a, b []block.ClaimStatus) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}
