package transfer

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Looker is implemented by a Source that also answers lookups: which
// leading keys of runs of a prefix chain it holds. A Server whose Source is
// not a Looker answers lookups with ErrUnsupported.
type Looker interface {
	// Lookup sets counts[i] to how many leading keys of runs[i] the source
	// holds (counts arrives zeroed, len(runs) long). It must not keep
	// runs, and should return early, with zeros, when ctx is done.
	Lookup(ctx context.Context, runs [][]prefixhash.Key, counts []int)
}

func putLookupEntry(t []byte, i int, k prefixhash.Key, run int) {
	e := t[i*lookupEntry:]
	copy(e, k[:])
	binary.LittleEndian.PutUint32(e[prefixhash.KeySize:], uint32(run))
}

func putCountEntry(t []byte, i int, n int) {
	binary.LittleEndian.PutUint32(t[i*countEntry:], uint32(n))
}

// parseLookupReq decodes a lookupReq table into keys and the run each
// belongs to, and returns the number of runs. Run indices start at 0 and
// grow by at most one per key, so runs are consecutive and non-empty.
func parseLookupReq(table []byte, keys []prefixhash.Key, runOf []int) (int, error) {
	runs := 0
	for i := range keys {
		e := table[i*lookupEntry:]
		copy(keys[i][:], e)
		r := binary.LittleEndian.Uint32(e[prefixhash.KeySize:])
		if binary.LittleEndian.Uint32(e[prefixhash.KeySize+4:]) != 0 {
			return 0, corrupt("reserved bytes of lookup key %d are not zero", i)
		}
		switch {
		case i == 0 && r != 0:
			return 0, corrupt("lookup key 0 in run %d, want run 0", r)
		case i > 0 && r != uint32(runOf[i-1]) && r != uint32(runOf[i-1])+1:
			return 0, corrupt("lookup key %d in run %d after run %d", i, r, runOf[i-1])
		}
		runOf[i] = int(r)
		runs = int(r) + 1
	}
	return runs, nil
}

// parseLookupResp decodes a lookupResp table into counts, each at most the
// length of its run.
func parseLookupResp(table []byte, runLens, counts []int) error {
	for i := range counts {
		e := table[i*countEntry:]
		n := binary.LittleEndian.Uint32(e)
		if binary.LittleEndian.Uint32(e[4:]) != 0 {
			return corrupt("reserved bytes of lookup count %d are not zero", i)
		}
		if uint64(n) > uint64(runLens[i]) {
			return corrupt("lookup count %d is %d for a run of %d keys", i, n, runLens[i])
		}
		counts[i] = int(n)
	}
	return nil
}

// lookup answers a lookup request from the Source, which must be a Looker.
func (sc *serverConn) lookup(ctx context.Context, h *header) error {
	s := sc.s
	lk, ok := s.src.(Looker)
	if !ok {
		return fmt.Errorf("%w: this server answers no lookups", ErrUnsupported)
	}
	n := h.count
	sc.keys, sc.lens = grow(sc.keys, n), grow(sc.lens, n)
	nruns, err := parseLookupReq(sc.table, sc.keys[:n], sc.lens[:n])
	if err != nil {
		return err
	}
	runs := make([][]prefixhash.Key, 0, nruns)
	for lo := 0; lo < n; {
		hi := lo + 1
		for hi < n && sc.lens[hi] == sc.lens[lo] {
			hi++
		}
		runs = append(runs, sc.keys[lo:hi:hi])
		lo = hi
	}
	counts := make([]int, nruns)
	lk.Lookup(ctx, runs, counts)
	t := sc.enc.begin(typeLookupResp, nruns)
	for i, c := range counts {
		putCountEntry(t, i, min(max(c, 0), len(runs[i])))
	}
	s.stats.lookups.Add(1)
	if _, err := sc.nc.Write(sc.enc.finish(header{typ: typeLookupResp, id: h.id, count: nruns})); err != nil {
		return fmt.Errorf("send lookup answer: %w", err)
	}
	return nil
}

// Lookup asks the peer, for each run of consecutive keys of a prefix chain,
// how many leading keys of the run it holds: counts[i] is that of runs[i]
// (an empty run counts 0). A lookup of more than Limits.MaxLookupKeys keys
// travels in several requests, cut between runs; a run longer than that is
// sent as several runs, whose counts add up to the run's. It runs under ctx
// bounded by RequestTimeout, like Get.
func (c *Client) Lookup(ctx context.Context, runs [][]prefixhash.Key) ([]int, error) {
	ctx, cancel := requestContext(ctx, c.opts.RequestTimeout)
	defer cancel()
	limit := c.opts.MaxLookupKeys
	parts, whole := splitRuns(runs, limit)
	got := make([]int, len(parts))
	for lo := 0; lo < len(parts); {
		keys, hi := 0, lo
		for hi < len(parts) && keys+len(parts[hi]) <= limit {
			keys += len(parts[hi])
			hi++
		}
		if keys > 0 {
			err := c.do(ctx, func(cc *clientConn) error { return cc.lookup(ctx, c, parts[lo:hi], keys, got[lo:hi]) })
			if err != nil {
				return nil, fmt.Errorf("transfer: lookup %d keys on %s: %w", keys, c.addr, err)
			}
		}
		lo = hi
	}
	if whole == nil {
		return got, nil
	}
	return joinCounts(runs, parts, whole, got), nil
}

// splitRuns cuts runs longer than limit keys into runs of at most limit
// keys. whole[j] is the index in runs of parts[j]; whole is nil (and parts
// is runs) when no run was cut.
func splitRuns(runs [][]prefixhash.Key, limit int) (parts [][]prefixhash.Key, whole []int) {
	long := false
	for _, r := range runs {
		long = long || len(r) > limit
	}
	if !long {
		return runs, nil
	}
	for i, r := range runs {
		for len(r) > limit {
			parts, whole = append(parts, r[:limit:limit]), append(whole, i)
			r = r[limit:]
		}
		parts, whole = append(parts, r), append(whole, i)
	}
	return parts, whole
}

// joinCounts turns the counts of parts, cut by splitRuns, into those of
// runs: a run holds the keys of its parts up to the first part not wholly
// held.
func joinCounts(runs, parts [][]prefixhash.Key, whole, got []int) []int {
	counts := make([]int, len(runs))
	full := make([]bool, len(runs))
	for i := range full {
		full[i] = true
	}
	for j, i := range whole {
		if full[i] {
			counts[i] += got[j]
			full[i] = got[j] == len(parts[j])
		}
	}
	return counts
}

// lookup sends one lookup request of keys keys in runs and reads the
// counts of the non-empty runs into counts.
func (cc *clientConn) lookup(ctx context.Context, c *Client, runs [][]prefixhash.Key, keys int, counts []int) error {
	id := c.nextID.Add(1)
	t := cc.enc.begin(typeLookupReq, keys)
	i, run := 0, 0
	var lens []int
	for _, r := range runs {
		if len(r) == 0 {
			continue
		}
		for _, k := range r {
			putLookupEntry(t, i, k, run)
			i++
		}
		lens = append(lens, len(r))
		run++
	}
	if _, err := cc.nc.Write(cc.enc.finish(scoped(ctx, header{typ: typeLookupReq, id: id, count: keys, timeout: timeoutMillis(ctx)}))); err != nil {
		return fmt.Errorf("send request: %w", err)
	}
	h, err := cc.readFrame(id, typeLookupResp, &c.opts.Limits)
	if err != nil {
		return err
	}
	if h.count != run {
		return corrupt("%d counts in the answer to a lookup of %d runs", h.count, run)
	}
	got := make([]int, run)
	if err := parseLookupResp(cc.table, lens, got); err != nil {
		return err
	}
	j := 0
	for k, r := range runs {
		if len(r) > 0 {
			counts[k] = got[j]
			j++
		}
	}
	return nil
}
