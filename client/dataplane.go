package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// The data-plane fast path. Block bytes travel over the node's data plane
// (package transfer) instead of the gRPC streams: through the node's shared
// memory when the client runs on the node's host (the node copies blocks
// into a region this process maps; no byte crosses a socket), else over its
// TCP data plane. The client learns where both are, and the node's host,
// from Members.
//
// The data plane serves the node's own tiers only. A get therefore asks it
// first and reads what it lacked through BatchGet, which reaches the rest of
// the cluster; a put stores blocks on the node through it and publishes
// them in the same round trip (a publish request, which carries each
// block's chunk key), so that the node pushes them to their owners. A node
// without publish requests fails the transport: the put goes to BatchPut.
// Any failure of a transport moves the call to the next one (shared memory,
// TCP, gRPC); a transport that failed is left alone for a while.

// windowBytes bounds the encoded block bytes of one data-plane request, and
// so what a call holds at once (of a shared region, or of the TCP client's
// in-flight budget).
const windowBytes = 32 << 20

// retryAfter is how long a transport that failed is not used.
const retryAfter = 2 * time.Second

// dataPlane holds the client's data-plane connections to its node.
type dataPlane struct {
	c   *Client
	shm bool // shared memory may be used (TransportAuto)

	mu struct {
		sync.Mutex
		shmc               *transfer.ShmClient
		shmPath            string
		tcp                *transfer.Client
		tcpAddr            string
		shmUntil, tcpUntil time.Time // not used before
		closed             bool
	}
}

// transport is one way to the node's data plane.
type transport struct {
	name string // "shm" or "tcp"
	peer dataPeer
	full bool // verify payload checksums of what it reads
	// inPlace: it reads whole blocks in place (the node's DRAM arena), so a
	// part is cut here from the whole block rather than copied out and
	// checksummed by the node.
	inPlace bool
}

// transports returns the usable data-plane transports, best first: none when
// the node serves no data plane or they all failed recently.
func (d *dataPlane) transports(ctx context.Context) []transport {
	ni, err := d.c.nodeInfo(ctx)
	if err != nil {
		return nil
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.closed {
		return nil
	}
	var out []transport
	if d.shm && ni.shmSocket != "" && ni.hostID != "" && ni.hostID == localHostID() && !now.Before(d.mu.shmUntil) {
		if d.mu.shmc == nil || d.mu.shmPath != ni.shmSocket {
			if d.mu.shmc != nil {
				d.mu.shmc.Close()
				d.mu.shmc = nil
			}
			// A unix socket on this host answers at once or not at all.
			if c, err := transfer.DialShm(ctx, ni.shmSocket, &transfer.ShmClientOptions{Token: d.c.opts.Token}); err == nil {
				d.mu.shmc, d.mu.shmPath = c, ni.shmSocket
			} else {
				d.mu.shmUntil = now.Add(retryAfter)
			}
		}
		if d.mu.shmc != nil {
			out = append(out, transport{name: "shm", peer: d.mu.shmc, full: d.c.opts.VerifySharedMemory, inPlace: d.mu.shmc.InPlace()})
		}
	}
	if ni.dataAddr != "" && !now.Before(d.mu.tcpUntil) {
		if d.mu.tcp == nil || d.mu.tcpAddr != ni.dataAddr {
			if d.mu.tcp != nil {
				d.mu.tcp.Close()
				d.mu.tcp = nil
			}
			// Connects on first use, as the gRPC connection does: TLS
			// and token alike.
			c, err := transfer.NewClient(ni.dataAddr, &transfer.ClientOptions{TLS: d.c.opts.TLS, Token: d.c.opts.Token})
			if err != nil {
				d.mu.tcpUntil = now.Add(retryAfter)
				return out
			}
			d.mu.tcp, d.mu.tcpAddr = c, ni.dataAddr
		}
		out = append(out, transport{name: "tcp", peer: d.mu.tcp, full: true})
	}
	return out
}

// failed closes a transport that failed, leaves it alone for retryAfter and
// has the node asked again where its data plane is (it may have restarted).
func (d *dataPlane) failed(t transport) {
	d.mu.Lock()
	switch {
	case t.name == "shm" && d.mu.shmc != nil && dataPeer(d.mu.shmc) == t.peer:
		d.mu.shmc.Close()
		d.mu.shmc = nil
		d.mu.shmUntil = time.Now().Add(retryAfter)
	case t.name == "tcp" && d.mu.tcp != nil && dataPeer(d.mu.tcp) == t.peer:
		d.mu.tcp.Close()
		d.mu.tcp = nil
		d.mu.tcpUntil = time.Now().Add(retryAfter)
	}
	d.mu.Unlock()
	d.c.forgetNodeInfo()
}

func (d *dataPlane) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.closed = true
	if d.mu.shmc != nil {
		d.mu.shmc.Close()
	}
	if d.mu.tcp != nil {
		d.mu.tcp.Close()
	}
}

// dataBulk moves block bytes over the data plane, and over grpc for what the
// data plane lacks or when it fails.
type dataBulk struct {
	c    *Client
	dp   *dataPlane
	grpc *grpcBulk
}

// windowOf returns how many blocks of ns one data-plane request carries.
func windowOf(ns prefixhash.Namespace) int {
	return max(1, windowBytes/block.EncodedLen(ns.BlockTokens, recordBytes(ns)))
}

func (d *dataBulk) get(ctx context.Context, ns prefixhash.Namespace, part block.Part, keys, chunkKeys []prefixhash.Key, prefix, fresh bool, fn func(Block) error) error {
	ts := d.dp.transports(ctx)
	if len(ts) == 0 {
		return d.grpc.get(ctx, ns, part, keys, chunkKeys, prefix, fresh, fn)
	}
	win := windowOf(ns)
	for lo := 0; lo < len(keys); lo += win {
		hi := min(lo+win, len(keys))
		var cks []prefixhash.Key
		if chunkKeys != nil {
			cks = chunkKeys[lo:hi]
		}
		stop, err := d.getWindow(ctx, &ts, ns, part, lo, keys[lo:hi], cks, prefix, fresh, fn)
		if err != nil || stop {
			return err
		}
	}
	return nil
}

// getWindow reads keys, the request's keys from index base on: from the
// node's tiers over the first transport that answers, then what they lacked
// through BatchGet, delivering blocks to fn in key order. It reports stop
// when prefix is set and a miss ended the read. part, when not zero, is the
// part of each block read: the data plane reads it alone (GetParts), BatchGet
// reads the whole block and the part is cut from it.
func (d *dataBulk) getWindow(ctx context.Context, ts *[]transport, ns prefixhash.Namespace, part block.Part, base int, keys, chunkKeys []prefixhash.Key,
	prefix, fresh bool, fn func(Block) error) (stop bool, err error) {
	// Through the node's arena a whole block costs no copy: the part is
	// cut from it here (one copy of the part's bytes), where the node
	// would copy it out and checksum it.
	read, cut := part, part != (block.Part{}) && len(*ts) > 0 && (*ts)[0].inPlace
	if cut {
		read = block.Part{}
	}
	r, t := d.dataGet(ctx, ts, read, keys)
	if r == nil {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		stopped := false
		err := d.grpc.get(ctx, ns, part, keys, chunkKeys, prefix, fresh, func(b Block) error {
			stopped = prefix && !b.Found
			b.Index += base
			return fn(b)
		})
		return stopped, err
	}
	defer r.Release()

	local := make([]Block, len(keys))
	var missing []int
	for i, k := range keys {
		if r.Status[i] == transfer.StatusOK {
			if b, ok := d.check(ns, read, k, r.Values[i], t.full); ok {
				if cut {
					lay := block.LayoutOf(ns)
					b.Payload = lay.ExtractPart(make([]byte, 0, lay.PartLen(ns.BlockTokens, part)), b.Payload, ns.BlockTokens, part)
				}
				local[i] = b
				continue
			}
		}
		missing = append(missing, i)
	}
	next := 0 // keys[:next] are delivered
	deliver := func(upTo int) error {
		for ; next < upTo; next++ {
			b := local[next]
			b.Index = base + next
			if fresh {
				if !cut { // a cut part is a copy already
					b.Payload = append([]byte(nil), b.Payload...)
				}
				b.Tokens = append([]uint32(nil), b.Tokens...) // they view the read block
			}
			if err := fn(b); err != nil {
				return err
			}
		}
		return nil
	}
	if len(missing) > 0 {
		mk := make([]prefixhash.Key, len(missing))
		var mck []prefixhash.Key
		if chunkKeys != nil {
			mck = make([]prefixhash.Key, len(missing))
		}
		for j, i := range missing {
			mk[j] = keys[i]
			if mck != nil {
				mck[j] = chunkKeys[i]
			}
		}
		err := d.grpc.get(ctx, ns, part, mk, mck, prefix, fresh, func(b Block) error {
			i := missing[b.Index]
			if err := deliver(i); err != nil {
				return err
			}
			next = i + 1
			stop = prefix && !b.Found
			b.Index = base + i
			return fn(b)
		})
		if err != nil || stop {
			return stop, err
		}
	}
	return false, deliver(len(keys))
}

// dataGet reads keys (part of each, when part is not zero) over the first
// transport that answers, dropping the ones that fail from ts. It returns
// nil when none answered.
func (d *dataBulk) dataGet(ctx context.Context, ts *[]transport, part block.Part, keys []prefixhash.Key) (*transfer.Result, transport) {
	var parts []block.Part
	if part != (block.Part{}) {
		parts = make([]block.Part, len(keys))
		for i := range parts {
			parts[i] = part
		}
	}
	for len(*ts) > 0 {
		t := (*ts)[0]
		var r *transfer.Result
		var err error
		if parts == nil {
			r, err = t.peer.Get(ctx, keys)
		} else if pp, ok := t.peer.(transfer.PartPeer); ok {
			r, err = pp.GetParts(ctx, keys, parts)
		} else {
			err = transfer.ErrUnsupported
		}
		if err == nil {
			return r, t
		}
		if ctx.Err() != nil {
			return nil, t
		}
		if !errors.Is(err, transfer.ErrUnsupported) {
			d.dp.failed(t)
		}
		*ts = (*ts)[1:]
	}
	return nil, transport{}
}

// check verifies a block read from the data plane: its header (checksum;
// key = H(parent ‖ tokens), the key asked for; the namespace and its
// layout; the part asked for, the whole block when part is zero), its
// length and, when full, its payload checksum. A block that fails is a miss
// here (BatchGet then asks the cluster).
func (d *dataBulk) check(ns prefixhash.Namespace, part block.Part, key prefixhash.Key, b []byte, full bool) (Block, bool) {
	h, err := block.DecodeHeader(b, d.c.opts.MaxBlockBytes)
	if err != nil || h.Key != key || h.CheckNamespace(ns) != nil {
		return Block{}, false
	}
	if part == (block.Part{}) {
		part = h.Layout.Whole()
	}
	if h.Part != part {
		return Block{}, false
	}
	hl := h.Len
	if len(b) != hl+h.PayloadLen {
		return Block{}, false
	}
	payload := b[hl:]
	if full && xxhash.Sum64(payload) != h.Checksum {
		return Block{}, false
	}
	blk := Block{Key: key, Found: true, Parent: h.Parent, Tokens: h.Tokens, Payload: payload}
	if h.Group.Set {
		blk.Group = h.Group.Index
	}
	return blk, true
}

func (d *dataBulk) put(ctx context.Context, ns prefixhash.Namespace, items []putItem) ([]prefixhash.Key, error) {
	ts := d.dp.transports(ctx)
	if len(ts) == 0 {
		return d.grpc.put(ctx, ns, items)
	}
	sess, err := d.c.Session(ctx)
	if err != nil {
		return nil, err
	}
	win := windowOf(ns)
	hl := block.HeaderLen(ns.BlockTokens)
	// Only the blocks' headers are encoded here: the transport sends each
	// header and then its payload from the caller's memory (one vectored
	// write), so a put copies no payload byte before the socket.
	hbuf := make([]byte, 0, min(len(items), win)*hl)
	heads := make([][]byte, 0, min(len(items), win))
	keys := make([]prefixhash.Key, len(items))
	chunks := make([]prefixhash.Key, len(items))
	var rest []int // items left to gRPC
	for lo := 0; lo < len(items); lo += win {
		hi := min(lo+win, len(items))
		hbuf, heads = hbuf[:0], heads[:0]
		for j, it := range items[lo:hi] {
			start := len(hbuf)
			var err error
			// The node stores a tenant's blocks only with its tag.
			var link prefixhash.Link
			switch {
			case it.group >= 0:
				hbuf, link, err = block.AppendGroupHeader(hbuf, sess.Tag, ns, it.group, it.parent, it.tokens, it.extra, itemPart(ns, it), it.payload)
			case it.part == (block.Part{}):
				hbuf, link, err = block.AppendHeaderExt(hbuf, sess.Tag, ns, it.parent, it.tokens, it.extra, it.payload)
			default:
				hbuf, link, err = block.AppendPartHeaderExt(hbuf, sess.Tag, ns, it.parent, it.tokens, it.extra, it.part, it.payload)
			}
			if err != nil {
				return nil, fmt.Errorf("%w: block %d: %w", ErrInvalid, lo+j, err)
			}
			keys[lo+j] = link.Key()
			if it.group >= 0 {
				keys[lo+j] = prefixhash.GroupKey(keys[lo+j], it.group)
			}
			heads = append(heads, hbuf[start:len(hbuf):len(hbuf)])
			if chunks[lo+j] = it.chunk; it.chunk.IsZero() {
				chunks[lo+j] = keys[lo+j] // unknown: the block is taken to start a chunk, as BatchPut does
			}
		}
		st := d.dataPut(ctx, &ts, keys[lo:hi], chunks[lo:hi], heads, items[lo:hi])
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for j := range heads {
			it := &items[lo+j]
			switch {
			case st != nil && st[j] == transfer.StatusOK:
			case st != nil && st[j] == transfer.StatusConflict:
				return nil, &PartConflictError{Key: it.key, Part: it.part}
			case it.part != (block.Part{}):
				// BatchPut carries whole blocks only: the next data-plane
				// transport is the part's way out.
				if err := d.putPartNext(ctx, ts, keys[lo+j], chunks[lo+j], heads[j], it, st, j); err != nil {
					return nil, err
				}
			default:
				// The node dropped it (full?) or could not publish it:
				// BatchPut stores and publishes it, or says why not.
				rest = append(rest, lo+j)
			}
		}
	}
	if len(rest) > 0 {
		sub := make([]putItem, len(rest))
		for j, i := range rest {
			sub[j] = items[i]
		}
		got, err := d.grpc.put(ctx, ns, sub)
		if err != nil {
			return nil, err
		}
		for j, i := range rest {
			keys[i] = got[j]
		}
	}
	return keys, nil
}

// putPartNext sends it, a part the transport ts[0] did not store (st[j]
// says why; st is nil when no transport took it), over the next transport
// in ts: TCP after shared memory, where a put takes a slot of the part's
// size in the node's arena besides the whole block's slot the node
// assembles parts in, and so may find no room where TCP does.
func (d *dataBulk) putPartNext(ctx context.Context, ts []transport, key, chunk prefixhash.Key, head []byte, it *putItem, st []transfer.Status, j int) error {
	if st != nil && st[j] != transfer.StatusError && len(ts) > 1 {
		next := ts[1:]
		if s := d.dataPut(ctx, &next, []prefixhash.Key{key}, []prefixhash.Key{chunk}, [][]byte{head}, []putItem{*it}); s != nil {
			st, j = s, 0
		}
	}
	switch {
	case st != nil && st[j] == transfer.StatusOK:
		return nil
	case st != nil && st[j] == transfer.StatusConflict:
		return &PartConflictError{Key: it.key, Part: it.part}
	}
	return partRefused(it, st, j)
}

// dataPeer is a data-plane transport: transfer.Client or ShmClient. Besides
// gets, it stores and publishes blocks in one round trip, each sent as its
// header and then its payload.
type dataPeer interface {
	transfer.Peer
	PutPublish(ctx context.Context, keys, chunkKeys []prefixhash.Key, heads, vals [][]byte) ([]transfer.Status, error)
}

// dataPut stores and publishes one window, the blocks of items with their
// encoded headers heads, over the first transport that takes it, dropping
// the ones that fail from ts. It returns nil when no transport took the
// window.
func (d *dataBulk) dataPut(ctx context.Context, ts *[]transport, keys, chunkKeys []prefixhash.Key, heads [][]byte, items []putItem) []transfer.Status {
	payloads := make([][]byte, len(items))
	for i, it := range items {
		payloads[i] = it.payload
	}
	for len(*ts) > 0 {
		t := (*ts)[0]
		st, err := t.peer.PutPublish(ctx, keys, chunkKeys, heads, payloads)
		if err == nil {
			return st
		}
		if ctx.Err() != nil {
			return nil
		}
		d.dp.failed(t)
		*ts = (*ts)[1:]
	}
	return nil
}
