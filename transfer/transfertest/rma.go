package transfertest

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// RMA returns the one-sided path, named name: the values copied into an
// arena that owner registers as a Window (as a node registers its DRAM
// arena), a TCP Server granting leases on them, and an RMAClient reading
// them through reader into its landing region. owner and reader are two
// fabrics (for UCX, two workers: two contexts of this process). A batch is
// one Get of a window, as for TCP.
func (tb *Testbed) RMA(name string, owner, reader transfer.Fabric) (Path, error) {
	n := 0
	for _, v := range tb.vals {
		n += alignUp(len(v))
	}
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return Path{}, fmt.Errorf("transfertest: map the window: %w", err)
	}
	tb.onClose(func() error { return unix.Munmap(mem) })
	src := make(testbedSource, len(tb.vals))
	off := 0
	for i, v := range tb.vals {
		src[tb.keys[i]] = mem[off : off+len(v) : off+len(v)]
		copy(mem[off:], v)
		off += alignUp(len(v))
	}
	win, err := transfer.Expose(owner, mem)
	if err != nil {
		return Path{}, err
	}
	tb.onClose(win.Close)
	addr, err := tb.serve(src, &transfer.ServerOptions{Window: win})
	if err != nil {
		return Path{}, err
	}
	rma, err := transfer.NewRMA(reader, &transfer.RMAOptions{LandingBytes: int64(alignPage(2 * tb.per * tb.opts.ValueBytes)), Logger: quietLogger})
	if err != nil {
		return Path{}, err
	}
	tb.onClose(rma.Close)
	c, err := rma.Client(addr)
	if err != nil {
		return Path{}, err
	}
	tb.onClose(c.Close)
	p := tb.getPath(name, c)
	// The first Get connects; a Get that read nothing one-sidedly means
	// the path measures TCP: refuse it.
	r, err := c.Get(context.Background(), []prefixhash.Key{tb.keys[0]})
	if err != nil {
		return Path{}, err
	}
	r.Release()
	if st := rma.Stats(); st.Reads != 1 {
		return Path{}, fmt.Errorf("transfertest: %s read nothing one-sidedly (%+v)", name, st)
	}
	return p, nil
}

func alignUp(n int) int   { return (n + 63) &^ 63 }
func alignPage(n int) int { return (n + 4095) &^ 4095 }
