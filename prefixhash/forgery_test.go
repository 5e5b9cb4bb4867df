package prefixhash

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The key format before KeyVersion 2, kept here only as the reference the
// forgery below is proven against: k = xxh64(seedHi, parent ‖ tokens) ‖
// xxh64(seedLo, parent ‖ tokens), big-endian.
const (
	oldSeedHi uint64 = 0x6b766d6573682f68 // "kvmesh/h"
	oldSeedLo uint64 = 0x6b766d6573682f6c // "kvmesh/l"
	xxP1      uint64 = 11400714785074694791
	xxP2      uint64 = 14029467366897019727
)

func oldBlockKey(parent Key, tokens []uint32) Key {
	msg := append([]byte(nil), parent[:]...)
	for _, t := range tokens {
		msg = binary.LittleEndian.AppendUint32(msg, t)
	}
	var k Key
	binary.BigEndian.PutUint64(k[:8], xxhashSeeded(oldSeedHi, msg))
	binary.BigEndian.PutUint64(k[8:], xxhashSeeded(oldSeedLo, msg))
	return k
}

func xxhashSeeded(seed uint64, b []byte) uint64 {
	d := xxhash.NewWithSeed(seed)
	d.Write(b)
	return d.Sum64()
}

// forgeOld returns a 16-token block T' != T with the same old key as T under
// every parent, hence every namespace and tenant salt. XXH64 hashes the
// 80-byte message parent ‖ T in 8-byte words through four lanes; lane 3 sees
// only the token words w0 (tokens 0-1) and w4 (tokens 8-9):
// v3 = round(round(seed, w0), w4), round(acc, in) = rotl31(acc + in·p2)·p1.
// Change w0 by δ·p2⁻¹, so that acc + w0·p2 grows by δ: when no carry crosses
// bit 33 (the rotation boundary) for either seed, rotl31 grows by δ·2^31
// for both, the inner round by δ·2^31·p1, and w4' = w4 − δ·2^31·p1·p2⁻¹
// brings both seeds' lane 3 back to its old state. Nothing else changed.
func forgeOld(t []uint32) ([]uint32, bool) {
	inv := xxP2 // p2⁻¹ mod 2^64 by Newton's iteration (p2 is odd)
	for range 6 {
		inv *= 2 - xxP2*inv
	}
	w0 := uint64(t[0]) | uint64(t[1])<<32
	w4 := uint64(t[8]) | uint64(t[9])<<32
	const low33 = 1<<33 - 1
	for delta := uint64(1); delta < 1<<20; delta++ {
		ok := true
		for _, seed := range []uint64{oldSeedHi, oldSeedLo} {
			if (seed+w0*xxP2)&low33+delta > low33 {
				ok = false // a carry would cross the rotation boundary
			}
		}
		if !ok {
			continue
		}
		w0f := w0 + delta*inv
		w4f := w4 - delta<<31*xxP1*inv
		f := append([]uint32(nil), t...)
		f[0], f[1] = uint32(w0f), uint32(w0f>>32)
		f[8], f[9] = uint32(w4f), uint32(w4f>>32)
		return f, true
	}
	return nil, false
}

// TestForgedBlockCollidesOnlyUnderOldKeys is the security issue, as a test:
// a second token block with the key of a chosen one was computable in
// microseconds under the xxhash keys (any parent, any salt); under SHA-256
// the same pair gets different keys.
func TestForgedBlockCollidesOnlyUnderOldKeys(t *testing.T) {
	victims := [][]uint32{
		seqTokens(16, 7919), // a "system prompt" block
		goldenTokens(16, 9),
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	}
	var parents []Key
	for _, salt := range []string{"", "tenant-a", "tenant-b", "a much longer tenant salt than usual"} {
		ns := testNS()
		ns.TenantSalt = salt
		parents = append(parents, ns.Root())
		parents = append(parents, Keys(ns, seqTokens(48, 31))...)
	}
	parents = append(parents, Key{})
	for vi, victim := range victims {
		forged, ok := forgeOld(victim)
		if !ok {
			t.Fatalf("victim %d: no carry-free change found", vi)
		}
		if equalTokens(forged, victim) {
			t.Fatalf("victim %d: forged block equals the victim", vi)
		}
		for pi, parent := range parents {
			if oldBlockKey(parent, forged) != oldBlockKey(parent, victim) {
				t.Fatalf("victim %d parent %d: the forgery does not collide under the old keys; the reference is wrong", vi, pi)
			}
			if BlockKey(parent, forged) == BlockKey(parent, victim) {
				t.Errorf("victim %d parent %d: forged block has the victim's key under SHA-256 keys", vi, pi)
			}
		}
	}
}

func equalTokens(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
