package node

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/openai"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/router"
)

// The router (kvmesh route, package router) in front of nodes.

func startRouter(t *testing.T, join string, policy string) *router.Router {
	t.Helper()
	return startRouterWith(t, router.Options{Join: []string{join}, Policy: policy})
}

func startRouterWith(t *testing.T, opts router.Options) *router.Router {
	t.Helper()
	opts.HTTPAddr, opts.GossipProfile, opts.Logger = "127.0.0.1:0", "local", slog.New(slog.DiscardHandler)
	r, err := router.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	return r
}

// waitRouterNodes waits until the router serves want nodes, as its
// /healthz says.
func waitRouterNodes(t *testing.T, r *router.Router, want int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("the router to see %d nodes", want), func() bool {
		got := callAPI(t, "GET", "http://"+r.HTTPAddr()+"/healthz", "", nil)
		return got.status == http.StatusOK && string(got.body) == fmt.Sprintf("ok %d nodes\n", want)
	})
}

// TestRouterThroughCluster: a router in front of three nodes learns their
// HTTP addresses from gossip, answers completions (whole and streamed) with
// the cold engine's text, reports a repeat's cached tokens whichever node
// serves it, passes errors through, and loses no request when a node dies
// before answering.
func TestRouterThroughCluster(t *testing.T) {
	c := tinyModel()
	nodes := startClusterNodes(t, 3, func(_ int, o *Options) { o.Prefill.Model = c })
	r := startRouter(t, nodes[0].GossipAddr(), router.PolicyTokens)
	waitRouterNodes(t, r, 3)
	url := "http://" + r.HTTPAddr()
	if got := callAPI(t, "GET", url+"/v1/models", "", nil); got.status != 200 {
		t.Fatalf("models through the router: %d %s", got.status, got.body)
	}
	prompt := longText(rand.New(rand.NewPCG(4, 4)), 300)
	req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 16, "temperature": 0}
	want := coldText(t, c, prompt, prefill.GenerateOptions{MaxTokens: 16})
	first := parseCompletion(t, callAPI(t, "POST", url+"/v1/completions", "", req), false)
	if first.Text != want {
		t.Fatalf("through the router: %q, cold %q", first.Text, want)
	}
	for _, n := range nodes {
		n.Node.prefill.engine.Flush(context.Background())
	}
	testkit.WaitFor(t, "the prompt to be cached", func() bool {
		var l openai.LookupResult
		got := callAPI(t, "POST", url+openai.LookupPath+"/completions", "", req)
		return got.status == 200 && jsonInto(got.body, &l) && l.CachedTokens >= 288
	})
	seen := map[string]bool{}
	for i := range 4 {
		got := callAPI(t, "POST", url+"/v1/completions", "", req, SessionHeader, "conv-1")
		rep := parseCompletion(t, got, false)
		seen[got.header.Get("X-Kvmesh-Node")] = true
		if rep.Text != want || rep.Cached < 288 || got.header.Get(SessionHeader) != "conv-1" {
			t.Errorf("repeat %d on %s: %+v (session %q), want the text and ≥ 288 cached", i, got.header.Get("X-Kvmesh-Node"), rep, got.header.Get(SessionHeader))
		}
	}
	req["stream"], req["stream_options"] = true, map[string]any{"include_usage": true}
	if st := parseStream(t, callAPI(t, "POST", url+"/v1/completions", "", req), false); st.Text != want || st.Cached < 288 {
		t.Errorf("streamed through the router: %+v", st)
	}
	if got := callAPI(t, "POST", url+"/v1/completions", "", map[string]any{"model": "nope", "prompt": "x"}); got.status != 404 {
		t.Errorf("an unknown model through the router: %d %s", got.status, got.body)
	}

	// A node dies: the router has not noticed yet, and no request fails.
	nodes[2].crash(t)
	delete(req, "stream")
	delete(req, "stream_options")
	for i := range 6 {
		req["prompt"] = fmt.Sprintf("%s %d", prompt, i)
		if got := callAPI(t, "POST", url+"/v1/completions", "", req); got.status != http.StatusOK {
			t.Errorf("request %d after a node died: %d %s", i, got.status, got.body)
		}
	}
}

// TestRouterSplitsPrefillAndDecode: with a prefill-role and a decode-role
// node, the prefill node computes the prompt and the decode node loads it
// from the cache and computes almost nothing; the text is the cold one and
// the client's cached_tokens is what the prefill node reused. The same
// for a hybrid model, whose prompt the decode node resumes from its
// groups' records (at most its last block computed: the linear layer's
// state is at a block boundary before the last position).
func TestRouterSplitsPrefillAndDecode(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testRouterSplits(t, tinyModel(), tinyModel().BlockTokens-1) })
	t.Run("hybrid", func(t *testing.T) { testRouterSplits(t, hybridModel(), hybridModel().BlockTokens) })
}

// testRouterSplits is TestRouterSplitsPrefillAndDecode for model c, whose
// decode node computes at most most of the prompt's tokens.
func testRouterSplits(t *testing.T, c prefill.Config, most int) {
	roles := []string{gossip.RolePrefill, gossip.RoleDecode}
	nodes := startClusterNodes(t, 2, func(i int, o *Options) { o.Prefill.Model = c; o.Prefill.Role = roles[i] })
	r := startRouter(t, nodes[0].GossipAddr(), router.PolicyTokens)
	waitRouterNodes(t, r, 2)
	url := "http://" + r.HTTPAddr()
	prompt := longText(rand.New(rand.NewPCG(6, 6)), 400)
	for _, stream := range []bool{false, true} {
		msgs := []map[string]any{{"role": "user", "content": fmt.Sprintf("%v %s", stream, prompt)}}
		tmpl := fmt.Sprintf("<|user|>\n%v %s\n<|assistant|>\n", stream, prompt)
		req := map[string]any{"model": "kvmesh", "messages": msgs, "max_tokens": 12, "temperature": 0, "stream": stream,
			"stream_options": map[string]any{"include_usage": true}}
		before := nodes[1].Node.prefill.engine.Stats()
		got := callAPI(t, "POST", url+"/v1/chat/completions", "", req)
		var res completion
		if stream {
			res = parseStream(t, got, true)
		} else {
			res = parseCompletion(t, got, true)
		}
		after := nodes[1].Node.prefill.engine.Stats()
		if want := coldText(t, c, tmpl, prefill.GenerateOptions{MaxTokens: 12}); res.Text != want {
			t.Errorf("stream %v: split text %q, cold %q", stream, res.Text, want)
		}
		if res.Cached != 0 || res.Prompt != len(tmpl) {
			t.Errorf("stream %v: usage %+v, want the prefill node's 0 cached of %d", stream, res, len(tmpl))
		}
		if got.header.Get("X-Kvmesh-Prefill-Node") != nodes[0].ID() || got.header.Get("X-Kvmesh-Node") != nodes[1].ID() {
			t.Errorf("stream %v: prefill on %q, decode on %q; want %s then %s", stream, got.header.Get("X-Kvmesh-Prefill-Node"),
				got.header.Get("X-Kvmesh-Node"), nodes[0].ID(), nodes[1].ID())
		}
		if computed := after.ComputedTokens - before.ComputedTokens; computed > int64(most) {
			t.Errorf("stream %v: the decode node computed %d prompt tokens; want the prompt from the cache (at most %d)", stream, computed, most)
		}
		if got.header.Get("X-Kvmesh-Decode-Node") != nodes[1].ID() || got.header.Get("X-Kvmesh-Prefill-Node-Ms") == "" ||
			(!stream && got.header.Get("X-Kvmesh-Decode-Node-Ms") == "") {
			t.Errorf("stream %v: headers %v lack the decode node or the times", stream, got.header)
		}
		// The same prompt again: the client is told what the prefill node
		// found cached, in the body and the header.
		nodes[0].Node.prefill.engine.Flush(context.Background())
		again := callAPI(t, "POST", url+"/v1/chat/completions", "", req)
		var res2 completion
		if stream {
			res2 = parseStream(t, again, true)
		} else {
			res2 = parseCompletion(t, again, true)
		}
		if res2.Cached < c.BlockTokens || res2.Cached >= len(tmpl) || again.header.Get("X-Kvmesh-Prefill-Cached-Tokens") != fmt.Sprint(res2.Cached) || res2.Text != res.Text {
			t.Errorf("stream %v: the repeat's usage %+v, headers %v; want the prefill node's cached tokens (a block or more, less than the prompt)", stream, res2, again.header)
		}
	}
}

func jsonInto(b []byte, v any) bool { return json.Unmarshal(b, v) == nil }

// TestRouterQueue: a batch submitted through the router is stored by one
// node and polled, to completion, through the router; an unknown id is 404.
func TestRouterQueue(t *testing.T) {
	nodes := startClusterNodes(t, 2, func(_ int, o *Options) { o.Prefill.Model = tinyModel() })
	r := startRouter(t, nodes[0].GossipAddr(), router.PolicyTokens)
	waitRouterNodes(t, r, 2)
	url := "http://" + r.HTTPAddr() + openai.QueuePath
	req := map[string]any{"model": "kvmesh", "prompt": "routed and queued", "max_tokens": 4, "temperature": 0}
	got := callAPI(t, "POST", url, "", map[string]any{"requests": []any{req, req}})
	var a batchAnswer
	if got.status != http.StatusAccepted || json.Unmarshal(got.body, &a) != nil || a.RequestID == "" {
		t.Fatalf("POST through the router: %d %s", got.status, got.body)
	}
	deadline := time.Now().Add(60 * time.Second)
	for a.Status != "completed" && time.Now().Before(deadline) {
		got = callAPI(t, "GET", url+"/"+a.RequestID, "", nil)
		if got.status != http.StatusOK || json.Unmarshal(got.body, &a) != nil {
			t.Fatalf("GET through the router: %d %s", got.status, got.body)
		}
		time.Sleep(10 * time.Millisecond) // polling, as a client does
	}
	if a.Status != "completed" || len(a.Responses) != 2 {
		t.Fatalf("through the router the batch is %+v", a)
	}
	var list openai.QueueList
	if got := callAPI(t, "GET", url, "", nil); got.status != 200 || json.Unmarshal(got.body, &list) != nil ||
		len(list.Data) != 1 || list.Data[0].RequestID != a.RequestID || list.Data[0].Answered != 2 {
		t.Errorf("the list through the router: %d %s", got.status, got.body)
	}
	if got := callAPI(t, "GET", url+"/batch_nope", "", nil); got.status != http.StatusNotFound {
		t.Errorf("unknown id through the router: %d %s", got.status, got.body)
	}
}

// TestRouterEngineEvents: with --engine-events, the router sends a prompt
// to the node whose engine holds its prefix in GPU memory (as the engine's
// KV events say), where without them the nodes tie; the nodes' own KV
// events (the store's tiers) are a source too.
func TestRouterEngineEvents(t *testing.T) {
	nodes := startClusterNodes(t, 2, func(_ int, o *Options) {
		o.Prefill.Model = tinyModel()
		o.Events.Addr = "tcp://127.0.0.1:0"
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	engine := zmq4.NewPub(ctx)
	defer engine.Close()
	if err := engine.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	srcs := []router.EngineEvents{{Addr: "tcp://" + engine.Addr().String(), Member: nodes[1].ID()}}
	for _, n := range nodes {
		pub, _ := n.Node.KVEventsAddrs()
		srcs = append(srcs, router.EngineEvents{Addr: pub})
	}
	r := startRouterWith(t, router.Options{Join: []string{nodes[0].GossipAddr()}, Policy: router.PolicyTokens, EngineEvents: srcs})
	waitRouterNodes(t, r, 2)
	prompt := longText(rand.New(rand.NewPCG(9, 9)), 300)
	req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 4, "temperature": 0}
	var look openai.LookupResult
	got := callAPI(t, "POST", "http://"+nodes[0].HTTPAddr()+openai.LookupPath+"/completions?"+openai.LookupBlocksQuery, "", req)
	if got.status != 200 || !jsonInto(got.body, &look) || len(look.BlockKeys) < 4 || look.BlockTokens == 0 {
		t.Fatalf("lookup with blocks: %d %s", got.status, got.body)
	}
	// The engine of nodes[1] says it holds the prompt's blocks in GPU
	// memory (published until the router's subscription has it).
	ev := kvevents.Event{Tag: kvevents.TagBlockStored, BlockSize: look.BlockTokens, Medium: "GPU"}
	for _, k := range look.BlockKeys {
		h, _ := hex.DecodeString(k)
		ev.BlockHashes = append(ev.BlockHashes, h)
	}
	payload, err := kvevents.Encode(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{ev}})
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	testkit.WaitFor(t, "the router to take the engine's events", func() bool {
		engine.SendMulti(zmq4.NewMsgFrom([]byte("kv@engine@kvmesh"), binary.BigEndian.AppendUint64(nil, seq), payload))
		seq++
		return metricValue(scrape(t, r.HTTPAddr()), "kvmesh_router_engine_events_total") >= 1
	})
	for i := range 4 {
		got := callAPI(t, "POST", "http://"+r.HTTPAddr()+"/v1/completions", "", req)
		if got.status != 200 || got.header.Get("X-Kvmesh-Node") != nodes[1].ID() {
			t.Fatalf("request %d: %d on %q, want %s (its engine holds the prompt)", i, got.status, got.header.Get("X-Kvmesh-Node"), nodes[1].ID())
		}
	}
	// The nodes' own events reach the router: the store's blocks of the prompt.
	testkit.WaitFor(t, "the nodes' KV events", func() bool {
		return metricValue(scrape(t, r.HTTPAddr()), "kvmesh_router_engine_events_total") >= 2
	})
}
