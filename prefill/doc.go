// Package prefill is the bundled prefill engine: a Llama-style decoder in
// float32 (RMSNorm, RoPE, grouped-query attention, SwiGLU, final norm, LM
// head; the Mistral and Qwen variants of it) that asks the cache for the longest cached prefix of a prompt, loads
// those blocks' K/V, computes only the suffix, and publishes the new blocks.
//
// # The loop
//
// Engine.Prefill(ctx, tokens, session):
//
//  1. computes the prompt's chain of block keys (prefixhash.Keys under the
//     engine's namespace) and asks Cache.LongestPrefix once;
//  2. fetches those blocks with one Cache.Get, verifies each (block.Decode:
//     checksums and key = H(parent ‖ tokens); Header.CheckNamespace;
//     Header.CheckTokens: the stored parent and tokens are the prompt's; the
//     key is the one asked for) and copies its payload into the sequence's KV;
//  3. runs the model on the suffix only: every new position attends to the
//     cached positions and causally to the new ones;
//  4. queues the new full blocks for the publisher and returns the last
//     position's logits, their top 5 token ids, TTFT, and usage
//     {prompt_tokens, cached_tokens}.
//
// The partial block at the end of a prompt is never cached. When every block
// is cached the last position is still computed, from its cached K/V and
// those before it, so that logits exist; cached_tokens is then
// prompt_tokens−1, the positions that were not computed.
//
// # Decode
//
// Engine.Generate(ctx, prompt, opts) runs the prompt as above and then
// decodes: it samples a token from the last logits (greedy at temperature
// 0; else softmax(logits/T) cut to the top-p nucleus, drawn from a PCG
// seeded by opts.Seed), feeds it back as the next position — one Forward of
// one token, its K/V appended to the prompt's in the same KV — and repeats
// until MaxTokens or a stop sequence (token-level; tokens that may start
// one are held back from the stream until they cannot). The prompt's
// blocks are published as soon as it is computed, and the full blocks of
// prompt and answer once decoding ends, so a conversation's next turn hits
// its previous answer too. One generation holds one slot from its prefill
// to its last token: the CPU engine decodes one sequence at a time, without
// batching. The tokens depend only on prompt, options and weights, never on
// where the prefix came from (tested against cold engines and prefills).
//
// # Speculative decoding
//
// With Options.Speculative a proposer guesses up to K tokens per step —
// prompt lookup (SpeculateNgram: what followed the last earlier occurrence
// of the sequence's last 2..4 tokens) or a draft model of the same
// vocabulary (SpeculateDraft, an engine of its own whose blocks are cached
// under its own namespace) — and one Forward over K+1 positions returns the
// logits of every one of them, so the model verifies the guesses at once.
// The longest accepted prefix is kept, then the model's own next token:
// greedy, a guess is accepted when it is the model's top token, so the
// tokens equal those without speculation; sampling, the standard rejection
// rule (accept with min(1, p/q), else draw from max(p−q, 0)) keeps every
// token distributed as the model's alone (chi-square tested). The K/V of a
// rejected guess is overwritten by the next step and never published.
// Generation.Proposed and Accepted, and Stats, count the guesses.
//
// # Invariants
//
// A prefix hit changes the cost, never the answer: the logits with any hit
// equal the cold logits to float32 tolerance (tested against a float64
// reference model, for random prompts and split points). A cache fault —
// lookup or fetch error, missing block, block that fails verification — is a
// miss from that block on: the rest is recomputed, counted in Stats, and never
// an error to the caller. Blocks are only ever read under the engine's
// namespace, which is derived from the model's shape and a digest of its
// weights (Config.Namespace, Weights.Digest), so another model, or the same
// shape with other weights, or another tenant salt, never shares a block.
//
// Block payloads are [layer][kv_head][K|V][token][head_dim] float32,
// little-endian, keys after RoPE: block.Layout of the namespace, the whole
// model's KV (a tensor-parallel rank's heads are one run per layer). A KV
// holds [layer][K|V][token][kv_head][head_dim], the order attention reads,
// so loading or publishing a block copies one head_dim run per token, head
// and tensor.
//
// # Weights
//
// From a Hugging Face model directory (LoadConfigJSON, LoadCheckpoint,
// Options.ModelDir): config.json of a llama, mistral, qwen2 or qwen3 model
// and its safetensors, one file or shards named by an index, in F32, BF16
// or F16. The files are memory-mapped, checked whole (a truncated file, a
// missing shard, a shape that is not config.json's, a dtype it cannot load
// are refused by name), and each tensor is widened to float32 once into
// one anonymous mapping off the Go heap, laid out so that Q, K, V and gate,
// up stack without a copy: a BF16 checkpoint takes twice its file's size
// in memory (Config.WeightBytes, bounded by Options.MaxModelBytes). Tied
// embeddings share one matrix. Qwen2's q/k/v biases, Qwen3's q/k RMSNorms,
// Mistral's sliding window (a plain window mask in every layer), and RoPE
// scaling (linear, llama3, yarn) are part of the forward pass and of the
// namespace. The loader and forward pass are checked against an
// independent PyTorch implementation written from transformers' published
// definitions (prefilltest's hfref.py), logits within 1e-3 of their scale,
// cold and over cached prefixes. Also from a single F32 safetensors file
// with Llama tensor names (LoadWeights; ReadSafetensors/WriteSafetensors are
// a complete F32 reader and writer), or by default generated from a seed
// (SeededWeights): the same bits on every machine, pinned by golden tests,
// no download.
//
// # Compute
//
// A Backend loads weights into a Model whose Forward computes a range of
// positions given the K/V before it, in host memory. The CPU backend runs its
// matrix products on gonum's Sgemm, which spreads them over GOMAXPROCS
// goroutines; attention runs in tiles (a query tile of one KV head's stacked
// query heads against key tiles up to its last position, online softmax), so
// the upper triangle is never computed, and tiles are spread over the
// backend's threads.
//
// The device backend (NewDevice, `kvmesh serve --backend cuda`) runs the same
// forward pass with one difference: the products with weight matrices (QKV,
// output, gate+up, down, LM head) run on a GPU through a gpumem.BLAS —
// cuBLAS on CUDA, loaded by package gpu, or gpu/gputest's fake in tests. Its
// weights are uploaded once, at Load; each product uploads its input rows
// through pinned memory, multiplies and downloads its output, on a stream of
// its forward pass. As a first step, RMSNorm, RoPE, attention (its products
// and softmax), SwiGLU and the K/V cache stay on the host between the
// products, so the K/V a block is published from are already in host memory.
// Both backends share every line but the products (cpuModel, with a pass
// per backend), and the default build tests the device backend's dispatch
// against the CPU backend on a fake device; on a GPU, gpu's cuda tests
// compare the two. Nothing of it has run on a GPU yet.
//
// # Foreground and background
//
// Prefill is foreground work: someone waits for its first token.
// PrefillBackground is for work nobody waits on (queued requests) and obeys
// one rule: it computes only while no foreground prefill is waiting or
// running, and it never delays one beyond a fraction of a chunk. It computes
// its suffix in chunks of Options.BackgroundBlocks blocks; the first
// foreground prefill to arrive cancels the chunk in flight, which stops at
// the forward pass's next check of its context (before each layer, after
// each large product, before each attention key tile) and is computed again
// once the last foreground prefill has returned. Background chunks run on
// slots of their own, so the foreground never waits for one to stop; they
// share the cores only for that short tail (products are cut to about 32
// MFLOP, a few ms). After the last foreground prefill returns, background
// work waits Options.BackgroundGrace (5ms) before it computes again, so
// that the answer goes out and the next request of a burst gets in first;
// a server holds the engine (Hold) for the whole of a synchronous request,
// decoding and answering included. The K/V computed so far stay in
// the background call's memory while it waits, and each chunk's full blocks
// are published as soon as it is done, so a background prefill that is
// abandoned (a shutdown) resumes from the cache when it is run again. Under
// a continuous foreground load background work starves; that is the rule.
//
// # Concurrency
//
// Engine is safe for concurrent use. Options.Concurrency (default 1)
// foreground prefills run at once, each with its own KV and scratch; the
// others wait for a slot or their context (background prefills have as many
// slots of their own). One prefill already uses every core, so more would only
// split them. Publishing is off the request path: one publisher goroutine,
// owned by the Engine, encodes queued blocks (block.Encode) and calls
// Cache.Put; the queue is bounded (Options.PublishQueue) and a prefill that
// finds it full drops its blocks and counts them, it never waits. Close
// cancels in-flight prefills and Puts, waits for them and for the publisher,
// and drops what is still queued; Flush waits for the queue to drain.
package prefill
