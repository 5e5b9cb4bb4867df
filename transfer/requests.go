package transfer

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/kvmesh/kvmesh/auth"
)

// getRounds runs the requests of a Get of n keys: round asks for the keys
// idx (at most maxItems) and returns those the peer asked to be asked for
// again, until every key is answered. Each round answers at least one key,
// or the peer is broken.
func getRounds(n, maxItems int, round func(idx []int) ([]int, error)) error {
	todo := make([]int, n)
	for i := range todo {
		todo[i] = i
	}
	for len(todo) > 0 {
		k := min(len(todo), maxItems)
		retry, err := round(todo[:k])
		if err != nil {
			return err
		}
		if len(retry) == k {
			return corrupt("peer sent none of %d values and asked for all again", k)
		}
		todo = append(todo[k:], retry...)
	}
	return nil
}

// fillResult records the answer to the keys idx in r: statuses st, and
// value(i) for each OK item, asked in increasing i. It returns the keys to
// ask for again.
func fillResult(r *Result, idx []int, st []Status, value func(i int) []byte) (retry []int) {
	for i, j := range idx {
		switch st[i] {
		case StatusOK:
			r.Values[j] = value(i)
			r.Status[j] = StatusOK
		case statusRetry:
			retry = append(retry, j)
		default:
			r.Status[j] = st[i]
		}
	}
	return retry
}

// requestContext bounds ctx by timeout.
func requestContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		return context.WithCancel(ctx)
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= timeout {
		// The caller's deadline comes first: a context of our own would
		// change nothing but cost a timer and a cancel registration per
		// request. The callers start no goroutine that outlives the call.
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, timeout)
}

// getHeader is the header of a get request for count keys: the requester's
// deadline and limits travel with it, so the server stops when the client
// has given up and never answers with more than the client accepts.
func getHeader(ctx context.Context, id uint64, count int, lim *Limits) header {
	return scoped(ctx, header{typ: typeGetReq, id: id, count: count, timeout: timeoutMillis(ctx), maxBatch: lim.MaxBatchBytes, maxValue: lim.MaxValueSize})
}

// scoped returns request header h scoped as ctx's access says
// (auth.WithAccess): a node reading or writing for a tenant confines the
// request to that tenant's blocks.
func scoped(ctx context.Context, h header) header {
	if a := auth.AccessFrom(ctx); a.Scoped {
		h.scoped, h.tag = true, a.Tag
	}
	return h
}

// timeoutMillis is what a request tells the server about its deadline.
func timeoutMillis(ctx context.Context) uint32 {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	ms := time.Until(dl).Milliseconds() + 1
	return uint32(min(max(ms, 1), 1<<32-1))
}

// readTable reads and verifies h's item table into buf (grown as needed).
func readTable(r io.Reader, h *header, buf []byte) ([]byte, error) {
	n := h.tableLen()
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return buf, fmt.Errorf("read %s table: %w", h.typ, err)
	}
	return buf, checkTable(h, buf)
}

// remoteError reads an error frame's message. An error of class auth wraps
// ErrAuth as well as ErrRemote.
func remoteError(r io.Reader, h *header) error {
	var msg [maxErrorMsg]byte
	if _, err := io.ReadFull(r, msg[:h.payload]); err != nil {
		if h.class == classAuth {
			return &authError{reason: "the peer refused the connection (message lost: " + err.Error() + ")", err: ErrRemote}
		}
		return fmt.Errorf("%w (message lost: %w)", ErrRemote, err)
	}
	if h.class == classAuth {
		return &authError{reason: "the peer refused the connection: " + string(msg[:h.payload]), err: ErrRemote}
	}
	return fmt.Errorf("%w: %s", ErrRemote, msg[:h.payload])
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
