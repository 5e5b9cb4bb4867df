package prefill

import "math"

// expf returns e^x in float32 to within about 2 ulp, for any x: Cody–Waite
// range reduction x = k·ln2 + r, |r| ≤ ln2/2, and a degree-6 polynomial for
// e^r. It is what softmax and SiLU spend their time in, so it avoids float64
// and the math package's generality; below −87.3 it flushes to 0 (softmax
// weights that small do not change a float32 sum).
func expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375 // ln2 = ln2hi + ln2lo, ln2hi exact in 9 bits
		ln2lo = -2.12194440e-4
	)
	switch {
	case x > 88: // 2^k would overflow the exponent field; rare, so exact
		return float32(math.Exp(float64(x)))
	case !(x >= -87.33): // also NaN and −Inf
		if x != x {
			return x
		}
		return 0
	}
	k := float32(int32(x*log2e + copysignHalf(x)))
	r := x - k*ln2hi
	r = r - k*ln2lo
	// e^r ≈ 1 + r + r²/2! + … + r⁶/6! (Horner)
	p := float32(1.0 / 720)
	p = p*r + 1.0/120
	p = p*r + 1.0/24
	p = p*r + 1.0/6
	p = p*r + 0.5
	p = p*r + 1
	p = p*r + 1
	return p * math.Float32frombits(uint32(int32(k)+127)<<23)
}

func copysignHalf(x float32) float32 {
	if x < 0 {
		return -0.5
	}
	return 0.5
}

// rmsNorm writes x / sqrt(mean(x²) + eps) ⊙ w to dst. dst may be x.
func rmsNorm(dst, x, w []float32, eps float64) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(ss/float64(len(x))+eps))
	w = w[:len(x)]
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = v * inv * w[i]
	}
}

// rope rotates each head of vec (heads × headDim, contiguous) for one
// position, Hugging Face style ("rotate_half": element i pairs with element
// i+headDim/2). cos and sin hold the position's headDim/2 angles.
func rope(vec []float32, heads, headDim int, cos, sin []float32) {
	half := headDim / 2
	cos, sin = cos[:half], sin[:half]
	for h := range heads {
		x := vec[h*headDim : (h+1)*headDim]
		x1, x2 := x[:half], x[half:]
		for i := range half {
			a, b := x1[i], x2[i]
			x1[i] = a*cos[i] - b*sin[i]
			x2[i] = b*cos[i] + a*sin[i]
		}
	}
}

// ropeTable returns the cos and sin tables, [positions][headDim/2], of
// angle p·theta^(−2i/headDim).
func ropeTable(positions, headDim int, theta float64) (cos, sin []float32) {
	half := headDim / 2
	cos = make([]float32, positions*half)
	sin = make([]float32, positions*half)
	inv := make([]float64, half)
	for i := range inv {
		inv[i] = 1 / math.Pow(theta, float64(2*i)/float64(headDim))
	}
	for p := range positions {
		for i, f := range inv {
			s, c := math.Sincos(float64(p) * f)
			cos[p*half+i], sin[p*half+i] = float32(c), float32(s)
		}
	}
	return cos, sin
}

// swiGLU overwrites gate with silu(gate) ⊙ up, silu(g) = g·σ(g).
func swiGLU(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = g / (1 + expf(-g)) * up[i]
	}
}
