package prefill

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/kvmesh/kvmesh/gpu/gpumem"
)

// DeviceOptions configure the device backend.
type DeviceOptions struct {
	// Threads is the number of goroutines one forward pass runs attention
	// tiles and element-wise work on, on the host. Default
	// runtime.GOMAXPROCS(0).
	Threads int
}

// EnsureDefaults fills zero fields with their defaults.
func (o *DeviceOptions) EnsureDefaults() {
	if o.Threads == 0 {
		o.Threads = runtime.GOMAXPROCS(0)
	}
}

// Validate names the first bad field.
func (o DeviceOptions) Validate() error {
	return CPUOptions{Threads: o.Threads}.Validate()
}

// Device is the backend that runs the products with weight matrices on a
// GPU: a gpumem.BLAS, which is cuBLAS on a CUDA device in a cuda build
// (package gpu opens one) and an in-memory fake in tests. Load uploads the
// weights once; each product then uploads its input rows through pinned
// memory, multiplies on the device and downloads the result, on a stream of
// the forward pass's own. RMSNorm, RoPE, attention (its products, its
// softmax), SwiGLU and the K/V cache stay on the host, between the products:
// the forward pass is the CPU backend's, line for line, so that everything
// but the products is the code the default build tests.
type Device struct {
	dev  gpumem.BLAS
	opts DeviceOptions
}

var _ Backend = (*Device)(nil)

// NewDevice returns the backend on dev, which it takes ownership of: Close
// closes it. opts are completed with EnsureDefaults.
func NewDevice(dev gpumem.BLAS, opts DeviceOptions) (*Device, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &Device{dev: dev, opts: opts}, nil
}

// Name implements Backend: "gpu/blas", and the device when it names itself.
func (b *Device) Name() string {
	if s, ok := b.dev.(fmt.Stringer); ok {
		return "gpu/blas on " + s.String()
	}
	return "gpu/blas"
}

// Close closes the device. Every model loaded from b must be closed first.
func (b *Device) Close() error { return b.dev.Close() }

// Load implements Backend: it uploads every weight matrix to the device.
// When the device refuses (out of memory), it frees what it uploaded and
// says which matrix failed.
func (b *Device) Load(cfg Config, w *Weights) (Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := w.Check(cfg); err != nil {
		return nil, err
	}
	m := newModel(cfg, w, b.opts.Threads)
	d, q, kvd, ffn := cfg.Dim, cfg.QDim(), cfg.KVDim(), cfg.FFNDim
	ps := &devPasses{
		dev:  b.dev,
		aCap: rowChunk * max(d, q, ffn),
		cCap: max(rowChunk*max(q+2*kvd, d, 2*ffn), cfg.Vocab),
	}
	if err := ps.upload(m.mats); err != nil {
		return nil, errors.Join(err, ps.close())
	}
	m.passes = ps
	return m, nil
}

// devPasses are a device model's weights, on the device, and the passes of
// its forward passes, made on demand and kept for the next.
type devPasses struct {
	dev        gpumem.BLAS
	weights    []gpumem.Ptr // by matrix.id
	aCap, cCap int          // float32s of a pass's device input and output buffers
	mu         struct {
		sync.Mutex
		idle, all []*devPass
	}
}

// stagingBytes is the pinned buffer weights are uploaded through.
const stagingBytes = 4 << 20

// upload copies every matrix to a device allocation of its own.
func (ps *devPasses) upload(mats []*matrix) (err error) {
	s, err := ps.dev.NewStream()
	if err != nil {
		return fmt.Errorf("prefill: device stream: %w", err)
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	buf, err := ps.dev.HostAlloc(stagingBytes)
	if err != nil {
		return fmt.Errorf("prefill: pinned staging of %d bytes: %w", stagingBytes, err)
	}
	defer func() { err = errors.Join(err, ps.dev.HostFree(buf)) }()
	for _, x := range mats {
		p, err := ps.dev.Alloc(4 * int64(len(x.data)))
		if err != nil {
			return fmt.Errorf("prefill: weight matrix %d (%d×%d float32) on the device: %w", x.id, x.rows, x.cols, err)
		}
		ps.weights = append(ps.weights, p)
		for off := 0; off < len(x.data); off += stagingBytes / 4 {
			part := x.data[off:min(len(x.data), off+stagingBytes/4)]
			b := buf[:4*len(part)]
			putFloats(b, part)
			err := s.HtoD(p+gpumem.Ptr(4*off), b)
			if werr := s.Wait(); err == nil {
				err = werr
			}
			if err != nil {
				return fmt.Errorf("prefill: upload weight matrix %d: %w", x.id, err)
			}
		}
	}
	return nil
}

func (ps *devPasses) get() (pass, error) {
	ps.mu.Lock()
	if n := len(ps.mu.idle); n > 0 {
		p := ps.mu.idle[n-1]
		ps.mu.idle = ps.mu.idle[:n-1]
		ps.mu.Unlock()
		return p, nil
	}
	ps.mu.Unlock()
	p, err := ps.newPass()
	if err != nil {
		return nil, err
	}
	ps.mu.Lock()
	ps.mu.all = append(ps.mu.all, p)
	ps.mu.Unlock()
	return p, nil
}

func (ps *devPasses) put(p pass) {
	ps.mu.Lock()
	ps.mu.idle = append(ps.mu.idle, p.(*devPass))
	ps.mu.Unlock()
}

// newPass makes a stream, a pinned buffer and device buffers for the
// input and output of a product.
func (ps *devPasses) newPass() (_ *devPass, err error) {
	p := &devPass{ps: ps}
	defer func() {
		if err != nil {
			err = fmt.Errorf("prefill: forward pass on the device: %w", errors.Join(err, p.free()))
		}
	}()
	if p.s, err = ps.dev.NewStream(); err != nil {
		return nil, err
	}
	if p.pin, err = ps.dev.HostAlloc(4 * (ps.aCap + ps.cCap)); err != nil {
		return nil, err
	}
	if p.a, err = ps.dev.Alloc(4 * int64(ps.aCap)); err != nil {
		return nil, err
	}
	if p.c, err = ps.dev.Alloc(4 * int64(ps.cCap)); err != nil {
		return nil, err
	}
	return p, nil
}

func (ps *devPasses) close() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var errs []error
	for _, p := range ps.mu.all {
		errs = append(errs, p.free())
	}
	ps.mu.all, ps.mu.idle = nil, nil
	for _, w := range ps.weights {
		errs = append(errs, ps.dev.Free(w))
	}
	ps.weights = nil
	return errors.Join(errs...)
}

// devPass is one forward pass's stream and buffers: pin holds the input
// rows (aCap float32s) and then the output rows (cCap).
type devPass struct {
	ps   *devPasses
	s    gpumem.Stream
	pin  []byte
	a, c gpumem.Ptr
}

// free releases what newPass made.
func (p *devPass) free() error {
	var errs []error
	if p.c != 0 {
		errs = append(errs, p.ps.dev.Free(p.c))
	}
	if p.a != 0 {
		errs = append(errs, p.ps.dev.Free(p.a))
	}
	if p.pin != nil {
		errs = append(errs, p.ps.dev.HostFree(p.pin))
	}
	if p.s != nil {
		errs = append(errs, p.s.Close())
	}
	return errors.Join(errs...)
}

func (p *devPass) linear(ctx context.Context, w *matrix, m int, a []float32, lda int, beta float32, c []float32, ldc int) error {
	rows := min(p.ps.aCap/w.cols, p.ps.cCap/w.rows)
	for r0 := 0; r0 < m; r0 += rows {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := p.product(w, min(rows, m-r0), a[r0*lda:], lda, beta, c[r0*ldc:], ldc); err != nil {
			return err
		}
	}
	return nil
}

func (p *devPass) head(ctx context.Context, w *matrix, h, logits []float32) error {
	return p.linear(ctx, w, 1, h, len(h), 0, logits, len(logits))
}

// product computes c = a·wᵀ + beta·c for m rows that fit the pass's
// buffers: the rows go up packed (row stride w.cols), and come back packed.
func (p *devPass) product(w *matrix, m int, a []float32, lda int, beta float32, c []float32, ldc int) error {
	k, n := w.cols, w.rows
	pa, pc := p.pin[:4*m*k], p.pin[4*p.ps.aCap:][:4*m*n]
	for i := range m {
		putFloats(pa[4*i*k:4*(i+1)*k], a[i*lda:i*lda+k])
	}
	err := p.s.HtoD(p.a, pa)
	if beta != 0 {
		for i := range m {
			putFloats(pc[4*i*n:4*(i+1)*n], c[i*ldc:i*ldc+n])
		}
		err = errors.Join(err, p.s.HtoD(p.c, pc))
	}
	err = errors.Join(err,
		p.ps.dev.Sgemm(p.s, false, true, m, n, k, 1, p.a, k, p.ps.weights[w.id], k, beta, p.c, n),
		p.s.DtoH(pc, p.c))
	// Wait even after a failed enqueue: the copies already queued read and
	// write the pinned buffer.
	if err = errors.Join(err, p.s.Wait()); err != nil {
		return fmt.Errorf("prefill: %d×%d×%d product on the device: %w", m, n, k, err)
	}
	for i := range m {
		getFloats(c[i*ldc:i*ldc+n], pc[4*i*n:4*(i+1)*n])
	}
	return nil
}
