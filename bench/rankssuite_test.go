package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// smallRanks is the ranks suite at test size: 16 KiB blocks of 4 KV heads,
// 2 and 4 ranks, two runs; 4 KiB latent blocks put by 4 ranks.
func smallRanks() RanksOptions {
	return RanksOptions{Ranks: []int{2, 4}, Prompts: 2, Blocks: 3, Runs: 2,
		Model: prefixhash.Namespace{Model: "kvmesh/test-ranks", DType: prefixhash.BFloat16, BlockTokens: 16, Layers: 2, KVHeads: 4, HeadDim: 32},
		Latent: prefixhash.Namespace{Model: "kvmesh/test-ranks-mla", DType: prefixhash.BFloat16, BlockTokens: 16, Layers: 2,
			Layout: prefixhash.LatentKV, LatentDim: 64},
		LatentRanks: 4, LatentBlocks: 3, NodeDRAMBytes: 64 << 20}
}

func TestRanksSuite(t *testing.T) {
	env := &Env{Addrs: []string{inProcessNode(t)}, WorkDir: t.TempDir()}
	o := smallRanks()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := (&RanksSuite{Options: o}).Run(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	rows := table[ranksRow](t, res, "ranks")
	if len(rows) != 8 { // tcp and shm × 2 and 4 ranks × put and get
		t.Fatalf("%d rows: %+v", len(rows), rows)
	}
	blockBytes := int64(o.Model.BlockBytes())
	for i, r := range rows {
		wantPath, wantRanks, wantOp := []string{"kvmesh-tcp", "kvmesh-shm"}[i/4], o.Ranks[i/2%2], []string{"put", "get"}[i%2]
		if r.Path != wantPath || r.Ranks != wantRanks || r.Op != wantOp || r.Runs != 2 || len(r.WholeRuns) != 2 || len(r.RanksRuns) != 2 {
			t.Fatalf("row %d: %+v", i, r)
		}
		if r.WholeGBps <= 0 || r.RanksGBps <= 0 || r.RatioMin <= 0 || r.RatioMin > r.RatioVsWhole || r.RatioVsWhole > r.RatioMax {
			t.Errorf("row %d figures: %+v", i, r)
		}
		// The node's data plane carried the runs over the row's transport.
		if r.PathShare == nil || *r.PathShare < 0.9 {
			t.Errorf("row %d: path_share %v", i, r.PathShare)
		}
		// Every block of every run was read back and compared: a put's
		// whole blocks (the peer's and the ranks'), a get's blocks or
		// parts (the ranks' parts add up to the blocks).
		if want := int64(r.Runs*2*r.Blocks) * blockBytes; r.BytesVerified != want {
			t.Errorf("row %d: %d bytes verified, want %d", i, r.BytesVerified, want)
		}
	}
	for _, figure := range []string{"min ratio_vs_whole (N <= 4)"} {
		check(t, res, figure)
	}
	latent := table[latentRow](t, res, "latent")
	if len(latent) != 6 { // tcp and shm × one copy, put_rank, put_whole_each
		t.Fatalf("latent rows %+v", latent)
	}
	for i, r := range latent {
		if r.Writers != []string{latentOneCopy, latentPutRank, latentPutWholes}[i%3] || r.StoredBlocks != int64(o.LatentBlocks) ||
			r.ReceivedBytes < int64(o.LatentBlocks*o.Latent.BlockBytes()) {
			t.Errorf("latent row %+v", r)
		}
		switch r.Writers {
		case latentOneCopy:
			if r.Ranks != 1 || r.RatioVsOneCopy != 1 {
				t.Errorf("one_copy row %+v", r)
			}
		case latentPutRank:
			// One rank's claim wins; the others send nothing: the bytes of
			// one copy, and every rank reads the whole latent back.
			if r.RatioVsOneCopy > 1.05 || r.Ranks != o.LatentRanks || r.RanksReadWhole != o.LatentRanks ||
				r.BytesVerified != int64(o.LatentRanks*o.LatentBlocks*o.Latent.BlockBytes()) {
				t.Errorf("put_rank row %+v", r)
			}
		case latentPutWholes:
			// The peer: every rank sends its copy.
			if r.RatioVsOneCopy < float64(o.LatentRanks) {
				t.Errorf("put_whole_each row %+v", r)
			}
		}
	}
	if c := check(t, res, "max ratio_vs_one_copy"); !c.Met {
		t.Errorf("check %+v", c)
	}
	if c := check(t, res, "ranks_read_whole / ranks"); !c.Met {
		t.Errorf("check %+v", c)
	}
}

func TestRanksOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(o *RanksOptions)
		want string
	}{
		{func(o *RanksOptions) { o.Ranks = []int{3} }, "tensor-parallel size 3 for 4 KV heads"},
		{func(o *RanksOptions) { o.Ranks = []int{0} }, "Ranks: 0 is outside"},
		{func(o *RanksOptions) { o.Model.Layout, o.Model.LatentDim = prefixhash.LatentKV, 64 }, "Model must have the split layout"},
		{func(o *RanksOptions) { o.Model.Layers = 0 }, "Model: "},
		{func(o *RanksOptions) { o.Latent.Layout = prefixhash.SplitKV }, "Latent must have the latent layout"},
		{func(o *RanksOptions) { o.Runs = -1 }, "Runs -1"},
		{func(o *RanksOptions) { o.LatentRanks = 100 }, "LatentRanks 100"},
		{func(o *RanksOptions) { o.NodeDRAMBytes = 1 << 20 }, "NodeDRAMBytes"},
	} {
		o := smallRanks()
		tc.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	o := smallRanks()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	// The defaults are valid, full and quick, and the full model is the
	// issue's: 32 layers, 8 KV heads, head_dim 128.
	for _, quick := range []bool{false, true} {
		var d RanksOptions
		d.EnsureDefaults(quick)
		if err := d.Validate(); err != nil {
			t.Fatalf("quick %v: %v", quick, err)
		}
		if !quick && (d.Model.BlockBytes() != 2<<20 || d.Latent.Layers != 61 || d.Runs < 3) {
			t.Fatalf("full defaults %+v", d)
		}
	}
}
