package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/transfer"
)

// Objects (issue 33): opaque bytes under a name of the caller's in a
// namespace, beside its prefix-chained blocks (Mooncake Store's objects),
// named by a Prompt's Names: Put stores them, Get reads them, Remove
// removes them, Retain pins or leases them.
// The client encodes each object as object records (block.EncodeObject),
// one per piece of at most PieceBytes, keyed from the name
// (prefixhash.ObjectKey, PieceKey), and moves them as it moves blocks:
// through the node's shared memory or TCP data plane, each record published
// to the owners of its key; over ObjectService's streams when neither
// works, and for what the node it talks to lacks.
//
// A put writes an object's pieces after the first and then its first
// piece, which commits it: a reader that finds piece 0 finds the others,
// unless they were evicted since; it then reports a miss and removes the
// remains, so that the next put stores the object whole again. Pieces carry
// the writer's random generation: a reader never joins pieces of two puts.
// Putting a name already held keeps the value held (Mooncake's put);
// Upsert replaces it (a remove, then a put).
//
// Put and Get of objects report per object: an object refused (a bad name,
// over the quota) is an entry of ItemErrors, the others are stored or read.

// DefaultPieceBytes is the largest piece an object is cut into.
const DefaultPieceBytes = 4 << 20

// objectValue is one object read: Found false for a miss. Value is valid
// only during the callback (it may alias the node's shared memory).
type objectValue struct {
	Index int
	Name  string
	Found bool
	Value []byte
}

// Retention makes Put of objects (Prompt.Names) ask their owners to keep
// them: a pin, a lease (a TTL without a pin). It is applied as each piece
// is stored, and bounded by the node (ResourceExhausted past its share of
// pinned bytes or the namespace's quota; InvalidArgument for a TTL over its
// limit). Retain changes it later.
func Retention(r block.Retention) CallOption {
	return CallOption{name: "Retention", verbs: "put", apply: func(o *callOptions) { o.retention = r }}
}

// Upsert makes Put of objects replace what a name holds, instead of
// keeping it (Mooncake's put keeps it).
func Upsert() CallOption {
	return CallOption{name: "Upsert", verbs: "put", apply: func(o *callOptions) { o.upsert = true }}
}

// PieceBytes sets the largest piece (payload bytes) Put cuts objects into;
// it must leave room for the record's header within the node's
// max_block_bytes. Default DefaultPieceBytes.
func PieceBytes(n int) CallOption {
	return CallOption{name: "PieceBytes", verbs: "put", apply: func(o *callOptions) { o.pieceBytes = n }}
}

// ItemErrors is the error of a call about objects that failed for some of
// them and not the others: one entry per object of the Prompt's Names, nil
// where it succeeded. errors.Is and errors.As see every entry.
type ItemErrors []error

func (e ItemErrors) Error() string {
	n, first := 0, error(nil)
	for _, err := range e {
		if err != nil {
			if n++; first == nil {
				first = err
			}
		}
	}
	if n == 1 {
		return first.Error()
	}
	return fmt.Sprintf("%d of %d objects failed; the first: %v", n, len(e), first)
}

// Unwrap returns the entries that are errors.
func (e ItemErrors) Unwrap() []error {
	var out []error
	for _, err := range e {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// itemErrors returns errs as ItemErrors, or nil when none failed.
func itemErrors(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return ItemErrors(errs)
		}
	}
	return nil
}

// objRecord is one piece to put: its key and encoded header; the payload
// is the caller's.
type objRecord struct {
	obj     int // index of its object
	key     prefixhash.Key
	head    []byte
	payload []byte
}

// putObjects is Put of objects: values[i] under names[i]. It returns each
// object's key (zero for one refused) and, when some were refused,
// ItemErrors; another error is the call's (a bad namespace or option, the
// node unreachable).
func (c *Client) putObjects(ctx context.Context, ns prefixhash.Namespace, names []string, values [][]byte, o callOptions) ([]prefixhash.Key, error) {
	if o.pieceBytes == 0 {
		o.pieceBytes = DefaultPieceBytes
	}
	switch {
	case len(values) != len(names):
		return nil, fmt.Errorf("%w: Put of %d objects with %d values", ErrInvalid, len(names), len(values))
	case o.pieceBytes < 1 || o.pieceBytes > c.opts.MaxBlockBytes-block.ObjectHeaderLen(prefixhash.MaxObjectName):
		return nil, fmt.Errorf("%w: PieceBytes %d must be positive and leave room for a header within MaxBlockBytes (%d)", ErrInvalid, o.pieceBytes, c.opts.MaxBlockBytes)
	}
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	sess, err := c.Session(ctx)
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(names))
	var rest, first []objRecord // pieces 1.. of every object; then each piece 0
	for i, name := range names {
		value := values[i]
		if err := prefixhash.CheckObjectName(name); err != nil {
			errs[i] = fmt.Errorf("%w: object %d: %w", ErrInvalid, i, err)
			continue
		}
		pieces := max(1, (len(value)+o.pieceBytes-1)/o.pieceBytes)
		if pieces > block.MaxPieces {
			errs[i] = fmt.Errorf("%w: object %q: %d bytes is more than %d pieces", ErrInvalid, name, len(value), block.MaxPieces)
			continue
		}
		gen := rand.Uint64()
		for j := range pieces {
			p := value[min(j*o.pieceBytes, len(value)):min((j+1)*o.pieceBytes, len(value))]
			head, key, err := block.AppendObjectHeader(nil, sess.Tag, ns, block.Object{Name: name, Piece: j, Pieces: pieces,
				Size: uint64(len(value)), Generation: gen, Retention: o.retention}, p)
			if err != nil {
				errs[i] = fmt.Errorf("%w: object %q: %w", ErrInvalid, name, err)
				break
			}
			r := objRecord{obj: i, key: key, head: head, payload: p}
			if j == 0 {
				first = append(first, r)
			} else {
				rest = append(rest, r)
			}
		}
	}
	if o.upsert {
		var replaced []string
		for i, name := range names {
			if errs[i] == nil {
				replaced = append(replaced, name)
			}
		}
		if _, err := c.removeObjectKeys(ctx, ns, replaced); err != nil {
			return nil, err
		}
	}
	if err := c.putRecords(ctx, rest, errs); err != nil {
		return nil, err
	}
	var commit []objRecord
	for _, r := range first {
		if errs[r.obj] == nil { // its other pieces are stored
			commit = append(commit, r)
		}
	}
	if err := c.putRecords(ctx, commit, errs); err != nil {
		return nil, err
	}
	keys := make([]prefixhash.Key, len(names))
	root := ns.Root()
	for i, name := range names {
		if errs[i] == nil {
			keys[i] = prefixhash.ObjectKey(root, name)
		}
	}
	return keys, itemErrors(errs)
}

// putRecords stores recs through the data plane, then what it did not take
// through ObjectService.Put, setting errs[rec.obj] for the records refused.
func (c *Client) putRecords(ctx context.Context, recs []objRecord, errs []error) error {
	var left []objRecord
	var ts []transport
	if c.dp != nil && len(recs) > 0 {
		ts = c.dp.transports(ctx)
	}
	for lo := 0; lo < len(recs); {
		if len(ts) == 0 {
			left = append(left, recs[lo:]...)
			break
		}
		hi, bytes := lo, 0
		for hi < len(recs) && (hi == lo || bytes+len(recs[hi].head)+len(recs[hi].payload) <= windowBytes) && hi-lo < c.opts.MaxBatchBlocks {
			bytes += len(recs[hi].head) + len(recs[hi].payload)
			hi++
		}
		win := recs[lo:hi]
		keys := make([]prefixhash.Key, len(win))
		heads, vals := make([][]byte, len(win)), make([][]byte, len(win))
		for j, r := range win {
			keys[j], heads[j], vals[j] = r.key, r.head, r.payload
		}
		var st []transfer.Status
		for len(ts) > 0 {
			var err error
			// An object record is its own placement chunk.
			if st, err = ts[0].peer.PutPublish(ctx, keys, keys, heads, vals); err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.dp.failed(ts[0])
			ts = ts[1:]
		}
		for j, r := range win {
			if st == nil || st[j] != transfer.StatusOK {
				left = append(left, r) // ObjectService says why, or stores it
			}
		}
		lo = hi
	}
	if len(left) == 0 {
		return nil
	}
	for lo := 0; lo < len(left); lo += c.opts.MaxBatchBlocks {
		batch := left[lo:min(len(left), lo+c.opts.MaxBatchBlocks)]
		var results []*kvmeshv1.ObjectResult
		err := c.retry(ctx, func(ctx context.Context) (err error) {
			results, err = c.grpcPutRecords(ctx, batch)
			return err
		})
		if err != nil {
			return callError("put objects", err)
		}
		if len(results) != len(batch) {
			return fmt.Errorf("client: put objects: %d results for %d records", len(results), len(batch))
		}
		for j, res := range results {
			if res.GetStatus() != kvmeshv1.ItemStatus_ITEM_STATUS_OK && errs[batch[j].obj] == nil {
				errs[batch[j].obj] = itemError(res)
			}
		}
	}
	return nil
}

// itemError turns a refused item into an error matching the sentinel of its
// class.
func itemError(res *kvmeshv1.ObjectResult) error {
	class := ErrInvalid
	switch res.GetStatus() {
	case kvmeshv1.ItemStatus_ITEM_STATUS_NO_ROOM:
		class = ErrExhausted
	case kvmeshv1.ItemStatus_ITEM_STATUS_DENIED:
		class = ErrPermission
	}
	return fmt.Errorf("%w: %s", class, res.GetMessage())
}

// grpcPutRecords sends recs on one ObjectService.Put stream.
func (c *Client) grpcPutRecords(ctx context.Context, recs []objRecord) ([]*kvmeshv1.ObjectResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.objects.Put(ctx)
	if err != nil {
		return nil, err
	}
	chunk := max(1, c.opts.MaxMessageBytes-64<<10)
	for i, r := range recs {
		n := uint64(len(r.head) + len(r.payload))
		off := 0
		for _, part := range [][]byte{r.head, r.payload} {
			for len(part) > 0 || (off == 0 && n == 0) {
				k := min(len(part), chunk)
				msg := &kvmeshv1.ObjectServicePutRequest{Index: uint32(i), Offset: uint64(off), Data: part[:k]}
				if off == 0 {
					msg.RecordLen = n
				}
				if err := stream.Send(msg); err != nil {
					return nil, grpcStreamErr(stream.CloseAndRecv, err)
				}
				off += k
				part = part[k:]
			}
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetResults(), nil
}

// grpcStreamErr returns the stream's own status when Send failed with EOF.
func grpcStreamErr(closeAndRecv func() (*kvmeshv1.ObjectServicePutResponse, error), err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := closeAndRecv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// getObjects is Get of objects: one Block per name, in order, a miss with
// Found false; its Key is the object's key (its first piece's), its Payload
// the whole value. With Each the blocks go to the callback (the Payload
// valid during it only); with Into the values are copied into the
// caller's buffers, dst[i] for names[i], and a value longer than its
// buffer is an entry of ItemErrors (the others are read).
func (c *Client) getObjects(ctx context.Context, ns prefixhash.Namespace, names []string, o callOptions) ([]Block, error) {
	if o.intoSet && len(o.into) < len(names) {
		return nil, fmt.Errorf("%w: Into has %d buffers for %d objects", ErrInvalid, len(o.into), len(names))
	}
	var out []Block
	var errs []error
	err := c.eachObject(ctx, ns, names, func(v objectValue) error {
		b := Block{Index: v.Index, Key: prefixhash.ObjectKey(ns.Root(), v.Name), Found: v.Found}
		switch {
		case !v.Found:
		case o.each != nil:
			b.Payload = v.Value
			return o.each(b)
		case o.intoSet && len(v.Value) > len(o.into[v.Index]):
			if errs == nil {
				errs = make([]error, len(names))
			}
			errs[v.Index] = fmt.Errorf("%w: object %q is %d bytes, its buffer %d", ErrInvalid, v.Name, len(v.Value), len(o.into[v.Index]))
			b.Found = false
		case o.intoSet:
			b.Payload = o.into[v.Index][:copy(o.into[v.Index], v.Value)]
		default:
			b.Payload = append([]byte(nil), v.Value...)
		}
		if o.each == nil {
			out = append(out, b)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, itemErrors(errs)
}

// eachObject reads the objects names of ns and calls fn for each, in
// order, misses included (Found false). v.Value is valid only during fn. An
// error from fn ends the call and is returned.
func (c *Client) eachObject(ctx context.Context, ns prefixhash.Namespace, names []string, fn func(v objectValue) error) error {
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return err
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	for lo := 0; lo < len(names); lo += c.opts.MaxBatchBlocks {
		batch := names[lo:min(len(names), lo+c.opts.MaxBatchBlocks)]
		if err := c.getObjectBatch(ctx, ns, lo, batch, fn); err != nil {
			return err
		}
	}
	return nil
}

func (c *Client) getObjectBatch(ctx context.Context, ns prefixhash.Namespace, base int, names []string, fn func(objectValue) error) error {
	root := ns.Root()
	keys := make([]prefixhash.Key, len(names))
	for i, name := range names {
		if err := prefixhash.CheckObjectName(name); err != nil {
			return fmt.Errorf("%w: name %d: %w", ErrInvalid, base+i, err)
		}
		keys[i] = prefixhash.ObjectKey(root, name)
	}
	var broken []string
	err := c.readRecords(ctx, keys, func(i int, rec []byte, full bool) error {
		v := objectValue{Index: base + i, Name: names[i]}
		var h block.Header
		if rec != nil {
			h, _ = c.checkRecord(ns, names[i], 0, keys[i], rec, full)
		}
		if h.Kind != block.KindObject {
			return fn(v)
		}
		if h.Object.Pieces == 1 {
			v.Found, v.Value = true, rec[h.Len:]
			return fn(v)
		}
		value, ok, err := c.joinPieces(ctx, ns, names[i], keys[i], h, rec[h.Len:])
		if err != nil {
			return err
		}
		if !ok {
			broken = append(broken, names[i])
		}
		v.Found, v.Value = ok, value
		return fn(v)
	})
	if err != nil {
		return err
	}
	if len(broken) > 0 {
		// Pieces evicted or of another put: remove the remains, so that
		// the next put stores the object whole.
		c.removeObjectKeys(ctx, ns, broken)
	}
	return nil
}

// joinPieces reads pieces 1.. of the object whose piece 0 (header h,
// payload first) was read, and returns the whole value; ok is false when a
// piece is missing or of another put.
func (c *Client) joinPieces(ctx context.Context, ns prefixhash.Namespace, name string, key prefixhash.Key, h block.Header, first []byte) ([]byte, bool, error) {
	value := make([]byte, 0, h.Object.Size)
	value = append(value, first...)
	keys := make([]prefixhash.Key, h.Object.Pieces-1)
	for j := range keys {
		keys[j] = prefixhash.PieceKey(key, j+1)
	}
	ok := true
	err := c.readRecords(ctx, keys, func(j int, rec []byte, full bool) error {
		if !ok || rec == nil {
			ok = false
			return nil
		}
		ph, err := c.checkRecord(ns, name, j+1, keys[j], rec, full)
		if err != nil || ph.Object.Generation != h.Object.Generation || ph.Object.Pieces != h.Object.Pieces || ph.Object.Size != h.Object.Size {
			ok = false
			return nil
		}
		value = append(value, rec[ph.Len:]...)
		return nil
	})
	if err != nil || !ok || uint64(len(value)) != h.Object.Size {
		return nil, false, err
	}
	return value, true, nil
}

// checkRecord verifies rec, read under key, as piece piece of object name
// of ns: its header, length, name and piece, and (full) its payload
// checksum.
func (c *Client) checkRecord(ns prefixhash.Namespace, name string, piece int, key prefixhash.Key, rec []byte, full bool) (block.Header, error) {
	h, err := block.DecodeHeader(rec, c.opts.MaxBlockBytes)
	switch {
	case err != nil:
	case h.Key != key || len(rec) != h.Len+h.PayloadLen:
		err = fmt.Errorf("%w: record of %d bytes under %s", block.ErrCorrupt, len(rec), key)
	default:
		err = h.CheckObject(ns, name, piece)
	}
	if err == nil && full && xxhash.Sum64(rec[h.Len:]) != h.Checksum {
		err = fmt.Errorf("%w: payload checksum", block.ErrCorrupt)
	}
	if err != nil {
		c.refused.Add(1)
		return block.Header{}, err
	}
	return h, nil
}

// readRecords reads keys through the data plane, then what it lacked
// through ObjectService.Get, and calls fn for each in order with the record
// (nil: a miss), valid during fn only; full says whether its payload still
// needs its checksum checked.
func (c *Client) readRecords(ctx context.Context, keys []prefixhash.Key, fn func(i int, rec []byte, full bool) error) error {
	var r *transfer.Result
	var t transport
	if c.dp != nil {
		ts := c.dp.transports(ctx)
		for len(ts) > 0 && r == nil {
			var err error
			if r, err = ts[0].peer.Get(ctx, keys); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				c.dp.failed(ts[0])
				r, ts = nil, ts[1:]
				continue
			}
			t = ts[0]
		}
	}
	if r != nil {
		defer r.Release()
	}
	var missing []int
	for i := range keys {
		if r == nil || r.Status[i] != transfer.StatusOK {
			missing = append(missing, i)
		}
	}
	remote := map[int][]byte{}
	if len(missing) > 0 {
		mk := make([]prefixhash.Key, len(missing))
		for j, i := range missing {
			mk[j] = keys[i]
		}
		err := c.retry(ctx, func(ctx context.Context) error {
			return c.grpcGetRecords(ctx, mk, func(j int, rec []byte) { remote[missing[j]] = rec })
		})
		if err != nil {
			return callError("get objects", err)
		}
	}
	for i := range keys {
		if rec, ok := remote[i]; ok {
			if err := fn(i, rec, true); err != nil {
				return err
			}
			continue
		}
		var rec []byte
		if r != nil && r.Status[i] == transfer.StatusOK {
			rec = r.Values[i]
		}
		if err := fn(i, rec, t.full); err != nil {
			return err
		}
	}
	return nil
}

// grpcGetRecords reads keys over ObjectService.Get and calls fn for each
// record found (a fresh slice).
func (c *Client) grpcGetRecords(ctx context.Context, keys []prefixhash.Key, fn func(i int, rec []byte)) error {
	req := &kvmeshv1.ObjectServiceGetRequest{Keys: make([][]byte, len(keys))}
	for i := range keys {
		req.Keys[i] = keys[i][:]
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.objects.Get(ctx, req)
	if err != nil {
		return err
	}
	var rec []byte
	cur := -1
	for {
		f, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		i := int(f.GetIndex())
		if i >= len(keys) || i < cur || i == cur && rec == nil {
			return fmt.Errorf("%w: frame for object %d after %d", errStream, i, cur)
		}
		if !f.GetFound() {
			cur, rec = i, nil
			continue
		}
		if i != cur {
			if f.GetRecordLen() > uint64(c.opts.MaxBlockBytes) {
				return fmt.Errorf("%w: record of %d bytes", errStream, f.GetRecordLen())
			}
			cur, rec = i, make([]byte, 0, f.GetRecordLen())
		}
		if f.GetOffset() != uint64(len(rec)) || len(rec)+len(f.GetData()) > cap(rec) {
			return fmt.Errorf("%w: object %d: %d bytes at offset %d", errStream, i, len(f.GetData()), f.GetOffset())
		}
		rec = append(rec, f.GetData()...)
		if f.GetLast() {
			if len(rec) != cap(rec) {
				return fmt.Errorf("%w: object %d ended at %d of %d bytes", errStream, i, len(rec), cap(rec))
			}
			fn(i, rec)
			rec = nil
		}
	}
}

// Remove removes the objects p names (Prompt.Names) from every node of the
// cluster (all their pieces, whatever their retention) and reports per name
// whether it was there. Only objects are removed by name: a Prompt of
// Tokens or Keys is ErrInvalid (blocks leave by eviction, or with their
// namespace: DropNamespace).
func (c *Client) Remove(ctx context.Context, ns prefixhash.Namespace, p Prompt, opts ...CallOption) ([]bool, error) {
	if _, err := applyOptions("remove", opts); err != nil {
		return nil, err
	}
	if p.Names == nil || p.Tokens != nil || p.Keys != nil {
		return nil, fmt.Errorf("%w: Remove takes a Prompt's Names (objects) only", ErrInvalid)
	}
	names := p.Names
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	for i, name := range names {
		if err := prefixhash.CheckObjectName(name); err != nil {
			return nil, fmt.Errorf("%w: name %d: %w", ErrInvalid, i, err)
		}
	}
	return c.removeObjectKeys(ctx, ns, names)
}

// removeObjectKeys removes every piece of names: piece 0 says how many
// there are.
func (c *Client) removeObjectKeys(ctx context.Context, ns prefixhash.Namespace, names []string) ([]bool, error) {
	if len(names) == 0 {
		return nil, nil
	}
	root := ns.Root()
	keys := make([]prefixhash.Key, len(names))
	for i, name := range names {
		keys[i] = prefixhash.ObjectKey(root, name)
	}
	all := append([]prefixhash.Key(nil), keys...)
	if err := c.readRecords(ctx, keys, func(i int, rec []byte, _ bool) error {
		if rec == nil {
			return nil
		}
		if h, err := block.DecodeHeader(rec, c.opts.MaxBlockBytes); err == nil && h.Kind == block.KindObject {
			for j := 1; j < h.Object.Pieces; j++ {
				all = append(all, prefixhash.PieceKey(keys[i], j))
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	found := make([]bool, len(names))
	for lo := 0; lo < len(all); lo += c.opts.MaxBatchBlocks {
		batch := all[lo:min(len(all), lo+c.opts.MaxBatchBlocks)]
		req := &kvmeshv1.ObjectServiceRemoveRequest{Keys: make([][]byte, len(batch))}
		for i := range batch {
			req.Keys[i] = batch[i][:]
		}
		var resp *kvmeshv1.ObjectServiceRemoveResponse
		err := c.retry(ctx, func(ctx context.Context) (err error) {
			resp, err = c.objects.Remove(ctx, req)
			return err
		})
		if err != nil {
			return nil, callError("remove objects", err)
		}
		for j, f := range resp.GetFound() {
			if lo+j < len(names) {
				found[lo+j] = f
			}
		}
	}
	return found, nil
}

// Retain sets the retention of what p names in ns on the nodes that hold
// it, replacing what it had (block.Retention{} clears it), and reports per
// item whether a node applied it: per object of p.Names (all its pieces),
// or per full block of p.Tokens (with p.Extra, as Put stores them). A pin
// of a prefix keeps its blocks from eviction from its first block on: pin
// the whole prefix a prompt shares (a block's descendants go with it).
// Keys, Parent and Rank are not taken.
func (c *Client) Retain(ctx context.Context, ns prefixhash.Namespace, p Prompt, r block.Retention, opts ...CallOption) ([]bool, error) {
	if _, err := applyOptions("retain", opts); err != nil {
		return nil, err
	}
	if p.Keys != nil || p.Parent != nil || p.Rank != (Rank{}) || (p.Names != nil) == (p.Tokens != nil) {
		return nil, fmt.Errorf("%w: Retain takes a Prompt's Names (objects) or its Tokens (a prefix's blocks), one of them", ErrInvalid)
	}
	what := struct {
		Objects []string
		Tokens  []uint32
		Extra   []prefixhash.ExtraKeys
	}{p.Names, p.Tokens, p.Extra}
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	root := ns.Root()
	var keys, chunks []prefixhash.Key
	var owner []int // per key: its item
	objKeys := make([]prefixhash.Key, len(what.Objects))
	for i, name := range what.Objects {
		if err := prefixhash.CheckObjectName(name); err != nil {
			return nil, fmt.Errorf("%w: name %d: %w", ErrInvalid, i, err)
		}
		objKeys[i] = prefixhash.ObjectKey(root, name)
		keys, chunks, owner = append(keys, objKeys[i]), append(chunks, objKeys[i]), append(owner, i)
	}
	if len(objKeys) > 0 {
		if err := c.readRecords(ctx, objKeys, func(i int, rec []byte, _ bool) error {
			if rec == nil {
				return nil
			}
			if h, err := block.DecodeHeader(rec, c.opts.MaxBlockBytes); err == nil && h.Kind == block.KindObject {
				for j := 1; j < h.Object.Pieces; j++ {
					k := prefixhash.PieceKey(objKeys[i], j)
					keys, chunks, owner = append(keys, k), append(chunks, k), append(owner, i)
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	items := len(what.Objects)
	if len(what.Tokens) > 0 {
		chain, err := prefixhash.KeysExtra(ns, what.Tokens, what.Extra)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		cks := c.chunkKeys(ctx, ns, chain)
		for i, k := range chain {
			ck := prefixhash.Key{}
			if cks != nil {
				ck = cks[i]
			}
			keys, chunks, owner = append(keys, k), append(chunks, ck), append(owner, items+i)
		}
		items += len(chain)
	}
	applied := make([]bool, items)
	for i := range applied {
		applied[i] = true
	}
	for lo := 0; lo < len(keys); lo += c.opts.MaxBatchBlocks {
		hi := min(len(keys), lo+c.opts.MaxBatchBlocks)
		req := &kvmeshv1.ObjectServiceRetainRequest{Keys: make([][]byte, hi-lo),
			Retention: &kvmeshv1.Retention{Pin: kvmeshv1.Pin(r.Pin), TtlMs: uint64(r.TTL.Milliseconds())}}
		for j := lo; j < hi; j++ {
			req.Keys[j-lo] = keys[j][:]
			if !chunks[j].IsZero() {
				req.ChunkKeys = append(req.ChunkKeys, chunks[j][:])
			}
		}
		if len(req.ChunkKeys) != len(req.Keys) {
			req.ChunkKeys = nil // unknown for some: the node asks every member
		}
		var resp *kvmeshv1.ObjectServiceRetainResponse
		err := c.retry(ctx, func(ctx context.Context) (err error) {
			resp, err = c.objects.Retain(ctx, req)
			return err
		})
		if err != nil {
			return nil, callError("retain", err)
		}
		for j, a := range resp.GetApplied() {
			applied[owner[lo+j]] = applied[owner[lo+j]] && a
		}
	}
	return applied, nil
}
