package prefill

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/gpu/gputest"
)

// loadDevice loads w on a device backend over a fresh fake GPU. Cleanup
// closes model and backend and fails the test if anything was left on the
// device.
func loadDevice(t testing.TB, c Config, w *Weights) (Model, *gputest.Device) {
	t.Helper()
	dev := gputest.New()
	b, err := NewDevice(dev, DeviceOptions{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.Load(c, w)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("the device backend left memory behind: %v", err)
		}
	})
	return m, dev
}

// fourLayers is a random 4-layer model with grouped-query attention (4
// query heads per KV head) and an FFN wider than the model.
func fourLayers() (Config, *Weights) {
	c := Config{Layers: 4, Dim: 96, Heads: 8, KVHeads: 2, HeadDim: 16, FFNDim: 160, Vocab: 300,
		MaxContext: 2048, BlockTokens: 16, RopeTheta: 500000}
	c.EnsureDefaults()
	return c, SeededWeights(c, 4242)
}

// TestDeviceMatchesCPU: the device backend's logits and K/V equal the CPU
// backend's, cold and over K/V computed before (a cached prefix), on the
// demo model, on a random 4-layer model, on a small MLA model and on a hybrid (full,
// sliding-window and linear-attention layers), with prompts longer than one
// row chunk (so a product is cut in several). Every weight product went to
// the device: the count is one per matrix per row chunk, plus the LM head.
func TestDeviceMatchesCPU(t *testing.T) {
	demo := DefaultConfig()
	c4, w4 := fourLayers()
	for _, tc := range []struct {
		name    string
		c       Config
		w       *Weights
		lengths []int
	}{
		{"demo", demo, SeededWeights(demo, 0), []int{1, 70, 130}},
		{"4 layers", c4, w4, []int{1, 33, rowChunk + 77}},
		{"mla", tinyMLAConfig(), tinyMLAWeights(), []int{1, 40, rowChunk + 9}},
		{"hybrid", hybridConfig(), hybridWeights(), []int{1, 40, rowChunk + 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			cpu, err := NewCPU(CPUOptions{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			ref, err := cpu.Load(c, tc.w)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			m, dev := loadDevice(t, c, tc.w)
			r := newRand(uint64(c.Layers))
			for _, n := range tc.lengths {
				tokens := randTokens(r, n, c.Vocab)
				want := NewKV(c, n)
				wantLogits := forward(t, ref, c, want, 0, tokens)
				before := dev.Products()
				got := NewKV(c, n)
				gotLogits := forward(t, m, c, got, 0, tokens)
				chunks := (n + rowChunk - 1) / rowChunk
				products := 4*c.Layers*chunks + 1
				if c.MLA() {
					products += c.Layers // the latents' expansion, kv_b_proj
				}
				if p := dev.Products() - before; p != products {
					t.Errorf("n=%d: %d products on the device, want %d", n, p, products)
				}
				if e := relErr(gotLogits, wantLogits); e > 1e-3 {
					t.Errorf("n=%d: device logits differ from the CPU's by %.2g (relative)", n, e)
				}
				for l := range c.Layers {
					if c.MLA() {
						if e := relErr(got.Latent(l), want.Latent(l)); e > 1e-3 {
							t.Errorf("n=%d layer %d: latent differs by %.2g", n, l, e)
						}
						continue
					}
					if e := relErr(got.K(l), want.K(l)); e > 1e-3 {
						t.Errorf("n=%d layer %d: K differs by %.2g", n, l, e)
					}
					if e := relErr(got.V(l), want.V(l)); e > 1e-3 {
						t.Errorf("n=%d layer %d: V differs by %.2g", n, l, e)
					}
				}
				// The suffix over the CPU's K/V of a prefix: what a prefix hit
				// computes on the device from blocks another backend wrote.
				if n > 1 {
					split := n / 3
					kv := NewKV(c, n)
					forward(t, ref, c, kv, 0, tokens[:split])
					warm := forward(t, m, c, kv, split, tokens[split:])
					if e := relErr(warm, wantLogits); e > 1e-3 {
						t.Errorf("n=%d split=%d: warm device logits differ from the cold CPU's by %.2g", n, split, e)
					}
				}
			}
		})
	}
}

// TestDeviceConcurrent: forward passes at once each get their own stream
// and buffers (the fake panics if two goroutines share a stream) and agree.
func TestDeviceConcurrent(t *testing.T) {
	c, w := fourLayers()
	m, dev := loadDevice(t, c, w)
	tokens := randTokens(newRand(9), 40, c.Vocab)
	want := forward(t, m, c, NewKV(c, 40), 0, tokens)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			logits := make([]float32, c.Vocab)
			if err := m.Forward(context.Background(), NewKV(c, 40), 0, tokens, logits); err != nil {
				errs <- err
				return
			}
			if e := relErr(logits, want); e != 0 {
				errs <- errors.New("concurrent logits differ")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, _, streams := dev.Live(); streams < 1 || streams > 4 {
		t.Errorf("%d streams live after 4 concurrent passes, want 1..4", streams)
	}
}

// TestDeviceFaults: a device too small for the weights fails Load with an
// error naming the matrix and leaves nothing allocated; a device error in a
// forward pass is the pass's error, and the model works again once the
// device does; a cancelled pass stops; misuse is refused as on the CPU.
func TestDeviceFaults(t *testing.T) {
	c, w := fourLayers()

	dev := gputest.New()
	dev.SetLimit(100 << 10)
	b, err := NewDevice(dev, DeviceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Load(c, w); err == nil || !strings.Contains(err.Error(), "weight matrix") || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("Load on a full device = %v, want an error naming the matrix and the cause", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("a failed Load left memory behind: %v", err)
	}

	m, dev := loadDevice(t, c, w)
	tokens := randTokens(newRand(3), 20, c.Vocab)
	want := forward(t, m, c, NewKV(c, 20), 0, tokens)
	logits := make([]float32, c.Vocab)
	dev.SetFail(errors.New("gputest: Xid 79, fallen off the bus"))
	if err := m.Forward(context.Background(), NewKV(c, 20), 0, tokens, logits); err == nil || !strings.Contains(err.Error(), "fallen off the bus") {
		t.Fatalf("Forward on a failing device = %v", err)
	}
	dev.SetFail(nil)
	if e := relErr(forward(t, m, c, NewKV(c, 20), 0, tokens), want); e != 0 {
		t.Fatalf("after the device recovered, logits differ by %.2g", e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Forward(ctx, NewKV(c, 20), 0, tokens, logits); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Forward = %v", err)
	}
	if err := m.Forward(context.Background(), NewKV(c, 20), 0, []uint32{uint32(c.Vocab)}, logits); err == nil {
		t.Fatal("a token outside the vocabulary was accepted")
	}
	if _, err := NewDevice(dev, DeviceOptions{Threads: -1}); err == nil {
		t.Fatal("negative threads accepted")
	}
}

// TestDeviceEngine: the engine on the device backend publishes blocks that
// a CPU engine hits, and hits the CPU engine's blocks, with the cold logits.
func TestDeviceEngine(t *testing.T) {
	dev := gputest.New()
	b, err := NewDevice(dev, DeviceOptions{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	cache := newMemCache()
	onDev := newTinyEngine(t, cache, func(o *Options) { o.Backend = b })
	onCPU := newTinyEngine(t, cache, nil)
	if !strings.HasPrefix(onDev.Backend(), "gpu/blas on gputest") {
		t.Errorf("Backend() = %q", onDev.Backend())
	}
	cold := newTinyEngine(t, nil, nil)
	tokens := randTokens(newRand(17), 200, tinyConfig().Vocab)
	run(t, onDev, tokens[:100])
	flush(t, onDev)
	warm := run(t, onCPU, tokens[:150])
	if warm.Usage.CachedTokens != 96 {
		t.Fatalf("the CPU engine hit %d tokens of the device engine's, want 96", warm.Usage.CachedTokens)
	}
	flush(t, onCPU)
	res := run(t, onDev, tokens)
	if res.Usage.CachedTokens != 144 {
		t.Fatalf("the device engine hit %d tokens, want 144", res.Usage.CachedTokens)
	}
	if e := relErr(res.Logits, run(t, cold, tokens).Logits); e > 1e-3 {
		t.Fatalf("device engine over cached blocks: logits differ from cold by %.2g", e)
	}
	onDev.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
