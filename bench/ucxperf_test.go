package bench

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/transfer"
)

func TestParsePerftest(t *testing.T) {
	out := `+--------------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
                         100   1338.723  1519.589  1519.589      658.07     658.07         658         658
`
	got, err := parsePerftest(out)
	if want := 658.07 * (1 << 20) / 1e9; err != nil || got != want {
		t.Fatalf("parsePerftest = %v, %v; want %v", got, err, want)
	}
	if _, err := parsePerftest("UCX  ERROR server failed. bind() failed: Address already in use"); err == nil {
		t.Fatal("parsePerftest of an error: no error")
	}
}

// TestTransferSuiteUCX: kvmesh bench transfer --transport ucx measures the
// one-sided path beside ucx_perftest and kvmesh's TCP path; a build
// without UCX reports it skipped, not failed.
func TestTransferSuiteUCX(t *testing.T) {
	s := &TransferSuite{Options: TransferOptions{Transport: "ucx", UCXTransports: []string{"tcp"}, BlockSizes: []int{256 << 10}, Batches: 2,
		BatchBytes: 1 << 20, SourceBytes: 2 << 20, PerftestIters: 20}}
	res, err := s.Run(context.Background(), &Env{})
	if err != nil {
		t.Fatal(err)
	}
	if !transfer.UCXBuilt {
		if len(res.Skipped) != 1 || len(res.Tables) != 0 {
			t.Fatalf("without UCX: skipped %+v, tables %d; want the UCX path skipped", res.Skipped, len(res.Tables))
		}
		return
	}
	rows := table[transferRow](t, res, "transfer_ucx")
	var sawUCX bool
	for _, r := range rows {
		if r.GBps <= 0 || r.UCXTLS != "tcp" {
			t.Errorf("row %+v", r)
		}
		if r.Path == "kvmesh-ucx" {
			sawUCX = r.RatioVsKvmeshTCP != nil
		}
	}
	if !sawUCX {
		t.Fatalf("no kvmesh-ucx row with its ratio to TCP: %+v", rows)
	}
}
