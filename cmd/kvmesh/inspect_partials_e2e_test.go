package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// TestInspectPartials: a rank's part put over the data plane shows in
// kvmesh inspect partials, with its range, until the other rank's part
// completes the block.
func TestInspectPartials(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a kvmesh process")
	}
	ctx := context.Background()
	d := startDaemon(t, t.TempDir(), "--dram", "64MiB", "--nvme", "64MiB", "--partial-ttl", "10m")
	dc, err := transfer.NewClient(d.dataAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	tokens, payloads := e2ePrompt(7, 1)
	tokens = tokens[:e2eNS.BlockTokens]
	lay := block.LayoutOf(e2eNS)
	record := func(tp int) ([]byte, prefixhash.Key) {
		p, err := block.RankPart(e2eNS, tp, 2, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		part := lay.ExtractPart(nil, payloads[0], len(tokens), p)
		rec, link, err := block.AppendPartHeaderExt(nil, 0, e2eNS, e2eNS.RootLink(), tokens, nil, p, part)
		if err != nil {
			t.Fatal(err)
		}
		return append(rec, part...), link.Key()
	}
	inspect := func() partialsJSON {
		t.Helper()
		out, err := exec.Command(binary(t), "inspect", "--addr", d.grpcAddr, "partials", "-o", "json").CombinedOutput()
		var got partialsJSON
		if err != nil || json.Unmarshal(out, &got) != nil {
			t.Fatalf("inspect partials -o json: %v\n%s", err, out)
		}
		return got
	}
	metrics := func() string {
		t.Helper()
		resp, err := http.Get("http://" + d.http + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(body)
	}
	rec, key := record(0)
	st, err := dc.Put(ctx, []prefixhash.Key{key}, [][]byte{rec})
	if err != nil || st[0] != transfer.StatusOK {
		t.Fatalf("put of rank 0's part: %v, %v", st, err)
	}
	got := inspect()
	if got.Total != 1 || len(got.Blocks) != 1 || got.Blocks[0].Key != key.String() ||
		len(got.Blocks[0].Parts) != 1 || got.Blocks[0].Parts[0] != (partRangeJSON{L0: 0, L1: 8, H0: 0, H1: 4}) ||
		got.Blocks[0].Covered != 32 || got.Blocks[0].Layers != 8 || got.Blocks[0].Heads != 8 {
		t.Fatalf("inspect partials after one of two parts: %+v", got)
	}
	if m := metrics(); metricOf(m, "kvmesh_cache_partials") != 1 || metricOf(m, "kvmesh_cache_partial_bytes") < float64(len(rec)) ||
		metricOf(m, `kvmesh_cache_parts_total{result="stored"}`) != 1 {
		t.Fatalf("metrics after one part:\n%s", m)
	}
	out, err := exec.Command(binary(t), "inspect", "--addr", d.grpcAddr, "partials").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "0-8x0-4") || !strings.Contains(string(out), "32/64") {
		t.Fatalf("inspect partials:\n%s", out)
	}
	rec, _ = record(1)
	if st, err := dc.Put(ctx, []prefixhash.Key{key}, [][]byte{rec}); err != nil || st[0] != transfer.StatusOK {
		t.Fatalf("put of rank 1's part: %v, %v", st, err)
	}
	if got := inspect(); got.Total != 0 || len(got.Blocks) != 0 {
		t.Fatalf("inspect partials after the block completed: %+v", got)
	}
	if m := metrics(); metricOf(m, "kvmesh_cache_partials") != 0 || metricOf(m, `kvmesh_cache_parts_total{result="completed"}`) != 1 ||
		metricOf(m, `kvmesh_cache_parts_total{result="conflict"}`) != 0 || metricOf(m, `kvmesh_cache_claims_total{status="write"}`) != 0 {
		t.Fatalf("metrics after the block completed:\n%s", m)
	}
	res, err := dc.Get(ctx, []prefixhash.Key{key})
	if err != nil || res.Hits() != 1 {
		t.Fatalf("the completed block: %v, %v", res, err)
	}
	res.Release()
}
