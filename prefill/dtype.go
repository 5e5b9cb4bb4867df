package prefill

import (
	"encoding/binary"
	"math"
)

// The dtypes a checkpoint's tensors may have: the engine computes in
// float32 on the host, so BF16 and F16 are widened when they are loaded.
var loadableDTypes = []string{"F32", "BF16", "F16"}

// widen converts src, little-endian elements of dtype, into dst.
// len(src) must be len(dst) times the dtype's size; dtype is loadable.
func widen(dst []float32, src []byte, dtype string) {
	switch dtype {
	case "F32":
		getFloats(dst, src)
	case "BF16":
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case "F16":
		for i := range dst {
			dst[i] = halfToFloat(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		panic("prefill: widen from " + dtype)
	}
}

// halfToFloat returns the IEEE 754 binary16 h as a float32 (exactly).
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf, NaN
		return math.Float32frombits(sign | 0xff<<23 | frac<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
	case frac == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: frac·2^-24.
	f := float32(frac) * (1.0 / (1 << 24))
	if sign != 0 {
		return -f
	}
	return f
}

// narrow converts src into little-endian elements of dtype (F32, BF16 or
// F16) in dst, rounding to nearest even. It is how tests and benchmarks
// write 16-bit checkpoints.
func narrow(dst []byte, src []float32, dtype string) {
	switch dtype {
	case "F32":
		putFloats(dst, src)
	case "BF16":
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], floatToBF16(v))
		}
	case "F16":
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], floatToHalf(v))
		}
	default:
		panic("prefill: narrow to " + dtype)
	}
}

func floatToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40 // a quiet NaN
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func floatToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	frac := b & 0x7fffff
	switch {
	case f != f:
		return sign | 0x7e00
	case exp >= 0x1f: // overflow and Inf
		return sign | 0x7c00
	case exp <= 0: // subnormal or zero
		if exp < -10 {
			return sign
		}
		frac |= 1 << 23
		shift := uint32(14 - exp)
		h := frac >> shift
		rem := frac & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | frac>>13
	rem := frac & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent, up to Inf: correct
	}
	return sign | uint16(h)
}
