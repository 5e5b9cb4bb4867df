package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefill"
)

// onNodes measures the prefill engines of kvmesh nodes through the Go
// client: for every prompt, the producer node prefills its cached fraction
// (its engine publishes the blocks, its node pushes them to their owners),
// and once the consumer node sees them all, the consumer prefills the whole
// prompt. TTFT is the consumer engine's own (from the call to the logits).
// Every run uses fresh prompts, since the consumer publishes what it
// computed. A node without a prefill engine is an error wrapping
// client.ErrNoEngine.
func (s *PrefillSuite) onNodes(ctx context.Context, env *Env, o PrefillOptions, res *Result, bar Bar) ([]prefillRow, string, error) {
	where := "by node 1 of a 2-node cluster, the prompt then prefilled by node 2"
	ds, addrs, stop, err := startNodes(ctx, env, DaemonOptions{Nodes: 2, Join: true})
	var unavailable *clusterUnavailable
	if errors.As(err, &unavailable) {
		res.Skip("prefill on another node", err)
		where = "by the same node (this build cannot join nodes)"
		ds, addrs, stop, err = startNodes(ctx, env, DaemonOptions{Nodes: 1})
	}
	if err != nil {
		return nil, "", err
	}
	defer stop()
	switch {
	case len(env.Addrs) > 0:
		where = fmt.Sprintf("through %s, the prompt then through %s (--addr)", addrs[0], addrs[len(addrs)-1])
	case len(addrs) == 1:
		where = "by the same node"
	}
	pool := &clientPool{opts: client.Options{MaxRetries: -1, Timeout: 10 * time.Minute}}
	defer pool.Close()
	producer, err := pool.get(addrs[0])
	if err != nil {
		return nil, "", err
	}
	consumer, err := pool.get(addrs[len(addrs)-1])
	if err != nil {
		return nil, "", err
	}
	eng, err := consumer.Engine(ctx)
	if err != nil {
		return nil, "", err
	}
	cfg := prefill.Config{Layers: eng.Layers, Dim: eng.Dim, Heads: eng.Heads, KVHeads: eng.KVHeads, HeadDim: eng.HeadDim,
		FFNDim: eng.FFNDim, Vocab: eng.Vocab, MaxContext: eng.MaxContext, BlockTokens: eng.BlockTokens}
	cfg.EnsureDefaults()
	n, b := o.PromptTokens, cfg.BlockTokens
	if n > cfg.MaxContext {
		return nil, "", fmt.Errorf("bench: prefill: the nodes' engine takes prompts of at most %d tokens, not %d", cfg.MaxContext, n)
	}
	pid := 0 // the consumer's process, when the bench started it
	if ds != nil {
		pid = ds.List()[len(ds.List())-1].Pid()
	}
	samples := make([][]prefillSample, len(o.Fractions))
	for run := range o.Runs {
		prompts := make([][]uint32, len(o.Fractions))
		for i := range prompts {
			prompts[i] = randomPrompt(uint64(run*len(o.Fractions)+i)+1000, n, cfg.Vocab)
		}
		for i, f := range o.Fractions[1:] {
			bar.Describe(fmt.Sprintf("prefill: node 1 prefills %.0f%%, run %d", 100*f, run+1))
			prefix := prompts[i+1][:int(f*float64(n))/b*b]
			if len(prefix) > 0 {
				if _, err := producer.Prefill(ctx, client.PrefillRequest{Tokens: prefix, Session: "bench-producer"}); err != nil {
					return nil, "", err
				}
				// The producer publishes after it answers and its node pushes
				// the blocks to their owners: wait until the consumer sees
				// them all (or a minute; the row then shows what it saw).
				wait, cancel := context.WithTimeout(ctx, time.Minute)
				for wait.Err() == nil {
					if l, err := consumer.Lookup(wait, eng.Namespace, client.Prompt{Tokens: prefix}); err == nil && l.CachedBlocks == len(prefix)/b {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				cancel()
			}
			bar.Add(1)
		}
		for _, i := range runOrder(run, len(o.Fractions)) {
			bar.Describe(fmt.Sprintf("prefill: node 2, %d tokens, %.0f%% cached, run %d", n, 100*o.Fractions[i], run+1))
			c0 := pidCPU(pid)
			r, err := consumer.Prefill(ctx, client.PrefillRequest{Tokens: prompts[i], Session: "bench-consumer"})
			if err != nil {
				return nil, "", err
			}
			cached := r.Usage.CachedTokens
			samples[i] = append(samples[i], prefillSample{ttft: r.TTFT, cpu: pidCPU(pid) - c0, compute: r.TTFT,
				cachedTokens: cached, flops: cfg.ForwardFLOPs(cached, n-cached)})
			bar.Add(1)
		}
	}
	res.Note("backend kvmesh: `kvmesh serve` processes on 127.0.0.1 with their bundled engine (%s), driven through the Go client; "+
		"ttft_ms is the consumer engine's own TTFT, and engine_gflops its GFLOP over that TTFT; cpu_vs_cold is the consumer "+
		"node's process CPU time during the call (publishing, after it, excluded), when the bench started the node.", eng.Backend)
	return prefillRows(BackendKvmesh, false, cfg, n, o.Fractions, samples),
		fmt.Sprintf("%s (engine %s: %d layer(s), d=%d, %d heads of %d, %d KV head(s), FFN %d; %d-token blocks)",
			where, eng.Backend, cfg.Layers, cfg.Dim, cfg.Heads, cfg.HeadDim, cfg.KVHeads, cfg.FFNDim, b), nil
}
