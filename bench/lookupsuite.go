package bench

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
	"unsafe"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// LookupOptions configures the lookup suite. Zero fields take the defaults
// documented on each, for a full run or for --quick.
type LookupOptions struct {
	// PromptTokens are the prompt lengths. Default 1k, 4k, 16k, 64k and
	// 128k tokens; quick 1k, 16k and 128k.
	PromptTokens []int
	// Nodes are the cluster sizes. Default 1, 2 and 4; quick 1 and 4. With
	// Env.Addrs, the given cluster only.
	Nodes []int
	// Lookups is the number of lookups timed per prompt length and cluster
	// size, spread over the nodes. Default 200; quick 50.
	Lookups int
	// BlockTokens is the namespace's tokens per block. Default 16, so a
	// 128k-token prompt is 8192 blocks.
	BlockTokens int
	// HashBlockTokens are the block sizes hashing is measured at. Default
	// BlockTokens and 512.
	HashBlockTokens []int
	// HashRuns is how many times a 128k-token prompt is hashed per block
	// size (the median counts). Default 20; quick 5.
	HashRuns int
	// SettleTimeout bounds the wait for a cluster to place every block of
	// the prompt (pushes to owners are asynchronous). Default 30s.
	SettleTimeout time.Duration
}

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *LookupOptions) EnsureDefaults(quick bool) {
	if len(o.PromptTokens) == 0 {
		o.PromptTokens = pick(quick, []int{1 << 10, 4 << 10, 16 << 10, 64 << 10, 128 << 10}, []int{1 << 10, 16 << 10, 128 << 10})
	}
	if len(o.Nodes) == 0 {
		o.Nodes = pick(quick, []int{1, 2, 4}, []int{1, 4})
	}
	if o.Lookups == 0 {
		o.Lookups = pick(quick, 200, 50)
	}
	if o.BlockTokens == 0 {
		o.BlockTokens = 16
	}
	if len(o.HashBlockTokens) == 0 {
		o.HashBlockTokens = []int{o.BlockTokens}
		if o.BlockTokens != 512 {
			o.HashBlockTokens = append(o.HashBlockTokens, 512)
		}
	}
	if o.HashRuns == 0 {
		o.HashRuns = pick(quick, 20, 5)
	}
	if o.SettleTimeout == 0 {
		o.SettleTimeout = 30 * time.Second
	}
}

// Validate names the first field that is out of range.
func (o *LookupOptions) Validate() error {
	for _, n := range o.PromptTokens {
		if n < o.BlockTokens || n > 1<<22 {
			return fmt.Errorf("bench: lookup: prompt of %d tokens is outside one block (%d)..4M", n, o.BlockTokens)
		}
	}
	for _, n := range o.Nodes {
		if n < 1 || n > 64 {
			return fmt.Errorf("bench: lookup: %d nodes is outside 1..64", n)
		}
	}
	for _, b := range o.HashBlockTokens {
		if b < 1 || b > prefixhash.MaxBlockTokens {
			return fmt.Errorf("bench: lookup: hash block tokens %d is outside 1..%d", b, prefixhash.MaxBlockTokens)
		}
	}
	switch {
	case len(o.PromptTokens) == 0:
		return errors.New("bench: lookup: no prompt lengths")
	case o.Lookups < 1 || o.Lookups > 1<<20:
		return fmt.Errorf("bench: lookup: lookups %d is outside 1..1M", o.Lookups)
	case o.BlockTokens < 1 || o.BlockTokens > prefixhash.MaxBlockTokens:
		return fmt.Errorf("bench: lookup: block tokens %d is outside 1..%d", o.BlockTokens, prefixhash.MaxBlockTokens)
	case o.HashRuns < 1:
		return fmt.Errorf("bench: lookup: hash runs %d must be positive", o.HashRuns)
	case o.SettleTimeout <= 0:
		return fmt.Errorf("bench: lookup: settle timeout %v must be positive", o.SettleTimeout)
	}
	return nil
}

// LookupSuite measures the longest-prefix lookup of prompts of growing
// length, fully cached, on clusters of growing size: what an inference
// worker asks before every prefill, through the Go client, by two paths.
// "chain" is client.Lookup, the worker's: the client hashes the prompt and
// sends its chain, the node asks the owners and answers with counts and
// runs. "tokens" is client.LookupTokens: the tokens sent, the node hashes
// them and lists every cached block with its key, node and tier. It also
// measures the keys of a 128k-token prompt (SHA-256, chained) next to one
// SHA-256 pass over the same bytes, the limit of the scheme.
type LookupSuite struct {
	Options LookupOptions
}

// Name returns "lookup".
func (s *LookupSuite) Name() string { return "lookup" }

// lookupRow is one prompt length on one cluster size.
type lookupRow struct {
	Nodes int `json:"nodes"`
	// Path is "chain" (client.Lookup) or "tokens" (client.LookupTokens).
	Path         string  `json:"path"`
	PromptTokens int     `json:"prompt_tokens"`
	PromptBlocks int     `json:"prompt_blocks" table:"wide"`
	CachedTokens int     `json:"cached_tokens"`
	P50MS        float64 `json:"p50_ms"`
	P99MS        float64 `json:"p99_ms"`
	MaxMS        float64 `json:"max_ms" table:"-"`
	LookupsPerS  float64 `json:"lookups_per_s"`
	Lookups      int     `json:"lookups" table:"-"`
	Errors       int     `json:"errors" table:"nonzero"`
}

// hashRow is key hashing at one block size.
type hashRow struct {
	BlockTokens  int `json:"block_tokens"`
	PromptTokens int `json:"prompt_tokens"`
	// KeysMS is the time to compute the prompt's whole chain of keys.
	KeysMS      float64 `json:"keys_ms"`
	HashingGBps float64 `json:"hashing_gbps"`
	SHA256GBps  float64 `json:"sha256_gbps"`
	// RatioVsSHA256 is hashing_gbps over one plain SHA-256 pass over the
	// same token bytes, measured in the same run. Each block is its own
	// message (a 16-byte parent, then the tokens, then SHA-256's padding),
	// so at 16 tokens per block two compressions hash 64 token bytes where
	// the single pass spends one: about 0.5 is the ceiling there, nearer 1
	// as blocks grow.
	RatioVsSHA256 float64 `json:"ratio_vs_sha256"`
}

// hashPromptTokens is the prompt length key hashing is measured at.
const hashPromptTokens = 128 << 10

// lookupNamespace is the namespace the suite caches its prompt under: a
// small payload (128 bytes), so that placing 8k blocks is quick.
func lookupNamespace(blockTokens int) prefixhash.Namespace {
	return prefixhash.Namespace{Model: "kvmesh/bench-lookup", DType: prefixhash.Float16, BlockTokens: blockTokens,
		Layers: 1, KVHeads: 1, HeadDim: 2}
}

// Run measures.
func (s *LookupSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	longest := slices.Max(o.PromptTokens)
	r := rand.New(rand.NewPCG(1, 0x6c6f6f6b))
	tokens := make([]uint32, longest)
	for i := range tokens {
		tokens[i] = uint32(r.IntN(DefaultVocab))
	}

	hashTokens := tokens
	if len(hashTokens) < hashPromptTokens {
		hashTokens = make([]uint32, hashPromptTokens)
		for i := range hashTokens {
			hashTokens[i] = uint32(r.IntN(DefaultVocab))
		}
	}
	res.AddTable("hashing", fmt.Sprintf("chained 128-bit block keys (SHA-256, prefixhash key format %d) of a 128k-token prompt "+
		"(prefixhash.Keys), next to one SHA-256 pass over the same bytes", prefixhash.KeyVersion),
		measureHashing(ctx, hashTokens[:hashPromptTokens], o.HashBlockTokens, o.HashRuns))
	for _, h := range res.Tables[0].Rows.([]hashRow) {
		if h.BlockTokens == 16 {
			res.Checks = append(res.Checks, NewCheck("lookup: keys of a 128k-token prompt, 16-token blocks", "keys_ms", h.KeysMS, "<=", 0.5, BackendKvmesh))
		}
	}

	sizes := o.Nodes
	if len(env.Addrs) > 0 {
		sizes = []int{len(env.Addrs)}
	}
	bar := env.Progress.Bar(int64(len(sizes)*(1+len(o.PromptTokens))), "lookup")
	defer bar.Finish()
	ns := lookupNamespace(o.BlockTokens)
	var rows []lookupRow
	for _, n := range sizes {
		bar.Describe(fmt.Sprintf("lookup: starting %d node(s)", n))
		got, err := s.onCluster(ctx, env, o, ns, n, tokens, bar)
		rows = append(rows, got...)
		var skip *clusterUnavailable
		switch {
		case errors.As(err, &skip):
			res.Skip(fmt.Sprintf("lookup on %d nodes", n), err)
		case err != nil:
			res.AddTable("lookup", "longest-prefix lookup", rows)
			return res, err
		}
	}
	res.AddTable("lookup", fmt.Sprintf("longest-prefix lookup of a fully cached prompt (%d-token blocks), through the Go client, "+
		"from each node in turn; path chain: client.Lookup, what an inference worker calls (the client hashes the prompt, sends 16 bytes "+
		"a block, the answer counts and runs of blocks per node); path tokens: client.LookupTokens (the tokens sent, the node hashes them, "+
		"the answer lists every block)", o.BlockTokens), rows)
	for _, row := range rows {
		if row.PromptTokens == 128<<10 && row.Nodes == 4 && row.Path == "chain" {
			res.Checks = append(res.Checks, NewCheck("lookup: 128k-token prompt on 4 nodes", "p99_ms", row.P99MS, "<=", 2, BackendKvmesh))
		}
	}
	return res, nil
}

func (s *LookupSuite) onCluster(ctx context.Context, env *Env, o LookupOptions, ns prefixhash.Namespace, n int, tokens []uint32, bar Bar) ([]lookupRow, error) {
	addrs, stop, err := nodeAddrs(ctx, env, DaemonOptions{Nodes: n, Join: n > 1, DRAMBytes: 256 << 20})
	if err != nil {
		bar.Add(int64(1 + len(o.PromptTokens)))
		return nil, err
	}
	defer stop()
	pool := &clientPool{opts: client.Options{MaxRetries: -1}}
	defer pool.Close()
	clients := make([]*client.Client, len(addrs))
	for i, a := range addrs {
		if clients[i], err = pool.get(a); err != nil {
			return nil, err
		}
	}
	// Publish the longest prompt through the first node, then wait until
	// every node sees all of it: placement pushes blocks to their owners
	// asynchronously.
	payloads := make([][]byte, len(tokens)/o.BlockTokens)
	for i := range payloads {
		payloads[i] = make([]byte, ns.BlockBytes())
		stampKey(payloads[i], uint64(i))
	}
	if _, err := clients[0].Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
		return nil, fmt.Errorf("bench: lookup: put the prompt: %w", err)
	}
	settle, cancel := context.WithTimeout(ctx, o.SettleTimeout)
	for _, c := range clients {
		for {
			l, err := c.Lookup(settle, ns, client.Prompt{Tokens: tokens})
			if err == nil && l.CachedBlocks == len(payloads) {
				break
			}
			if settle.Err() != nil {
				break // the rows will show what is cached
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	cancel()
	bar.Add(1)

	paths := []struct {
		name string
		opts []client.CallOption
	}{{"chain", nil}, {"tokens", []client.CallOption{client.SendTokens()}}}
	var rows []lookupRow
	for _, length := range o.PromptTokens {
		bar.Describe(fmt.Sprintf("lookup: %d tokens on %d node(s)", length, n))
		for _, path := range paths {
			if err := ctx.Err(); err != nil {
				return rows, err
			}
			var lat Latency
			row := lookupRow{Nodes: len(addrs), Path: path.name, PromptTokens: length, PromptBlocks: length / o.BlockTokens,
				Lookups: o.Lookups, CachedTokens: length}
			prompt := tokens[:length]
			start := time.Now()
			for i := range o.Lookups {
				t0 := time.Now()
				l, err := clients[i%len(clients)].Lookup(ctx, ns, client.Prompt{Tokens: prompt}, path.opts...)
				lat.Record(time.Since(t0))
				switch {
				case err != nil:
					row.Errors++
				default:
					row.CachedTokens = min(row.CachedTokens, l.CachedTokens)
				}
			}
			row.LookupsPerS = float64(o.Lookups) / time.Since(start).Seconds()
			row.P50MS, row.P99MS, row.MaxMS = lat.Quantile(0.5), lat.Quantile(0.99), lat.Quantile(1)
			rows = append(rows, row)
		}
		bar.Add(1)
	}
	return rows, nil
}

// measureHashing hashes tokens into chained keys at each block size, runs
// times, next to SHA-256 over the same bytes; GB/s count token bytes.
func measureHashing(ctx context.Context, tokens []uint32, blockTokens []int, runs int) []hashRow {
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
	var rows []hashRow
	for _, b := range blockTokens {
		ns := lookupNamespace(b)
		n := len(tokens) / b * b
		root := ns.Root()
		dst := make([]prefixhash.Key, 0, n/b)
		var secs, plain []float64
		var sink byte
		for range runs {
			if ctx.Err() != nil {
				break
			}
			t0 := time.Now()
			dst = prefixhash.AppendKeys(dst[:0], root, b, tokens[:n])
			secs = append(secs, time.Since(t0).Seconds())
			t0 = time.Now()
			sum := sha256.Sum256(raw[:4*n])
			plain = append(plain, float64(4*n)/time.Since(t0).Seconds()/1e9)
			sink += sum[0] + dst[len(dst)-1][0]
		}
		_ = sink
		sec := medianOf(secs)
		row := hashRow{BlockTokens: b, PromptTokens: n, KeysMS: sec * 1e3, SHA256GBps: medianOf(plain)}
		if sec > 0 {
			row.HashingGBps = float64(4*n) / sec / 1e9
		}
		if row.SHA256GBps > 0 {
			row.RatioVsSHA256 = row.HashingGBps / row.SHA256GBps
		}
		rows = append(rows, row)
	}
	return rows
}
