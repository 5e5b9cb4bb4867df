package bench

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// The latent figure of the ranks suite: an MLA instance's ranks put one
// prefix, all holding the same latent, and the node should receive one
// copy's bytes whatever the number of ranks (claims).

// latentRow is one way an MLA instance's ranks put one prefix.
type latentRow struct {
	Path string `json:"path"`
	// Writers is "one_copy" (one client's Put of the prefix: the bytes one
	// copy costs the node), "put_rank" (every rank's client.Put of its Rank at
	// once: a rank sends only what its claim lets it) or "put_whole_each"
	// (every rank's Put of the whole blocks at once, as when each rank
	// stored its own copy).
	Writers    string `json:"writers"`
	Ranks      int    `json:"ranks"`
	Blocks     int    `json:"blocks"`
	BlockBytes int    `json:"block_bytes"`
	// ReceivedBytes is what the node's data plane and gRPC API received
	// for the puts (its kvmesh_transfer_bytes_total and
	// kvmesh_payload_bytes_total, op=put: encoded records, headers
	// included); RatioVsOneCopy is it over the one_copy row's, measured
	// on the same path just before.
	ReceivedBytes  int64   `json:"received_bytes"`
	RatioVsOneCopy float64 `json:"ratio_vs_one_copy"`
	// StoredBlocks is what the node holds of the namespace afterwards.
	StoredBlocks int64   `json:"stored_blocks" table:"wide"`
	PutSeconds   float64 `json:"put_s" table:"wide"`
	// RanksReadWhole counts the ranks whose Get of its Rank returned the whole
	// latent of every block (put_rank only).
	RanksReadWhole int   `json:"ranks_read_whole"`
	BytesVerified  int64 `json:"bytes_verified" table:"wide"`
}

// latentChecks adds the MLA targets: the node receives at most 1.05 copies
// of the prefix, and every rank reads the whole latent.
func latentChecks(res *Result, rows []latentRow) {
	worst, read, ranks := 0.0, 0, 0
	for _, r := range rows {
		if r.Writers != latentPutRank {
			continue
		}
		worst = max(worst, r.RatioVsOneCopy)
		read += r.RanksReadWhole
		ranks += r.Ranks
	}
	if ranks == 0 {
		return
	}
	res.Checks = append(res.Checks,
		NewCheck("ranks: bytes an MLA instance's ranks send for a prefix vs one copy, every path", "max ratio_vs_one_copy", worst, "<=", 1.05, BackendKvmesh),
		NewCheck("ranks: every MLA rank reads the whole latent", "ranks_read_whole / ranks", float64(read)/float64(ranks), ">=", 1, BackendKvmesh))
}

// The writers of the latent table.
const (
	latentOneCopy   = "one_copy"
	latentPutRank   = "put_rank"
	latentPutWholes = "put_whole_each"
)

// latentMeasure is the MLA measurement: ranks ranks put the same blocks
// prefix of ns, whose block b holds payloads[b].
type latentMeasure struct {
	ns             prefixhash.Namespace
	ranks, blocks  int
	addr, httpAddr string
	payloads       [][]byte
	seq            uint64
}

// measure puts a prefix with one client's Put, then another with every rank's Put of its part
// from every rank, then another with every rank's whole Put, over one
// path, and returns their rows.
func (m *latentMeasure) measure(ctx context.Context, opts client.Options) ([]latentRow, error) {
	cs, closeAll, err := dialRanks(m.addr, opts, m.ranks)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	if _, err := cs[0].DropNamespace(ctx, m.ns); err != nil {
		return nil, err
	}
	var rows []latentRow
	for _, writers := range []string{latentOneCopy, latentPutRank, latentPutWholes} {
		w := cs
		if writers == latentOneCopy {
			w = cs[:1]
		}
		r, err := m.put(ctx, w, writers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", writers, err)
		}
		if r.ReceivedBytes <= 0 {
			return nil, fmt.Errorf("%s: the node's metrics count no bytes received for the puts", writers)
		}
		rows = append(rows, r)
		rows[len(rows)-1].RatioVsOneCopy = float64(r.ReceivedBytes) / float64(rows[0].ReceivedBytes)
		if _, err := cs[0].DropNamespace(ctx, m.ns); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// put has every rank put the prefix at once, the way writers says, and
// counts what the node received; after PutRank every rank reads the
// prefix back with GetRank.
func (m *latentMeasure) put(ctx context.Context, cs []*client.Client, writers string) (latentRow, error) {
	n := len(cs)
	m.seq++
	tokens := ranksTokens(m.ns, m.seq, 1, m.blocks)[0]
	row := latentRow{Writers: writers, Ranks: n, Blocks: m.blocks, BlockBytes: m.ns.BlockBytes()}
	before, err := receivedBytes(ctx, m.httpAddr)
	if err != nil {
		return row, err
	}
	d, err := timeRanks(n, func(r int) error {
		var err error
		if writers == latentPutRank {
			_, err = cs[r].Put(ctx, m.ns, client.Prompt{Tokens: tokens, Rank: tpRank(r, n)}, m.payloads)
		} else {
			_, err = cs[r].Put(ctx, m.ns, client.Prompt{Tokens: tokens}, m.payloads)
		}
		if err != nil {
			return fmt.Errorf("rank %d of %d: %w", r, n, err)
		}
		return nil
	})
	if err != nil {
		return row, err
	}
	after, err := receivedBytes(ctx, m.httpAddr)
	if err != nil {
		return row, err
	}
	row.PutSeconds = d.Seconds()
	row.ReceivedBytes = int64(after - before)
	st, err := cs[0].Stats(ctx)
	if err != nil {
		return row, err
	}
	for _, x := range st.Namespaces {
		if x.Digest == m.ns.Digest() {
			row.StoredBlocks += x.Blocks
		}
	}
	if writers != latentPutRank {
		return row, nil
	}
	for r, c := range cs {
		got, err := c.Get(ctx, m.ns, client.Prompt{Tokens: tokens, Rank: tpRank(r, n)})
		if err != nil {
			return row, fmt.Errorf("rank %d of %d: get: %w", r, n, err)
		}
		v, err := verifyBlocks(fmt.Sprintf("rank %d of %d: get", r, n), got, m.payloads)
		row.BytesVerified += v
		switch {
		case err == nil:
			row.RanksReadWhole++
		case len(got) == len(m.payloads):
			return row, err // wrong bytes, not a shorter prefix
		}
	}
	return row, nil
}
