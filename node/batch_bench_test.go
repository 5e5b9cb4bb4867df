package node

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/openai"
)

// BenchmarkQueueBacklogTTFT measures what a backlog of queued requests
// costs synchronous ones: the p50 of synchronous completions' TTFT (the
// engine's, slot wait included: X-Kvmesh-Ttft-Ms) alone, and while 200
// queued requests of the same size drain on the same node; and how fast
// the backlog drains alone and under the synchronous load. Run with
//
//	go test -run '^$' -bench BenchmarkQueueBacklogTTFT -benchtime 1x ./node
func BenchmarkQueueBacklogTTFT(b *testing.B) {
	const (
		sync    = 40
		backlog = 200
	)
	for range b.N {
		pn := startPrefillNode(b, b.TempDir(), nil, nil, nil)
		url := apiURL(pn.Node, "/v1/completions")
		req := func(i int, tag string) map[string]any {
			return map[string]any{"model": "kvmesh", "prompt": fmt.Sprintf("%s %d ", tag, i) + strings.Repeat("a fairly long agentic prompt ", 8),
				"max_tokens": 16, "temperature": 0}
		}
		ttfts := func(tag string) float64 {
			var v []float64
			for i := range sync {
				got := callAPI(b, "POST", url, "", req(i, tag))
				ms, err := strconv.ParseFloat(got.header.Get("X-Kvmesh-Ttft-Ms"), 64)
				if got.status != 200 || err != nil {
					b.Fatalf("sync: %d %s", got.status, got.body)
				}
				v = append(v, ms)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		submit := func(tag string) (func() bool, time.Time) {
			reqs := make([]any, backlog)
			for i := range reqs {
				reqs[i] = req(i, tag)
			}
			got := callAPI(b, "POST", apiURL(pn.Node, openai.QueuePath), "", map[string]any{"requests": reqs})
			var a batchAnswer
			if got.status != 202 || !jsonInto(got.body, &a) {
				b.Fatalf("submit: %d %s", got.status, got.body)
			}
			done := func() bool {
				var s batchAnswer
				jsonInto(callAPI(b, "GET", apiURL(pn.Node, openai.QueuePath+"/"+a.RequestID), "", nil).body, &s)
				return s.Status == "completed"
			}
			return done, time.Now()
		}
		wait := func(done func() bool) {
			for deadline := time.Now().Add(10 * time.Minute); !done(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatal("the backlog did not drain in 10 minutes")
				}
			}
		}
		alone := ttfts("alone")
		done, t0 := submit("drain")
		wait(done)
		drainAlone := time.Since(t0)
		done, t0 = submit("backlog")
		with := ttfts("with")
		wait(done)
		drainWith := time.Since(t0)
		b.ReportMetric(alone, "sync-ttft-p50-ms")
		b.ReportMetric(with, "sync-ttft-p50-backlog-ms")
		b.ReportMetric(with/alone, "ttft-ratio")
		b.ReportMetric(float64(backlog)/drainAlone.Seconds(), "drain-alone-req/s")
		b.ReportMetric(float64(backlog)/drainWith.Seconds(), "drain-under-sync-req/s")
		pn.stop(b)
	}
}
