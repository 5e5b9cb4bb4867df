package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// queueCall is one exchange with a node's /v1/queue.
func queueCall(t *testing.T, method, url string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("%s %s: %d, not JSON: %v", method, url, resp.StatusCode, err)
	}
	return resp.StatusCode, m
}

// TestQueueKill9: a batch acknowledged with 202 completes after its node is
// killed with SIGKILL and restarted on the same data dir: its status
// answers as it did before the kill (never back to unknown), and every
// request is answered, as the same request is synchronously.
func TestQueueKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	d := startDaemon(t, dir)
	req := map[string]any{"model": "kvmesh", "prompt": strings.Repeat("a prompt that survives a crash ", 6), "max_tokens": 24, "temperature": 0}
	reqs := []any{req, req, req, req}
	code, sub := queueCall(t, "POST", "http://"+d.http+"/v1/queue", map[string]any{"requests": reqs})
	id, _ := sub["request_id"].(string)
	if code != http.StatusAccepted || id == "" || sub["status"] != "queued" {
		t.Fatalf("POST /v1/queue: %d %v", code, sub)
	}
	status := func(d *daemon) (string, map[string]any) {
		code, m := queueCall(t, "GET", "http://"+d.http+"/v1/queue/"+id, nil)
		if code != http.StatusOK {
			t.Fatalf("GET /v1/queue/%s: %d %v:\n%s", id, code, m, d.stderr)
		}
		s, _ := m["status"].(string)
		return s, m
	}
	// Kill it as soon as the batch runs (or, on a fast machine, is done).
	deadline := time.Now().Add(60 * time.Second)
	before, _ := status(d)
	for before == "queued" && time.Now().Before(deadline) {
		before, _ = status(d)
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.exited

	d = startDaemon(t, dir)
	after, m := status(d)
	t.Logf("killed with the batch %s; after the restart it is %s", before, after)
	if after != before && !(before == "running" && after == "completed") && !(before == "queued" && after == "running") {
		t.Errorf("status %s before the kill, %s after the restart", before, after)
	}
	deadline = time.Now().Add(120 * time.Second)
	for (after == "queued" || after == "running") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // polling, as a client does
		after, m = status(d)
	}
	resps, _ := m["responses"].([]any)
	if after != "completed" || len(resps) != len(reqs) {
		t.Fatalf("after the restart the batch is %s with %d responses: %v\n%s", after, len(resps), m, d.stderr)
	}
	_, sync := queueCall(t, "POST", "http://"+d.http+"/v1/completions", req)
	want := sync["choices"].([]any)[0].(map[string]any)["text"]
	for i, r := range resps {
		c, _ := r.(map[string]any)["choices"].([]any)
		if len(c) != 1 || c[0].(map[string]any)["text"] != want {
			t.Errorf("response %d: %v, want the text %q", i, r, want)
		}
	}
	// kvmesh inspect queue lists it.
	out, err := exec.Command(binary(t), "inspect", "queue", "--http-addr", d.http, "-o", "json").CombinedOutput()
	var listed []map[string]any
	if err != nil || json.Unmarshal(out, &listed) != nil || len(listed) != 1 || listed[0]["request_id"] != id ||
		listed[0]["status"] != "completed" || listed[0]["answered"] != float64(len(reqs)) {
		t.Errorf("kvmesh inspect queue: %v: %s", err, out)
	}
	table, err := exec.Command(binary(t), "inspect", "queue", "--http-addr", d.http).CombinedOutput()
	if err != nil || !strings.Contains(string(table), id) {
		t.Errorf("kvmesh inspect queue (table): %v: %s", err, table)
	}
	// The restarted node answered at most the requests not answered before.
	resp, err := http.Get("http://" + d.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	done := metricOf(string(body), `kvmesh_queue_requests_total{outcome="completed"}`)
	if before == "completed" && done > 0 || done > float64(len(reqs)) {
		t.Errorf("the restarted node completed %v requests of a batch that was %s before", done, before)
	}
}
