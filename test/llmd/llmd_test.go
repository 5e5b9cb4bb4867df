package llmd

import (
	"context"
	"log/slog"
	"math"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// ns is a vllm-scheme namespace of 64 KiB blocks of 16 tokens: a 4 MiB
// DRAM tier holds about 60 of them.
var ns = prefixhash.Namespace{Model: "llmd/model", DType: prefixhash.Float32, BlockTokens: 16, Layers: 2, KVHeads: 2, HeadDim: 128,
	Scheme: prefixhash.SchemeVLLM, HashSeed: "0"}

func prompt(seed, blocks int) ([]uint32, [][]byte) {
	tokens := make([]uint32, blocks*ns.BlockTokens)
	for i := range tokens {
		tokens[i] = uint32(seed*100000 + i)
	}
	payloads := make([][]byte, blocks)
	for i := range payloads {
		payloads[i] = make([]byte, ns.BlockBytes())
		payloads[i][0] = byte(seed)
	}
	return tokens, payloads
}

// near: llm-d's scores are sums of tier weights.
func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// kvmeshNode is a kvmesh node publishing KV events, and a client of it.
type kvmeshNode struct {
	id  string
	pub string
	c   *client.Client
}

// startNode serves a kvmesh node (no cluster: each its own pod for llm-d)
// with a 4 MiB DRAM tier over 64 MiB of NVMe, until the test ends.
func startNode(t *testing.T, id string) kvmeshNode {
	t.Helper()
	n, err := node.Open(node.Options{NodeID: id, DataDir: t.TempDir(),
		Listen:  node.ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0"},
		Cluster: node.ClusterOptions{GossipAddr: "127.0.0.1:0"},
		Tiers:   node.TierOptions{DRAMBytes: 4 << 20, NVMeBytes: 64 << 20},
		Limits:  node.LimitOptions{MaxBlockBytes: 1 << 20},
		Events:  node.EventOptions{Addr: "tcp://127.0.0.1:0"},
		Logger:  slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- n.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })
	c, err := client.Dial(n.GRPCAddr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	pub, _ := n.KVEventsAddrs()
	return kvmeshNode{id: id, pub: pub, c: c}
}

// TestLLMDIndexesKVMeshEvents: llm-d's indexer, subscribed to two kvmesh
// nodes, indexes the blocks a client puts into each under that node's pod
// and the model, as "cpu"; llm-d's longest-prefix scorer ranks the node
// that holds a prompt above the other (also when both hold its first
// blocks); demoted blocks show as "disk" (and no longer "cpu"); a dropped
// namespace's are gone.
func TestLLMDIndexesKVMeshEvents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodes := []kvmeshNode{startNode(t, "kvmesh-0"), startNode(t, "kvmesh-1")}

	// llm-d logs through controller-runtime; KVMESH_TEST_LOGS=1 with -v shows it.
	logger := logr.Discard()
	if testing.Verbose() && os.Getenv("KVMESH_TEST_LOGS") != "" {
		logger = funcr.New(func(p, a string) { t.Log(p, a) }, funcr.Options{Verbosity: 10})
	}
	ctrllog.SetLogger(logger)
	// llm-d's indexer, as its kv-cache service wires it, on the nodes' events.
	index, err := kvblock.NewInMemoryIndex(nil)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: ns.BlockTokens, HashSeed: ns.HashSeed})
	if err != nil {
		t.Fatal(err)
	}
	scorer, err := kvcache.NewKVBlockScorer(kvcache.DefaultKVBlockScorerConfig())
	if err != nil {
		t.Fatal(err)
	}
	pool := kvevents.NewPool(&kvevents.Config{TopicFilter: "kv@", Concurrency: 1}, index, tp, engineadapter.NewVLLMAdapter())
	pool.Start(ctx)
	defer pool.Shutdown(context.Background())
	subs := kvevents.NewSubscriberManager(pool)
	defer subs.Shutdown(context.Background())
	for _, n := range nodes {
		if err := subs.EnsureSubscriber(ctx, n.id, n.pub, "kv@", true); err != nil {
			t.Fatal(err)
		}
	}

	put := func(n kvmeshNode, seed, blocks int) []uint32 {
		t.Helper()
		tokens, payloads := prompt(seed, blocks)
		if _, err := n.c.Lookup(ctx, ns, client.Prompt{Tokens: tokens}); err != nil { // names the namespace: its model is the topic's
			t.Fatal(err)
		}
		if _, err := n.c.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatal(err)
		}
		return tokens
	}
	// lookup returns the prompt's block keys as llm-d computes them and what
	// its index holds of them.
	lookup := func(tokens []uint32) ([]kvblock.BlockHash, map[kvblock.BlockHash][]kvblock.PodEntry) {
		t.Helper()
		keys, err := tp.TokensToKVBlockKeys(kvblock.EmptyBlockHash, tokens, ns.Model, nil)
		if err != nil {
			t.Fatal(err)
		}
		found, err := index.Lookup(ctx, keys, nil)
		if err != nil {
			return keys, nil
		}
		return keys, found
	}
	// tiers: per block of the prompt, the tiers pod holds it in.
	tiers := func(pod string, tokens []uint32) []map[string]bool {
		keys, found := lookup(tokens)
		out := make([]map[string]bool, len(keys))
		for i, k := range keys {
			out[i] = map[string]bool{}
			for _, e := range found[k] {
				if e.PodIdentifier == pod {
					out[i][e.DeviceTier] = true
				}
			}
		}
		return out
	}
	scores := func(tokens []uint32) map[string]float64 {
		t.Helper()
		keys, found := lookup(tokens)
		s, err := scorer.Score(ctx, keys, found)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// A PUB drops what it sends before a subscription lands: each node puts
	// probes (a new one every 20 ms) until one shows.
	seed := 1000
	for _, n := range nodes {
		var probes [][]uint32
		last := time.Time{}
		testkit.WaitFor(t, "llm-d to index a probe of "+n.id, func() bool {
			if time.Since(last) > 20*time.Millisecond {
				seed++
				probes = append(probes, put(n, seed, 1))
				last = time.Now()
			}
			for _, p := range probes {
				if tiers(n.id, p)[0]["cpu"] {
					return true
				}
			}
			return false
		})
	}

	// Prompt 1 whole on kvmesh-0 and its first two blocks on kvmesh-1;
	// prompt 2 on kvmesh-1 only.
	one := put(nodes[0], 1, 4)
	put(nodes[1], 1, 2)
	two := put(nodes[1], 2, 4)
	testkit.WaitFor(t, "llm-d to score prompt 1 on kvmesh-0 above kvmesh-1, and prompt 2 on kvmesh-1 only", func() bool {
		s1, s2 := scores(one), scores(two)
		return s1["kvmesh-0"] > s1["kvmesh-1"] && s1["kvmesh-1"] > 0 && s2["kvmesh-1"] > 0 && s2["kvmesh-0"] == 0
	})
	// Whole prompts in DRAM: 4 blocks at llm-d's "cpu" weight (0.8) and 2.
	s1 := scores(one)
	if !near(s1["kvmesh-0"], 4*0.8) || !near(s1["kvmesh-1"], 2*0.8) {
		t.Errorf("llm-d's scores of prompt 1: %v, want kvmesh-0 3.2 and kvmesh-1 1.6", s1)
	}
	for i, tr := range tiers("kvmesh-0", one) {
		if !tr["cpu"] || len(tr) != 1 {
			t.Errorf("prompt 1's block %d on kvmesh-0 in llm-d's index as %v, want cpu", i, tr)
		}
	}

	// More prompts than DRAM holds: the oldest blocks, prompt 1's, move to
	// NVMe: a BlockRemoved CPU and a BlockStored DISK each.
	for s := 3; s < 33; s++ {
		put(nodes[0], s, 4)
	}
	testkit.WaitFor(t, "prompt 1's first block on kvmesh-0's NVMe (disk) only", func() bool {
		tr := tiers("kvmesh-0", one)[0]
		return tr["disk"] && !tr["cpu"]
	})

	// Dropping the namespace on kvmesh-0: AllBlocksCleared on its topic,
	// which llm-d applies to the whole pod (vLLM's meaning: the engine's
	// cache reset). kvmesh-1's blocks stay.
	if _, err := nodes[0].c.DropNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "prompt 1 gone from kvmesh-0 in the index", func() bool {
		for _, tr := range tiers("kvmesh-0", one) {
			if len(tr) > 0 {
				return false
			}
		}
		return true
	})
	if s := scores(two); !near(s["kvmesh-1"], 4*0.8) || len(s) != 1 {
		t.Errorf("llm-d's scores of prompt 2 after kvmesh-0's drop: %v, want kvmesh-1 3.2 only", s)
	}
}
