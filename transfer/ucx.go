//go:build ucx && linux && cgo

package transfer

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "ucx_glue.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"
)

// UCXBuilt reports whether this build has the UCX fabric (-tags ucx).
const UCXBuilt = true

// UCX is the Fabric of UCX (the Unified Communication X library, Debian's
// libucx0): one UCP context and one worker per process, driven by one
// progress goroutine locked to its OS thread, which alone calls into the
// worker (UCS_THREAD_MODE_SINGLE). Reads are ucp_get_nbx into registered
// landing memory; the endpoint to each owner uses peer error handling
// (UCP_ERR_HANDLING_MODE_PEER), so a dead owner fails the reads in flight
// instead of hanging them. The library is loaded at run time (dlopen): a
// ucx build starts on a host without UCX, and NewUCX says so.
//
// Over UCX's TCP transport a get is answered by the owner's progress
// goroutine (UCX emulates it over active messages); over shared memory
// (cma) the reader's kernel copies from the owner's memory; over RDMA
// verbs (rc, dc, ud) the owner's NIC answers.
type UCX struct {
	c    *C.kvu_ctx
	info UCXInfo
	ops  chan func() // run on the progress thread
	done chan struct{}

	// pending are the requests in flight; only the progress thread
	// touches them.
	pending []*ucxRequests

	// network: UCX opened a network transport (tcp, verbs), whose
	// endpoints detect a dead peer.
	network bool

	mu     sync.Mutex
	closed bool
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ucxRequests are the requests the progress thread polls.
type ucxRequests struct {
	reqs []unsafe.Pointer // nil once complete
	err  C.ucs_status_t   // the first failure
	done func(C.ucs_status_t)
}

// NewUCX loads the UCX library, makes a context and a worker, and starts
// the progress goroutine. An error wraps ErrNoFabric: the library is
// missing, or UCX found no transport it could use.
func NewUCX(opts *UCXOptions) (*UCX, error) {
	var o UCXOptions
	if opts != nil {
		o = *opts
	}
	if o.Library == "" {
		o.Library = "libucp.so.0"
	}
	// UCX must not install signal handlers (its global options, read
	// when the library loads): the Go runtime owns SIGSEGV and friends (a
	// nil dereference is a panic, not a crash report), and the node owns
	// SIGHUP (it reloads its certificate and tokens), which UCX otherwise
	// takes as its debug signal.
	os.Setenv("UCX_ERROR_SIGNALS", "")
	os.Setenv("UCX_HANDLE_ERRORS", "none")
	os.Setenv("UCX_DEBUG_SIGNO", "0")
	lib := C.CString(o.Library)
	defer C.free(unsafe.Pointer(lib))
	var msg [512]C.char
	if C.kvu_load(lib, &msg[0], C.size_t(len(msg))) != 0 {
		return nil, fmt.Errorf("%w: load the UCX library %s: %s (install UCX: Debian's libucx0)", ErrNoFabric, o.Library, C.GoString(&msg[0]))
	}
	tls, devs := C.CString(o.TLS), C.CString(o.NetDevices)
	defer C.free(unsafe.Pointer(tls))
	defer C.free(unsafe.Pointer(devs))
	u := &UCX{ops: make(chan func(), 256), done: make(chan struct{})}
	if st := C.kvu_open(tls, devs, &u.c); st != C.UCS_OK {
		return nil, fmt.Errorf("%w: start UCX (UCX_TLS %q, UCX_NET_DEVICES %q): %s", ErrNoFabric, envOr(o.TLS, "UCX_TLS"), envOr(o.NetDevices, "UCX_NET_DEVICES"), ucsError(st))
	}
	u.info.Transports = parseUCXResources(u.contextInfo())
	u.info.Version = ucxVersionString(uint32(C.kvu_version()))
	u.network = u.info.Network()
	u.info.CUDA = u.c.mem_types&(1<<C.UCS_MEMORY_TYPE_CUDA) != 0
	go u.run()
	return u, nil
}

// contextInfo is ucp_context_print_info's text.
func (u *UCX) contextInfo() string {
	var text [16 << 10]C.char
	n := C.kvu_info(u.c, &text[0], C.size_t(len(text)))
	return C.GoStringN(&text[0], C.int(n))
}

func envOr(v, name string) string {
	if v != "" {
		return v
	}
	return os.Getenv(name)
}

func ucsError(st C.ucs_status_t) string { return C.GoString(C.kvu_status(st)) }

var _ Fabric = (*UCX)(nil)

// Name returns "ucx".
func (u *UCX) Name() string { return "ucx" }

// Info describes what UCX opened.
func (u *UCX) Info() UCXInfo { return u.info }

// Close stops the progress goroutine and destroys the worker and the
// context. Every Region and Remote must be closed first.
func (u *UCX) Close() error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	u.closed = true
	close(u.ops)
	u.mu.Unlock()
	C.kvu_signal(u.c)
	<-u.done
	return nil
}

// run is the progress goroutine: it runs submitted operations, progresses
// the worker, completes requests, and sleeps on the worker's event
// descriptor when nothing is in flight.
func (u *UCX) run() {
	runtime.LockOSThread()
	defer close(u.done)
	open := true
	for open {
	drain:
		for {
			select {
			case op, ok := <-u.ops:
				if !ok {
					open = false
					break drain
				}
				op()
			default:
				break drain
			}
		}
		C.kvu_progress(u.c)
		u.pending = u.poll(u.pending)
		switch {
		case !open:
		case len(u.pending) > 0:
			C.kvu_wait(u.c, 1)
		default:
			C.kvu_wait(u.c, 100)
		}
	}
	// Requests still pending (reads of a dead owner over a transport
	// without peer failure detection) never end: their memory stays the
	// fabric's, as Remote.Read says.
	C.kvu_close(u.c)
}

// poll completes the finished requests of pending and returns those still
// in flight.
func (u *UCX) poll(pending []*ucxRequests) []*ucxRequests {
	out := pending[:0]
	for _, p := range pending {
		left := 0
		for i, r := range p.reqs {
			if r == nil {
				continue
			}
			st := C.kvu_check(r)
			if st == C.UCS_INPROGRESS {
				left++
				continue
			}
			p.reqs[i] = nil
			if st != C.UCS_OK && p.err == C.UCS_OK {
				p.err = st
			}
		}
		if left > 0 {
			out = append(out, p)
			continue
		}
		p.done(p.err)
	}
	clear(pending[len(out):])
	return out
}

// call runs fn on the progress thread and waits for it. fn may return
// requests for the thread to complete; call then waits for them too and
// returns their status.
func (u *UCX) call(fn func() *ucxRequests) (C.ucs_status_t, error) {
	done := make(chan C.ucs_status_t, 1)
	op := func() {
		p := fn()
		if p == nil {
			done <- C.UCS_OK
			return
		}
		p.done = func(st C.ucs_status_t) { done <- st }
		if !p.inflight() {
			done <- p.err
			return
		}
		u.submitPending(p)
	}
	if err := u.submit(op); err != nil {
		return C.UCS_OK, err
	}
	return <-done, nil
}

// submitPending hands requests to the progress loop, which completes
// them. Only operations (on the progress thread) call it.
func (u *UCX) submitPending(p *ucxRequests) { u.pending = append(u.pending, p) }

func (p *ucxRequests) inflight() bool {
	for _, r := range p.reqs {
		if r != nil {
			return true
		}
	}
	return false
}

// submit queues op for the progress thread and wakes it.
func (u *UCX) submit(op func()) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return ErrClosed
	}
	u.ops <- op
	C.kvu_signal(u.c)
	return nil
}

// ucxRegion is memory registered with UCX.
type ucxRegion struct {
	u    *UCX
	memh C.ucp_mem_h
	desc []byte
}

// Register registers mem (ucp_mem_map) and packs its remote key.
func (u *UCX) Register(mem []byte) (Region, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("transfer: UCX: register of no memory")
	}
	r := &ucxRegion{u: u}
	var st C.ucs_status_t
	_, err := u.call(func() *ucxRequests {
		if st = C.kvu_map(u.c, unsafe.Pointer(unsafe.SliceData(mem)), C.size_t(len(mem)), &r.memh); st != C.UCS_OK {
			return nil
		}
		var rkey unsafe.Pointer
		var n C.size_t
		if st = C.kvu_pack(u.c, r.memh, &rkey, &n); st != C.UCS_OK {
			C.kvu_unmap(u.c, r.memh)
			return nil
		}
		r.desc = encodeUCXDesc(ucxDesc{
			base:    uint64(uintptrOf(mem)),
			version: uint32(C.kvu_version()),
			worker:  C.GoBytes(u.c.addr, C.int(u.c.addr_len)),
			rkey:    C.GoBytes(rkey, C.int(n)),
		})
		C.kvu_pack_release(rkey)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if st != C.UCS_OK {
		return nil, fmt.Errorf("transfer: UCX: register %d bytes: %s", len(mem), ucsError(st))
	}
	return r, nil
}

func (r *ucxRegion) Descriptor() []byte { return r.desc }

func (r *ucxRegion) Close() error {
	var st C.ucs_status_t
	if _, err := r.u.call(func() *ucxRequests { st = C.kvu_unmap(r.u.c, r.memh); return nil }); err != nil {
		return err
	}
	if st != C.UCS_OK {
		return fmt.Errorf("transfer: UCX: deregister: %s", ucsError(st))
	}
	return nil
}

// ucxRemote is an endpoint to an owner's worker and the remote key of its
// window.
type ucxRemote struct {
	u          *UCX
	e          *C.kvu_ep // C memory: UCX keeps its address for the error handler
	base       uint64
	transports []string

	mu     sync.Mutex
	closed bool
}

// Connect creates an endpoint to the owner's worker and unpacks the
// window's remote key.
func (u *UCX) Connect(desc []byte) (Remote, error) {
	d, err := parseUCXDesc(desc)
	if err != nil {
		return nil, err
	}
	if v := uint32(C.kvu_version()); d.version != v {
		return nil, fmt.Errorf("%w: the owner runs UCX %s and this process %s: its worker address is not handed to this UCX",
			ErrUnsupported, ucxVersionString(d.version), ucxVersionString(v))
	}
	worker, rkey := C.CBytes(d.worker), C.CBytes(d.rkey)
	defer C.free(worker)
	defer C.free(rkey)
	r := &ucxRemote{u: u, e: (*C.kvu_ep)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvu_ep{})))), base: d.base}
	var st C.ucs_status_t
	var where string
	var info string
	_, err = u.call(func() *ucxRequests {
		// Peer failure detection where a transport has it (tcp, verbs);
		// UCX's shared-memory transports do not, and connect without.
		st = C.kvu_connect(u.c, worker, C.int(boolInt(u.network)), r.e)
		if st == C.UCS_ERR_UNREACHABLE && u.network {
			st = C.kvu_connect(u.c, worker, 0, r.e)
		}
		if st != C.UCS_OK {
			where = "create an endpoint to the owner's worker"
			return nil
		}
		if st = C.kvu_rkey(r.e, rkey); st != C.UCS_OK {
			where = "unpack the window's remote key"
			return r.closeLocked()
		}
		info = r.endpointInfo()
		return nil
	})
	if err == nil && st != C.UCS_OK {
		err = fmt.Errorf("transfer: UCX: %s: %s", where, ucsError(st))
	}
	if err != nil {
		C.free(unsafe.Pointer(r.e))
		return nil, err
	}
	r.transports = parseUCXLanes(info)
	return r, nil
}

func (r *ucxRemote) Transports() []string { return r.transports }

// endpointInfo is ucp_ep_print_info's text; on the progress thread.
func (r *ucxRemote) endpointInfo() string {
	var text [16 << 10]C.char
	n := C.kvu_ep_info(r.e, &text[0], C.size_t(len(text)))
	return C.GoStringN(&text[0], C.int(n))
}

// closeLocked starts a forced close of the endpoint, on the progress
// thread, and returns its request (nil: closed at once).
func (r *ucxRemote) closeLocked() *ucxRequests {
	req := C.kvu_close_ep(r.u.c, r.e, 1)
	p := &ucxRequests{}
	if req != nil {
		p.reqs = []unsafe.Pointer{req}
	}
	return p
}

// Read issues one ucp_get_nbx per span, on the progress thread, which
// calls done when all have completed.
func (r *ucxRemote) Read(local Region, spans []Span, done func(error)) error {
	reg, ok := local.(*ucxRegion)
	if !ok || reg.u != r.u {
		return fmt.Errorf("transfer: UCX: read into memory this fabric did not register")
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return fmt.Errorf("transfer: UCX: read through a closed endpoint: %w", ErrClosed)
	}
	finish := func(st C.ucs_status_t) {
		if st != C.UCS_OK {
			done(fmt.Errorf("transfer: UCX: get: %s", ucsError(st)))
			return
		}
		done(nil)
	}
	return r.u.submit(func() {
		p := &ucxRequests{done: finish}
		if st := r.e.failed; st != C.UCS_OK || r.e.ep == nil {
			if st == C.UCS_OK {
				st = C.UCS_ERR_CANCELED // closed meanwhile
			}
			finish(st)
			return
		}
		for _, s := range spans {
			var req unsafe.Pointer
			st := C.kvu_get(r.e, unsafe.Pointer(unsafe.SliceData(s.Dst)), C.size_t(len(s.Dst)), C.uint64_t(r.base+s.Off), reg.memh, &req)
			if st == C.UCS_INPROGRESS {
				p.reqs = append(p.reqs, req)
			} else if st != C.UCS_OK {
				p.err = st
				break
			}
		}
		if !p.inflight() {
			finish(p.err)
			return
		}
		r.u.submitPending(p)
	})
}

// Close closes the endpoint (forced: without waiting for the owner) and
// destroys the remote key once the endpoint's gets have completed.
func (r *ucxRemote) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	_, err := r.u.call(r.closeLocked)
	if err != nil {
		return err // the fabric is closed: so is the endpoint
	}
	r.u.call(func() *ucxRequests {
		C.kvu_rkey_destroy(r.e)
		C.free(unsafe.Pointer(r.e))
		return nil
	})
	return nil
}
