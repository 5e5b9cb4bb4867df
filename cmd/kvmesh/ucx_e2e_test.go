//go:build ucx && linux && cgo

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/client"
)

// TestClusterUCX runs two kvmesh serve processes with --transport ucx over
// each UCX transport every CI machine has (UCX_TLS=tcp, and sm: shared
// memory): a prompt put through A is a hit through B, read byte for byte,
// and the blocks A holds in DRAM reach B by one-sided gets, which both
// nodes' /metrics count (B's reads, A's grants, under transport "ucx");
// inspect members shows each node's fabric.
func TestClusterUCX(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh processes")
	}
	for _, tls := range []string{"tcp", "sm"} {
		t.Run(tls, func(t *testing.T) {
			flags := append(append([]string{}, clusterFlags...), "--transport", "ucx", "--dram", "64MiB")
			start := func(args ...string) *daemon {
				cmd := exec.Command(binary(t), append([]string{"serve", "--data-dir", t.TempDir(),
					"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"},
					append(flags, args...)...)...)
				cmd.Env = append(os.Environ(), "UCX_TLS="+tls)
				return startCommand(t, cmd)
			}
			a := start()
			b := start("--join", a.gossip)
			ca, cb := dialNode(t, a), dialNode(t, b)
			waitMembers(t, cb, 2, a, b)
			ctx := context.Background()

			out, err := exec.Command(binary(t), "inspect", "--addr", b.grpcAddr, "members", "-o", "json").CombinedOutput()
			var members []memberJSON
			if err != nil || json.Unmarshal(out, &members) != nil || len(members) != 2 {
				t.Fatalf("inspect members -o json: %v\n%s", err, out)
			}
			for _, m := range members {
				if !strings.HasPrefix(m.Fabric, "ucx ") {
					t.Errorf("inspect members: %s's fabric is %q, want ucx", m.ID, m.Fabric)
				}
			}

			const prompts, blocks = 4, 8
			for p := range prompts {
				tokens, payloads := e2ePrompt(500+p, blocks)
				if _, err := ca.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
					t.Fatalf("Put through A: %v\n%s", err, a.stderr)
				}
				waitFullHit(t, cb, tokens, blocks)
				got, err := cb.Get(ctx, e2eNS, client.Prompt{Tokens: tokens})
				if err != nil || len(got) != blocks {
					t.Fatalf("Get through B: %d blocks, %v\n%s", len(got), err, b.stderr)
				}
				for i, blk := range got {
					if !bytes.Equal(blk.Payload, payloads[i]) {
						t.Fatalf("prompt %d block %d read through B differs from what was put through A", p, i)
					}
				}
			}
			_, bm := httpGet(t, b.http, "/metrics")
			_, am := httpGet(t, a.http, "/metrics")
			reads, readBytes := seriesValue(bm, `kvmesh_transfer_reads_total{transport="ucx"}`), seriesValue(bm, `kvmesh_transfer_read_bytes_total{transport="ucx"}`)
			granted := seriesValue(am, `kvmesh_transfer_values_total{op="get",transport="ucx"}`)
			if reads <= 0 || readBytes < reads*float64(e2eNS.BlockBytes()) || granted < reads {
				t.Errorf("UCX_TLS=%s: B read %v blocks (%v bytes) one-sidedly, A granted %v: want blocks read over UCX\n%s", tls, reads, readBytes, granted, b.stderr)
			}
			t.Logf("UCX_TLS=%s: B read %v blocks over UCX, %v over TCP", tls, reads, seriesValue(bm, `kvmesh_transfer_reads_total{transport="tcp"}`))
			for _, d := range []*daemon{b, a} {
				if _, err := d.stop(t); err != nil {
					t.Errorf("%s: exit after SIGTERM: %v\n%s", d.id, err, d.stderr)
				}
			}
		})
	}
}

// seriesValue returns the value of one series of a /metrics text (written
// as it appears there), or -1.
func seriesValue(body, series string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return f
			}
		}
	}
	return -1
}
