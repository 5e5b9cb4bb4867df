package prefill

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// littleEndian reports whether float32s are laid out in memory as the
// little-endian bytes the block and safetensors formats use, so that a copy
// is a conversion.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// floatBytes views f as bytes (its in-memory representation, which is
// little-endian float32 when littleEndian is true). The view aliases f.
func floatBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// putFloats writes src into dst as little-endian float32s; len(dst) must be
// 4·len(src).
func putFloats(dst []byte, src []float32) {
	if littleEndian {
		copy(dst, floatBytes(src))
		return
	}
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

// getFloats reads little-endian float32s from src into dst; len(src) must be
// 4·len(dst).
func getFloats(dst []float32, src []byte) {
	if littleEndian {
		copy(floatBytes(dst), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}
