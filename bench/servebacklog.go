package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// backlogBatch is the requests per POST /v1/queue of the backlog variant:
// several batches, so that the router spreads them and idle nodes pull
// them from each other.
const backlogBatch = 20

type backlogRow struct {
	Case        string  `json:"case"`
	Queued      int     `json:"queued_requests"`
	SyncReqs    int     `json:"sync_requests"`
	TTFTp50     float64 `json:"sync_ttft_p50_ms"`
	TTFTp99     float64 `json:"sync_ttft_p99_ms"`
	WallS       float64 `json:"wall_s" table:"wide"`
	DrainS      float64 `json:"drain_s"`
	DrainPerSec float64 `json:"drain_req_per_s"`
	Failed      int     `json:"queued_failed" table:"nonzero"`
}

// runBacklog is the serve suite's backlog variant (ServeOptions.Backlog):
// on the same nodes, through one router, the synchronous agentic sessions
// alone; then a backlog of Backlog queued requests (POST /v1/queue, in
// batches of backlogBatch) drained alone; then another such backlog
// submitted just before the same sessions run again (on a fresh prefix).
// It reports the sessions' TTFT p50 with the backlog over without it, and
// the backlog's drain rate (requests over the time from the first
// submission to the last completion) under the synchronous load over
// alone.
func (s *ServeSuite) runBacklog(ctx context.Context, env *Env, ds *Daemons, o ServeOptions, res *Result) (*Result, error) {
	bar := env.Progress.Bar(int64(2*o.Sessions*o.Turns+2*o.Backlog), "serve backlog")
	defer bar.Finish()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	raddr, stop, err := startBenchRouter(ctx, env.Binary, ds, policyTokens, o.Nodes)
	if err != nil {
		return res, err
	}
	defer stop()
	url := "http://" + raddr

	bar.Describe("serve backlog: sessions alone")
	t0 := time.Now()
	alone, err := runSessions(ctx, hc, url, "sync alone", o, bar)
	if err != nil {
		return res, err
	}
	sessions := time.Since(t0)
	bar.Describe("serve backlog: queued requests alone")
	t0 = time.Now()
	ids, err := submitBacklog(ctx, hc, url, "drain", o)
	if err != nil {
		return res, err
	}
	failedAlone, err := waitBacklog(ctx, hc, url, ids, bar)
	if err != nil {
		return res, err
	}
	drainAlone := time.Since(t0)

	bar.Describe("serve backlog: sessions beside queued requests")
	t0 = time.Now()
	if ids, err = submitBacklog(ctx, hc, url, "backlog", o); err != nil {
		return res, err
	}
	with, err := runSessions(ctx, hc, url, "sync with backlog", o, bar)
	if err != nil {
		return res, err
	}
	failedWith, err := waitBacklog(ctx, hc, url, ids, bar)
	if err != nil {
		return res, err
	}
	drainWith := time.Since(t0)

	n := o.Sessions * o.Turns
	rows := []backlogRow{
		{Case: "sessions alone", SyncReqs: n, TTFTp50: alone.TTFTp50, TTFTp99: alone.TTFTp99, WallS: sessions.Seconds()},
		{Case: "queued alone", Queued: o.Backlog, DrainS: drainAlone.Seconds(), DrainPerSec: float64(o.Backlog) / drainAlone.Seconds(), Failed: failedAlone},
		{Case: "sessions + queued", Queued: o.Backlog, SyncReqs: n, TTFTp50: with.TTFTp50, TTFTp99: with.TTFTp99,
			WallS: drainWith.Seconds(), DrainS: drainWith.Seconds(), DrainPerSec: float64(o.Backlog) / drainWith.Seconds(), Failed: failedWith},
	}
	rows[1].WallS = rows[1].DrainS
	res.AddTable("backlog", fmt.Sprintf("%d agentic sessions of %d turns (streamed, %d tokens each), %d at once, through the router over %d nodes, alone and beside %d queued requests (%d-byte prompts with a shared %d-byte prefix, %d tokens each, batches of %d)",
		o.Sessions, o.Turns, o.MaxTokens, o.Concurrency, o.Nodes, o.Backlog, o.SystemBytes+o.TurnBytes, o.SystemBytes, o.MaxTokens, backlogBatch), rows)
	if alone.TTFTp50 > 0 {
		res.Checks = append(res.Checks, NewCheck("serve backlog: sync TTFT p50 with the backlog vs without", "ttft_p50 with / without", with.TTFTp50/alone.TTFTp50, "<=", 1.1, "kvmesh"))
	}
	// The engine's throughput while it serves both: the work of the
	// sessions alone and of the backlog alone, over the time both took
	// together. 1 when mixing them wastes nothing (preempted chunks, idle
	// gaps); the sessions keep the engine busy when alone (they are more
	// at once than engine slots).
	res.Checks = append(res.Checks, NewCheck("serve backlog: engine throughput serving both vs the parts alone", "(sessions wall + drain alone) / drain beside the sessions",
		(sessions.Seconds()+drainAlone.Seconds())/drainWith.Seconds(), ">=", 0.9, "kvmesh"))
	res.Checks = append(res.Checks, NewCheck("serve backlog: raw drain rate beside the sessions vs queued only", "drain_req_per_s with / alone", drainAlone.Seconds()/drainWith.Seconds(), ">=", 0.9, "kvmesh"))
	res.Note("Raw drain rate: the sessions take the engine first, so the backlog drains slower beside them by design; the throughput check counts both kinds of work.")
	res.Note("Queued requests run only while a node's engine has no synchronous request, and give way to one between chunks and decode steps; idle nodes pull batches from busy ones (work stealing). Drain time runs from the first submission to the last completion seen (polled every 50 ms).")
	if alone.Errors+with.Errors > 0 || failedAlone+failedWith > 0 {
		return res, fmt.Errorf("bench: serve backlog: %d synchronous and %d queued requests failed", alone.Errors+with.Errors, failedAlone+failedWith)
	}
	return res, nil
}

// submitBacklog submits o.Backlog queued completions through url, in
// batches, and returns the batches' ids.
func submitBacklog(ctx context.Context, hc *http.Client, url, tag string, o ServeOptions) ([]string, error) {
	system := serveText(uint64(len(tag))*104729+uint64(tag[0]), o.SystemBytes)
	var ids []string
	for start := 0; start < o.Backlog; start += backlogBatch {
		var reqs []any
		for i := start; i < min(start+backlogBatch, o.Backlog); i++ {
			reqs = append(reqs, map[string]any{"model": "kvmesh", "max_tokens": o.MaxTokens, "temperature": 0,
				"prompt": system + fmt.Sprintf("\n[%s %d] ", tag, i) + serveText(uint64(500000+i), o.TurnBytes)})
		}
		body, _ := json.Marshal(map[string]any{"requests": reqs})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/queue", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		var a struct {
			RequestID string `json:"request_id"`
		}
		if resp.StatusCode != http.StatusAccepted || json.Unmarshal(b, &a) != nil || a.RequestID == "" {
			return nil, fmt.Errorf("bench: serve backlog: POST /v1/queue: %d %s", resp.StatusCode, b)
		}
		ids = append(ids, a.RequestID)
	}
	return ids, nil
}

// waitBacklog polls the router's list of batches until every one of ids
// finished, and returns how many of their requests failed.
func waitBacklog(ctx context.Context, hc *http.Client, url string, ids []string, bar Bar) (failed int, err error) {
	left := make(map[string]bool, len(ids))
	for _, id := range ids {
		left[id] = true
	}
	deadline := time.Now().Add(30 * time.Minute)
	for len(left) > 0 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/queue", nil)
		if err != nil {
			return 0, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		var l struct {
			Data []struct {
				RequestID string `json:"request_id"`
				Status    string `json:"status"`
				Requests  int    `json:"requests"`
				Failed    int    `json:"failed"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&l)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("bench: serve backlog: GET /v1/queue: %d %v", resp.StatusCode, err)
		}
		for _, b := range l.Data {
			if left[b.RequestID] && (b.Status == "completed" || b.Status == "cancelled") {
				delete(left, b.RequestID)
				failed += b.Failed
				bar.Add(int64(b.Requests))
			}
		}
		if time.Now().After(deadline) {
			return failed, fmt.Errorf("bench: serve backlog: %d batches still not done after 30 minutes", len(left))
		}
		select {
		case <-ctx.Done():
			return failed, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return failed, nil
}
