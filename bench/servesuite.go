package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// The routing policies of `kvmesh route --policy`.
const (
	policyTokens  = "tokens"
	policyRandom  = "random"
	policySession = "session"
)

// ServeOptions configure the serve suite. Defaults: full run, then --quick.
type ServeOptions struct {
	// Nodes behind the router. Default 3.
	Nodes int
	// Sessions is the number of agentic sessions; Turns the requests of
	// each. Defaults 12 and 6; quick 6 and 4.
	Sessions, Turns int
	// Concurrency is how many sessions run at once. Default 3.
	Concurrency int
	// SystemBytes is the prompt every session starts with (tool
	// definitions: shared by all); TurnBytes what each turn appends (a tool
	// result, a user message). Defaults 1024 and 256 (byte tokens).
	SystemBytes, TurnBytes int
	// MaxTokens each turn generates. Default 16.
	MaxTokens int
	// Policies are the router's policies measured, side by side. Default
	// tokens, random, session.
	Policies []string
	// OverheadProbes is the number of small requests sent both straight
	// to a node and through the router, to measure what the router adds.
	// Default 100; quick 40.
	OverheadProbes int
	// SplitBytes is the prompt of the disaggregation measurement: prefilled
	// on one node, answered on another, against a cold answer; SplitRuns
	// how many of each. Defaults 4096 and 3; quick 2048 and 2.
	SplitBytes, SplitRuns int
	// Backlog, when set, runs the backlog variant instead (runBacklog): the
	// sessions alone and beside Backlog queued requests (POST /v1/queue)
	// on the same nodes, and the backlog drained alone; on one node unless
	// Nodes says otherwise (several nodes on one small machine share its
	// cores, so one node's queued work slows another's synchronous
	// requests, which separate machines would not). Default 0.
	Backlog int
}

// EnsureDefaults fills zero fields.
func (o *ServeOptions) EnsureDefaults(quick bool) {
	def := func(p *int, full, q int) {
		if *p == 0 {
			*p = full
			if quick {
				*p = q
			}
		}
	}
	def(&o.Nodes, 3, 3)
	def(&o.Sessions, 12, 6)
	def(&o.Turns, 6, 4)
	def(&o.Concurrency, 3, 3)
	def(&o.SystemBytes, 1024, 1024)
	def(&o.TurnBytes, 256, 256)
	def(&o.MaxTokens, 16, 16)
	def(&o.OverheadProbes, 100, 40)
	def(&o.SplitBytes, 4096, 2048)
	def(&o.SplitRuns, 3, 2)
	if len(o.Policies) == 0 {
		o.Policies = []string{policyTokens, policyRandom, policySession}
	}
}

// ServeSuite is `kvmesh bench serve`: agentic multi-turn sessions (each turn
// appends to the previous prompt) sent through `kvmesh route` over a
// cluster, streamed through the OpenAI-compatible API, once per routing
// policy. It reports the cached-token ratio against the ideal (the prompt
// blocks an unbounded cache would hold: those computed by requests that
// had answered), TTFT p50/p99 as the client sees it (the first streamed
// token), and generated tokens per second, for token-aware routing, random
// routing and session affinity; and what the router adds to a request's
// latency. The nodes and the router are processes (`kvmesh serve`, `kvmesh
// route`). Each policy runs on fresh prompts (its own system prompt) and
// its own router, so no policy inherits another's cache or load.
type ServeSuite struct{ Options ServeOptions }

// Name implements Suite.
func (*ServeSuite) Name() string { return "serve" }

func (*ServeSuite) notInAll() {}

type serveRow struct {
	Policy        string  `json:"policy"`
	Requests      int     `json:"requests" table:"wide"`
	PromptTokens  int     `json:"prompt_tokens"`
	CachedTokens  int     `json:"cached_tokens"`
	IdealCached   int     `json:"ideal_cached_tokens"`
	CachedVsIdeal float64 `json:"cached_vs_ideal"`
	TTFTp50       float64 `json:"ttft_p50_ms"`
	TTFTp99       float64 `json:"ttft_p99_ms"`
	TokensPerSec  float64 `json:"tokens_per_s"`
	Errors        int     `json:"errors" table:"nonzero"`
}

type overheadRow struct {
	Path  string  `json:"path"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Count uint64  `json:"requests"`
}

// Run implements Suite.
func (s *ServeSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	if o.Backlog > 0 && o.Nodes == 0 {
		o.Nodes = 1
	}
	o.EnsureDefaults(env.Quick)
	res := &Result{Suite: s.Name()}
	if len(env.Addrs) > 0 {
		res.Skip("serve", errors.New("--addr: the serve suite starts its own nodes (it needs their gossip addresses)"))
		return res, nil
	}
	if env.Binary == "" {
		return res, fmt.Errorf("%w: run it as `kvmesh bench serve`", ErrNoBinary)
	}
	args := []string{"--gossip-profile", "local"}
	if o.Backlog > 0 {
		args = append(args, "--queue-steal-interval", "100ms")
	}
	ds, err := StartDaemons(ctx, DaemonOptions{Binary: env.Binary, Dir: env.WorkDir, Nodes: o.Nodes, Join: true, Args: args})
	if err != nil {
		return res, err
	}
	defer ds.Close()
	if o.Backlog > 0 {
		return s.runBacklog(ctx, env, ds, o, res)
	}
	bar := env.Progress.Bar(int64(len(o.Policies)*o.Sessions*o.Turns+2*o.OverheadProbes+2*o.SplitRuns), "serve")
	defer bar.Finish()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	var rows []serveRow
	var routerAddr string
	for _, policy := range o.Policies {
		bar.Describe("serve: " + policy)
		raddr, stop, err := startBenchRouter(ctx, env.Binary, ds, policy, o.Nodes)
		if err != nil {
			return res, err
		}
		row, err := runSessions(ctx, hc, "http://"+raddr, policy, o, bar)
		if policy == policyTokens {
			routerAddr = raddr
			// Keep this router for the overhead probes below.
			defer stop()
		} else {
			stop()
		}
		if err != nil {
			return res, err
		}
		rows = append(rows, row)
	}
	res.AddTable("sessions", fmt.Sprintf("%d agentic sessions of %d turns (%d-byte shared prefix, +%d bytes a turn, %d tokens generated), %d at once, through the router over %d nodes",
		o.Sessions, o.Turns, o.SystemBytes, o.TurnBytes, o.MaxTokens, o.Concurrency, o.Nodes), rows)
	var session *serveRow
	for i := range rows {
		if rows[i].Policy == policySession {
			session = &rows[i]
		}
	}
	for _, r := range rows {
		if r.Policy == policySession {
			continue
		}
		res.Checks = append(res.Checks, NewCheck("serve: "+r.Policy+" routing vs ideal cached ratio", "cached_tokens / ideal_cached_tokens", r.CachedVsIdeal, ">=", 0.98, "kvmesh"))
		if session != nil && session.CachedVsIdeal > 0 {
			res.Checks = append(res.Checks, NewCheck("serve: "+r.Policy+" routing vs session affinity", "cached_vs_ideal / session's", r.CachedVsIdeal/session.CachedVsIdeal, ">=", 0.99, "kvmesh"))
		}
	}
	if routerAddr != "" {
		bar.Describe("serve: router overhead")
		direct, routed, err := probeOverhead(ctx, hc, "http://"+ds.List()[0].HTTPAddr, "http://"+routerAddr, o.OverheadProbes, bar)
		if err != nil {
			return res, err
		}
		res.AddTable("router", "the same small cached completion (1 token) straight to a node and through the router, alternating", []overheadRow{
			{Path: "node", P50: direct.Quantile(0.5), P99: direct.Quantile(0.99), Count: direct.Count()},
			{Path: "router", P50: routed.Quantile(0.5), P99: routed.Quantile(0.99), Count: routed.Count()},
		})
		res.Checks = append(res.Checks, NewCheck("serve: router overhead p50", "router p50 − node p50 (ms)", routed.Quantile(0.5)-direct.Quantile(0.5), "<=", 1, "kvmesh"))
	}
	bar.Describe("serve: prefill on one node, decode on another")
	split, err := measureSplit(ctx, hc, "http://"+ds.List()[0].HTTPAddr, "http://"+ds.List()[1].HTTPAddr, o, bar)
	if err != nil {
		return res, err
	}
	res.AddTable("split", fmt.Sprintf("a %d-token prompt answered (streamed, 16 tokens) by node 2: cold, or after node 1 computed and published it (what kvmesh route does across --role prefill and decode nodes); p50 of %d runs",
		o.SplitBytes, o.SplitRuns), split)
	res.Note("Ideal: the prompt's leading full blocks that a request of the same run which had answered before this one was sent computed (what an unbounded cache would hold), at most prompt−1 tokens, as the engine counts. Generated text is not fed back: each turn appends a fixed tool result, so ideal and measured count the same blocks.")
	res.Note("TTFT is the client's: from sending the request to the router to the first streamed token.")
	return res, nil
}

// startBenchRouter starts `kvmesh route` with policy in front of ds and
// waits until it routes to every node. stop ends it.
func startBenchRouter(ctx context.Context, binary string, ds *Daemons, policy string, nodes int) (addr string, stop func(), err error) {
	cmd := exec.Command(binary, "route", "--http-addr", "127.0.0.1:0", "--join", ds.List()[0].GossipAddr,
		"--gossip-profile", "local", "--policy", policy, "--log-level", "error")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVMESH_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	stderr := &tailBuffer{max: 8 << 10}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	setDeathSignal(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("bench: serve: start %s route: %w", binary, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "openai" {
				addrc <- strings.TrimSuffix(strings.TrimPrefix(f[1], "http://"), "/v1")
			}
		}
	}()
	deadline := time.After(30 * time.Second)
	select {
	case addr = <-addrc:
	case <-exited:
		return "", nil, fmt.Errorf("bench: serve: kvmesh route exited: %s", stderr.lastLines(5))
	case <-deadline:
		stop()
		return "", nil, errors.New("bench: serve: kvmesh route did not say where it serves within 30s")
	}
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), fmt.Sprintf("ok %d nodes", nodes)) {
				return addr, stop, nil
			}
		}
		select {
		case <-deadline:
			stop()
			return "", nil, fmt.Errorf("bench: serve: the router did not see %d nodes within 30s", nodes)
		case <-ctx.Done():
			stop()
			return "", nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// serveText returns n bytes of printable text drawn from seed.
func serveText(seed uint64, n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz ,.;:()[]{}=+-*/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	b := make([]byte, n)
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = alphabet[x%uint64(len(alphabet))]
	}
	return string(b)
}

// idealCache is the unbounded cache the measured one is compared with: a
// prompt may hit the leading full blocks of the prompts whose requests had
// answered before it was sent (a request in flight has not computed its
// blocks yet, for any cache).
type idealCache struct {
	mu   sync.Mutex
	seen map[prefixhash.Key]bool
	ns   prefixhash.Namespace
}

// cached returns the tokens of prompt an unbounded cache holds now, at
// most len(prompt)−1, as the engine counts.
func (c *idealCache) cached(prompt string) int {
	keys := prefixhash.Keys(c.ns, bytesTokens(prompt))
	c.mu.Lock()
	defer c.mu.Unlock()
	hit := 0
	for hit < len(keys) && c.seen[keys[hit]] {
		hit++
	}
	return min(hit*c.ns.BlockTokens, len(prompt)-1)
}

// add records that prompt's blocks were computed.
func (c *idealCache) add(prompt string) {
	keys := prefixhash.Keys(c.ns, bytesTokens(prompt))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		c.seen[k] = true
	}
}

func bytesTokens(s string) []uint32 {
	t := make([]uint32, len(s))
	for i := range len(s) {
		t[i] = uint32(s[i])
	}
	return t
}

// runSessions runs o.Sessions sessions of o.Turns turns through the router
// at url, o.Concurrency at once, each turn streamed.
func runSessions(ctx context.Context, hc *http.Client, url, policy string, o ServeOptions, bar Bar) (serveRow, error) {
	ideal := &idealCache{seen: map[prefixhash.Key]bool{}, ns: prefixhash.Namespace{Model: "bench/serve-ideal", DType: prefixhash.Float32,
		BlockTokens: 64, Layers: 1, KVHeads: 1, HeadDim: 64}}
	system := serveText(uint64(len(policy))*7919+uint64(policy[0]), o.SystemBytes) // each policy its own prefix
	var (
		ttft                                   Latency
		prompt, cached, idealSum, gen, nerrors atomic.Int64
		firstErr                               error
		errOnce                                sync.Once
	)
	work := make(chan int)
	var wg sync.WaitGroup
	began := time.Now()
	for range o.Concurrency {
		wg.Go(func() {
			for s := range work {
				history := system
				for turn := range o.Turns {
					history += fmt.Sprintf("\n[session %d turn %d] ", s, turn) + serveText(uint64(s*1000+turn)+uint64(len(policy)), o.TurnBytes)
					want := ideal.cached(history)
					u, first, n, err := streamCompletion(ctx, hc, url, history, o.MaxTokens, fmt.Sprintf("%s-%d", policy, s))
					ideal.add(history)
					bar.Add(1)
					if err != nil {
						nerrors.Add(1)
						errOnce.Do(func() { firstErr = err })
						continue
					}
					ttft.Record(first)
					prompt.Add(int64(u.PromptTokens))
					cached.Add(int64(u.PromptTokensDetails.CachedTokens))
					idealSum.Add(int64(want))
					gen.Add(int64(n))
				}
			}
		})
	}
	for s := range o.Sessions {
		select {
		case work <- s:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return serveRow{}, err
	}
	wall := time.Since(began)
	row := serveRow{Policy: policy, Requests: o.Sessions * o.Turns, PromptTokens: int(prompt.Load()), CachedTokens: int(cached.Load()),
		IdealCached: int(idealSum.Load()), TTFTp50: ttft.Quantile(0.5), TTFTp99: ttft.Quantile(0.99),
		TokensPerSec: float64(gen.Load()) / wall.Seconds(), Errors: int(nerrors.Load())}
	if row.IdealCached > 0 {
		row.CachedVsIdeal = float64(row.CachedTokens) / float64(row.IdealCached)
	}
	if row.Errors == row.Requests && firstErr != nil {
		return row, fmt.Errorf("bench: serve: every request failed: %w", firstErr)
	}
	return row, nil
}

type serveUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// streamCompletion sends one streamed completion and returns its usage,
// the time to its first token, and the tokens generated.
func streamCompletion(ctx context.Context, hc *http.Client, url, prompt string, maxTokens int, session string) (serveUsage, time.Duration, int, error) {
	body, _ := json.Marshal(map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": maxTokens, "temperature": 0,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return serveUsage{}, 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-affinity", session)
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return serveUsage{}, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return serveUsage{}, 0, 0, fmt.Errorf("bench: serve: status %d: %s", resp.StatusCode, b)
	}
	var (
		first time.Duration
		u     serveUsage
		done  bool
	)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if first == 0 {
			first = time.Since(t0)
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Usage *serveUsage `json:"usage"`
			Error *struct{ Message string }
		}
		if json.Unmarshal([]byte(data), &ev) == nil {
			if ev.Error != nil {
				return serveUsage{}, 0, 0, fmt.Errorf("bench: serve: %s", ev.Error.Message)
			}
			if ev.Usage != nil {
				u = *ev.Usage
			}
		}
	}
	if !done {
		return serveUsage{}, 0, 0, fmt.Errorf("bench: serve: the stream ended without [DONE]: %v", sc.Err())
	}
	return u, first, u.CompletionTokens, nil
}

// probeOverhead sends the same cached one-token completion alternately to
// a node and through the router.
func probeOverhead(ctx context.Context, hc *http.Client, direct, routed string, n int, bar Bar) (*Latency, *Latency, error) {
	body, _ := json.Marshal(map[string]any{"model": "kvmesh", "prompt": serveText(5, 200), "max_tokens": 1, "temperature": 0})
	call := func(url string) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("bench: serve: probe: status %d", resp.StatusCode)
		}
		return time.Since(t0), nil
	}
	// Warm both paths and the cache.
	for _, u := range []string{direct, routed, direct} {
		if _, err := call(u); err != nil {
			return nil, nil, err
		}
	}
	var d, r Latency
	for i := range 2 * n {
		url, l := direct, &d
		if i%2 == 1 {
			url, l = routed, &r
		}
		t, err := call(url)
		if err != nil {
			return nil, nil, err
		}
		l.Record(t)
		bar.Add(1)
	}
	return &d, &r, nil
}

type splitRow struct {
	Case          string  `json:"case"`
	CachedTokens  int     `json:"cached_tokens"`
	TTFTp50       float64 `json:"ttft_p50_ms"`
	PrefillNodeMs float64 `json:"prefill_node_p50_ms"`
	VsCold        float64 `json:"ttft_vs_cold"`
}

// measureSplit times the first streamed token of a prompt on node b when
// node a has just computed and published it (PublishHeader: a answers once
// the blocks are pushed), against the same on a fresh prompt.
func measureSplit(ctx context.Context, hc *http.Client, a, b string, o ServeOptions, bar Bar) ([]splitRow, error) {
	var cold, warm, pre Latency
	cached := 0
	for run := range o.SplitRuns {
		p := serveText(uint64(90000+2*run), o.SplitBytes)
		u, first, _, err := streamCompletion(ctx, hc, b, p, o.MaxTokens, "")
		if err != nil {
			return nil, err
		}
		if u.PromptTokensDetails.CachedTokens != 0 {
			return nil, fmt.Errorf("bench: serve: a fresh prompt had %d cached tokens", u.PromptTokensDetails.CachedTokens)
		}
		cold.Record(first)
		bar.Add(1)

		p = serveText(uint64(90000+2*run+1), o.SplitBytes)
		body, _ := json.Marshal(map[string]any{"model": "kvmesh", "prompt": p, "max_tokens": 1, "temperature": 0})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, a+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("X-Kvmesh-Publish", "wait")
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("bench: serve: prefill node: status %d", resp.StatusCode)
		}
		pre.Record(time.Since(t0))
		u, first, _, err = streamCompletion(ctx, hc, b, p, o.MaxTokens, "")
		if err != nil {
			return nil, err
		}
		warm.Record(first)
		cached = u.PromptTokensDetails.CachedTokens
		bar.Add(1)
	}
	c := cold.Quantile(0.5)
	return []splitRow{
		{Case: "cold on node 2", TTFTp50: c, VsCold: 1},
		{Case: "prefilled on node 1", CachedTokens: cached, TTFTp50: warm.Quantile(0.5), PrefillNodeMs: pre.Quantile(0.5), VsCold: warm.Quantile(0.5) / c},
	}, nil
}
