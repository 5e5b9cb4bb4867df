package llmd

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvmesh/kvmesh/client"
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

// TestLLMDIndexesKVMeshEvents: blocks a client puts into a kvmesh node
// appear in llm-d's index under the node's pod and the model, as "cpu";
// demoted ones as "disk" (and no longer "cpu"); a dropped namespace's are
// gone.
func TestLLMDIndexesKVMeshEvents(t *testing.T) {
	n, err := node.Open(node.Options{NodeID: "kvmesh-0", DataDir: t.TempDir(),
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
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- n.Serve(ctx) }()
	defer func() { cancel(); <-served }()
	c, err := client.Dial(n.GRPCAddr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pub, _ := n.KVEventsAddrs()

	// llm-d logs through controller-runtime; KVMESH_TEST_LOGS=1 with -v shows it.
	logger := logr.Discard()
	if testing.Verbose() && os.Getenv("KVMESH_TEST_LOGS") != "" {
		logger = funcr.New(func(p, a string) { t.Log(p, a) }, funcr.Options{Verbosity: 10})
	}
	ctrllog.SetLogger(logger)
	// llm-d's indexer, as its kv-cache service wires it, on the node's events.
	index, err := kvblock.NewInMemoryIndex(nil)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: ns.BlockTokens, HashSeed: ns.HashSeed})
	if err != nil {
		t.Fatal(err)
	}
	pool := kvevents.NewPool(&kvevents.Config{TopicFilter: "kv@", Concurrency: 1}, index, tp, engineadapter.NewVLLMAdapter())
	pool.Start(ctx)
	defer pool.Shutdown(context.Background())
	subs := kvevents.NewSubscriberManager(pool)
	defer subs.Shutdown(context.Background())
	if err := subs.EnsureSubscriber(ctx, "kvmesh-0", pub, "kv@", true); err != nil {
		t.Fatal(err)
	}

	put := func(seed, blocks int) []uint32 {
		t.Helper()
		tokens, payloads := prompt(seed, blocks)
		if _, err := c.Lookup(ctx, ns, client.Prompt{Tokens: tokens}); err != nil { // names the namespace: its model is the topic's
			t.Fatal(err)
		}
		if _, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatal(err)
		}
		return tokens
	}
	tiers := func(tokens []uint32) []map[string]bool {
		keys, err := tp.TokensToKVBlockKeys(kvblock.EmptyBlockHash, tokens, ns.Model, nil)
		if err != nil {
			t.Fatal(err)
		}
		found, err := index.Lookup(ctx, keys, nil)
		if err != nil {
			return make([]map[string]bool, len(keys))
		}
		out := make([]map[string]bool, len(keys))
		for i, k := range keys {
			out[i] = map[string]bool{}
			for _, e := range found[k] {
				if e.PodIdentifier == "kvmesh-0" {
					out[i][e.DeviceTier] = true
				}
			}
		}
		return out
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// A PUB drops what it sends before a subscription lands: put probes
	// until one shows.
	seed := 1000
	waitFor("llm-d to index a probe", func() bool {
		seed++
		probe := put(seed, 1)
		time.Sleep(50 * time.Millisecond)
		return tiers(probe)[0]["cpu"]
	})

	main := put(1, 4)
	waitFor("the prompt's 4 blocks in DRAM (cpu)", func() bool {
		for _, tr := range tiers(main) {
			if !tr["cpu"] {
				return false
			}
		}
		return true
	})
	// More prompts than DRAM holds: the oldest blocks, the prompt's, move
	// to NVMe: a BlockRemoved CPU and a BlockStored DISK each.
	for s := 2; s < 32; s++ {
		put(s, 4)
	}
	waitFor("the prompt's first block on NVMe (disk) only", func() bool {
		tr := tiers(main)[0]
		return tr["disk"] && !tr["cpu"]
	})

	// Dropping the namespace: AllBlocksCleared on its topic, which llm-d
	// applies to the whole pod (vLLM's meaning: the engine's cache reset).
	if _, err := c.DropNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	waitFor("the prompt gone from the index", func() bool {
		for _, tr := range tiers(main) {
			if len(tr) > 0 {
				return false
			}
		}
		return true
	})
}
