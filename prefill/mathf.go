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
// angle p·f_i, f_i = theta^(−2i/headDim) as scaled by sc, each times sc's
// attention factor.
func ropeTable(positions, headDim int, theta float64, sc RopeScaling) (cos, sin []float32) {
	half := headDim / 2
	cos = make([]float32, positions*half)
	sin = make([]float32, positions*half)
	inv, mscale := ropeFrequencies(headDim, theta, sc)
	for p := range positions {
		for i, f := range inv {
			s, c := math.Sincos(float64(p) * f)
			cos[p*half+i], sin[p*half+i] = float32(c*mscale), float32(s*mscale)
		}
	}
	return cos, sin
}

// ropeFrequencies returns RoPE's headDim/2 inverse frequencies under sc,
// and the factor cos and sin are multiplied by, as transformers'
// modeling_rope_utils computes them (_compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters, _compute_yarn_parameters; YaRN with the
// factor as given, not recomputed from max_position_embeddings).
func ropeFrequencies(headDim int, theta float64, sc RopeScaling) (inv []float64, mscale float64) {
	half := headDim / 2
	inv = make([]float64, half)
	for i := range inv {
		inv[i] = 1 / math.Pow(theta, float64(2*i)/float64(headDim))
	}
	mscale = 1
	switch sc.Type {
	case RopeLinear:
		for i := range inv {
			inv[i] /= sc.Factor
		}
	case RopeLlama3:
		old := float64(sc.OriginalContext)
		lowWave, highWave := old/sc.LowFreqFactor, old/sc.HighFreqFactor
		for i, f := range inv {
			switch wave := 2 * math.Pi / f; {
			case wave < highWave: // high frequencies are kept
			case wave > lowWave: // low frequencies are interpolated
				inv[i] = f / sc.Factor
			default: // and those between, smoothly
				s := (old/wave - sc.LowFreqFactor) / (sc.HighFreqFactor - sc.LowFreqFactor)
				inv[i] = (1-s)*f/sc.Factor + s*f
			}
		}
	case RopeYarn:
		dim, orig := float64(headDim), float64(sc.OriginalContext)
		corr := func(rot float64) float64 {
			return dim * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(theta))
		}
		lo, hi := max(math.Floor(corr(sc.BetaFast)), 0), min(math.Ceil(corr(sc.BetaSlow)), dim-1)
		if lo == hi {
			hi += 0.001
		}
		for i, f := range inv {
			ramp := min(max((float64(i)-lo)/(hi-lo), 0), 1)
			extrapolation := 1 - ramp
			inv[i] = f/sc.Factor*(1-extrapolation) + f*extrapolation
		}
		mscale = sc.AttentionFactor
		if mscale == 0 {
			mscale = 1
			if sc.Factor > 1 {
				mscale = 0.1*math.Log(sc.Factor) + 1
			}
		}
	}
	return inv, mscale
}

// headNorm applies RMSNorm with weights w (len headDim) to each head of vec
// in place.
func headNorm(vec, w []float32, eps float64) {
	hd := len(w)
	for h := 0; h+hd <= len(vec); h += hd {
		rmsNorm(vec[h:h+hd], vec[h:h+hd], w, eps)
	}
}

// swiGLU overwrites gate with silu(gate) ⊙ up, silu(g) = g·σ(g).
func swiGLU(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = g / (1 + expf(-g)) * up[i]
	}
}
