package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/openai"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// prefillJSON is what kvmesh prefill -o json prints. A synchronous prefill
// and a finished queued one always have usage, ttft_ms and top_tokens.
type prefillJSON struct {
	RequestID string        `json:"request_id,omitempty"`
	State     string        `json:"state"`
	Usage     *client.Usage `json:"usage,omitempty"`
	TTFTMs    *float64      `json:"ttft_ms,omitempty"`
	QueueMs   *float64      `json:"queue_ms,omitempty"`
	TopTokens []uint32      `json:"top_tokens,omitempty"`
	Error     string        `json:"error,omitempty"`
	Model     string        `json:"model,omitempty"`
	Session   string        `json:"session,omitempty"`
}

func newPrefillJSON(r client.PrefillResult) prefillJSON {
	out := prefillJSON{RequestID: r.RequestID, State: r.State, Error: r.Error, Model: r.Model, Session: r.Session}
	if r.State == client.PrefillDone {
		u := r.Usage
		ttft := float64(r.TTFT) / float64(time.Millisecond)
		out.Usage, out.TTFTMs, out.TopTokens = &u, &ttft, r.TopTokens
	}
	if r.RequestID != "" && r.State != client.PrefillQueued {
		q := float64(r.QueueWait) / float64(time.Millisecond)
		out.QueueMs = &q
	}
	return out
}

func (f *inspectFlags) printPrefill(cmd *cobra.Command, r client.PrefillResult) error {
	out := newPrefillJSON(r)
	if err := f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
		if r.RequestID != "" {
			fmt.Fprintf(w, "request\t%s\n", r.RequestID)
		}
		fmt.Fprintf(w, "state\t%s\n", r.State)
		switch r.State {
		case client.PrefillDone:
			frac := 0.0
			if r.Usage.PromptTokens > 0 {
				frac = float64(r.Usage.CachedTokens) / float64(r.Usage.PromptTokens)
			}
			fmt.Fprintf(w, "prompt\t%d tokens, %d cached (%.1f%%)\n", r.Usage.PromptTokens, r.Usage.CachedTokens, 100*frac)
			fmt.Fprintf(w, "ttft\t%.1f ms\n", *out.TTFTMs)
			if out.QueueMs != nil {
				fmt.Fprintf(w, "queued\t%.1f ms\n", *out.QueueMs)
			}
			fmt.Fprintf(w, "top tokens\t%s\n", tokenPreview(r.TopTokens))
		case client.PrefillFailed:
			fmt.Fprintf(w, "error\t%s\n", r.Error)
		default:
			fmt.Fprintf(w, "next\tkvmesh prefill result %s --wait\n", r.RequestID)
		}
		if r.Session != "" {
			fmt.Fprintf(w, "session\t%s\n", r.Session)
		}
		fmt.Fprintf(w, "model\t%s\n", r.Model)
	}); err != nil {
		return err
	}
	if r.State == client.PrefillFailed {
		return fmt.Errorf("queued request %s failed: %s", r.RequestID, r.Error)
	}
	return nil
}

func prefillCmd() *cobra.Command {
	f := &inspectFlags{}
	var text, tokens, session string
	var queue, wait bool
	c := &cobra.Command{
		Use:   "prefill (--text T | --tokens 1,2,3)",
		Short: "Run a prompt through the node's prefill engine: cached tokens, time to first token, top tokens",
		Long: `Run a prompt through the node's bundled prefill engine. The node looks up the
longest cached prefix (its blocks, wherever the cache holds them), computes only
the rest, publishes the new blocks, and answers with the usage
{prompt_tokens, cached_tokens}, the time to first token and the five most likely
next tokens. Run the same prompt twice and the second is mostly cached.

--text is tokenized byte by byte: each UTF-8 byte of T is one token id (0..255).
--tokens takes token ids.

--queue enqueues the prompt instead: the node runs it when no synchronous
prefill is waiting (the queue survives a restart) and this prints its request
id. Add --wait to wait for the result, or ask later:

  kvmesh prefill --queue --text "..."          prints the request id
  kvmesh prefill result ID [--wait]            its state, and its result once done

-o json prints {"usage":{"prompt_tokens":N,"cached_tokens":M},"ttft_ms":T,"top_tokens":[...],...};
a queued request adds "request_id", "state" and "queue_ms".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			toks, err := promptTokens(cmd, text, tokens)
			if err != nil {
				return err
			}
			if wait && !queue {
				return errors.New("--wait waits for a queued request; add --queue (a synchronous prefill always waits)")
			}
			var res client.PrefillResult
			err = f.withNode(cmd, func(ctx context.Context, c *client.Client) (err error) {
				res, err = c.Prefill(ctx, client.PrefillRequest{Tokens: toks, Session: session, Queue: queue})
				if err == nil && wait {
					res, err = c.WaitResult(ctx, res.RequestID, 0)
					err = f.waitError(err, res.RequestID)
				}
				return err
			})
			if err != nil {
				return err
			}
			return f.printPrefill(cmd, res)
		},
	}
	f.registerConn(c, 5*time.Minute)
	fs := c.Flags()
	fs.StringVar(&text, "text", "", "the prompt as text, one token per UTF-8 byte")
	fs.StringVar(&tokens, "tokens", "", "the prompt as token ids: 1,2,3")
	fs.StringVar(&session, "session", "", "session id: a routing hint (also sent as x-session-affinity); hits never depend on it")
	fs.BoolVar(&queue, "queue", false, "enqueue the prompt and print its request id")
	fs.BoolVar(&wait, "wait", false, "with --queue: wait for the result (up to --timeout)")
	c.AddCommand(prefillResultCmd(f))
	return c
}

func prefillResultCmd(f *inspectFlags) *cobra.Command {
	var wait bool
	c := &cobra.Command{
		Use:   "result ID",
		Short: "The state of a queued prefill request, and its result once done",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res client.PrefillResult
			err := f.withNode(cmd, func(ctx context.Context, c *client.Client) (err error) {
				if wait {
					res, err = c.WaitResult(ctx, args[0], 0)
					return f.waitError(err, args[0])
				}
				res, err = c.GetResult(ctx, args[0])
				return err
			})
			if err != nil {
				return err
			}
			return f.printPrefill(cmd, res)
		},
	}
	c.Flags().BoolVar(&wait, "wait", false, "wait until the request is done or failed (up to --timeout)")
	return c
}

// registerConn registers --addr, -o, --timeout and the TLS and token flags
// on c and its subcommands.
func (f *inspectFlags) registerConn(c *cobra.Command, timeout time.Duration) {
	pf := c.PersistentFlags()
	pf.StringVar(&f.addr, "addr", node.DefaultGRPCAddr, "gRPC address HOST:PORT of the node")
	pf.StringVarP(&f.output, "output", "o", "table", "table or json")
	pf.DurationVar(&f.timeout, "timeout", timeout, "how long to wait for the node (and for a result)")
	f.sec.register(pf)
}

// waitError says how to go on waiting for a queued request whose wait ran
// out; other errors pass.
func (f *inspectFlags) waitError(err error, id string) error {
	if errors.Is(err, context.DeadlineExceeded) || status.Code(errors.Unwrap(err)) == codes.DeadlineExceeded {
		return fmt.Errorf("request %s is not done after --timeout %v; wait more with 'kvmesh prefill result %s --wait'", id, f.timeout, id)
	}
	return err
}

// promptTokens applies the environment to c's flags and reads the prompt
// of --text or --tokens (one of them).
func promptTokens(c *cobra.Command, text, tokens string) ([]uint32, error) {
	if err := envLayer(c); err != nil {
		return nil, err
	}
	switch {
	case (text == "") == (tokens == ""):
		return nil, errors.New("give the prompt as --text T or as --tokens 1,2,3 (one of them)")
	case text != "":
		return textTokens(text), nil
	}
	return parseTokens(tokens)
}

// namespaceFlagNames are the flags of namespaceFlags.
var namespaceFlagNames = []string{"model", "dtype", "block-tokens", "layers", "kv-heads", "head-dim", "tp-rank", "tp-size", "tenant-salt",
	"kv-layout", "latent-dim", "scales", "lora", "key-scheme", "hash-seed", "extra-key-bytes", "groups"}

// namespaceGiven reports whether any namespace flag of c was set, on the
// command line or in the environment.
func namespaceGiven(c *cobra.Command) bool {
	for _, name := range namespaceFlagNames {
		if _, env := os.LookupEnv(envName(name)); c.Flags().Changed(name) || env {
			return true
		}
	}
	return false
}

// lookupNamespace is the namespace inspect lookup asks about: the flags'
// when one is given, else the node's prefill engine's, else (a node with
// no engine) the demo namespace.
func lookupNamespace(ctx context.Context, c *client.Client, given bool, nf *namespaceFlags) (prefixhash.Namespace, error) {
	if given {
		return nf.namespace()
	}
	eng, err := c.Engine(ctx)
	switch {
	case errors.Is(err, client.ErrNoEngine):
		return defaultNamespace, nil
	case err != nil:
		return prefixhash.Namespace{}, err
	}
	return eng.Namespace, nil
}

// namespaceRow is one namespace of inspect stats.
type namespaceRow struct {
	Digest string `json:"digest"`
	Model  string `json:"model,omitempty"`
	Blocks uint64 `json:"blocks"`
	Tokens uint64 `json:"cached_tokens"`
	Bytes  uint64 `json:"bytes"`
}

func printNamespaces(w *tabwriter.Writer, rows []namespaceRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nNAMESPACE\tMODEL\tBLOCKS\tCACHED TOKENS\tBYTES")
	for _, r := range rows {
		model := r.Model
		if model == "" {
			model = "(unknown to this node)"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", r.Digest, model, r.Blocks, r.Tokens, formatSize(int64(r.Bytes)))
	}
}

// prefillServeFlags are serve's flags for the prefill engine, each mapped
// to a node.PrefillOptions field.
type prefillServeFlags struct {
	enabled          bool
	weights          string
	seed             uint64
	maxContext       int
	concurrency      int
	queue            int
	queueBytes       int64
	resultTTL        time.Duration
	maxResults       int
	backgroundBlocks int
	role             string
	backend          string
	modelDir         string
	maxModelBytes    int64
	batch            openai.BatchOptions
	queueShare       float64
	speculative      string
	specTokens       int
	draftDir         string
}

func init() {
	for field, flag := range map[string]string{
		"Prefill.WeightsPath": "prefill-weights", "Prefill.Seed": "prefill-seed", "Prefill.Model": "prefill-max-context",
		"Prefill.Concurrency": "prefill-concurrency", "Prefill.QueueSize": "prefill-queue", "Prefill.QueueBytes": "prefill-queue-bytes", "Prefill.ResultTTL": "prefill-result-ttl",
		"Prefill.MaxResults": "prefill-max-results", "Prefill.BackgroundBlocks": "prefill-background-blocks",
		"Prefill.Role": "role", "Prefill.ModelDir": "prefill-model-dir", "Prefill.Backend": "backend",
		"Prefill.MaxModelBytes":     "max-model-bytes",
		"Prefill.Batch.MaxRequests": "queue-max-requests", "Prefill.Batch.MaxBodyBytes": "queue-max-body",
		"Prefill.Batch.TenantQueued": "queue-tenant-quota", "Prefill.Batch.MaxQueued": "queue-max-queued",
		"Prefill.Batch.ResultTTL": "queue-result-ttl", "Prefill.Batch.CallbackAllow": "callback-allow",
		"Prefill.Batch.Share": "queue-share", "Prefill.Batch.StealInterval": "queue-steal-interval",
		"Prefill.Batch.LeaseTTL": "queue-lease",
		"Prefill.Speculative":    "speculative", "Prefill.SpeculativeTokens": "speculative-tokens", "Prefill.DraftDir": "speculative-draft",
	} {
		flagOf[field] = flag
	}
}

func (p *prefillServeFlags) register(fs *pflag.FlagSet, d node.PrefillOptions) {
	fs.BoolVar(&p.enabled, "prefill", !d.Disabled, "serve the bundled prefill engine (--prefill=false turns it off)")
	fs.StringVar(&p.modelDir, "prefill-model-dir", d.ModelDir, "Hugging Face model directory (llama, mistral, qwen2, qwen3) to serve instead of the seeded model: config.json, model.safetensors or model.safetensors.index.json with its shards (F32, BF16, F16), generation_config.json, tokenizer.json and tokenizer_config.json (its chat template)")
	fs.Var(newSize(&p.maxModelBytes, d.MaxModelBytes), "max-model-bytes", "refuse to start when the model's weights take more memory than this once loaded (float32); 0: the machine's memory")
	fs.StringVar(&p.weights, "prefill-weights", d.WeightsPath, "safetensors file of the engine's weights (default: weights generated from --prefill-seed)")
	fs.Uint64Var(&p.seed, "prefill-seed", d.Seed, "seed of the generated weights; nodes share blocks only with the same seed")
	fs.IntVar(&p.maxContext, "prefill-max-context", d.Model.MaxContext, "longest prompt the engine accepts, in tokens")
	fs.IntVar(&p.concurrency, "prefill-concurrency", d.Concurrency, "synchronous prefills that run at once")
	fs.IntVar(&p.queue, "prefill-queue", d.QueueSize, "most queued prefill requests not yet done (one tenant: half)")
	fs.Var(newSize(&p.queueBytes, d.QueueBytes), "prefill-queue-bytes", "most bytes of queued prefill requests not yet done, 4 a prompt token (one tenant: half)")
	fs.DurationVar(&p.resultTTL, "prefill-result-ttl", d.ResultTTL, "how long a queued request's result is kept")
	fs.IntVar(&p.maxResults, "prefill-max-results", d.MaxResults, "most queued requests' results kept")
	fs.IntVar(&p.backgroundBlocks, "prefill-background-blocks", d.BackgroundBlocks, "blocks per chunk of queued work (a synchronous prefill preempts it within one)")
	fs.IntVar(&p.batch.MaxRequests, "queue-max-requests", d.Batch.MaxRequests, "most requests in one batch of POST /v1/queue (more: 413)")
	fs.Var(newSize(&p.batch.MaxBodyBytes, d.Batch.MaxBodyBytes), "queue-max-body", "largest body of POST /v1/queue (larger: 413)")
	fs.IntVar(&p.batch.TenantQueued, "queue-tenant-quota", d.Batch.TenantQueued, "most queued requests (POST /v1/queue) of one tenant not yet answered (more: 429 with Retry-After)")
	fs.IntVar(&p.batch.MaxQueued, "queue-max-queued", d.Batch.MaxQueued, "most queued requests (POST /v1/queue) of all tenants not yet answered (more: 503)")
	fs.DurationVar(&p.batch.ResultTTL, "queue-result-ttl", d.Batch.ResultTTL, "how long a finished batch's responses are kept (then GET /v1/queue/{id} is 404)")
	fs.StringSliceVar(&p.batch.CallbackAllow, "callback-allow", d.Batch.CallbackAllow, "hosts (HOST: its scheme's default port only, or HOST:PORT) a queued batch's callback_url may name, checked at submission and at each delivery, which goes to the address the host resolves to then (never a loopback or link-local one unless listed); others are refused (default none: no callbacks)")
	fs.StringVar(&p.backend, "backend", node.BackendCPU, "what runs the prefill engine's model: cpu, or cuda (its matrix products through cuBLAS on CUDA device --gpu; needs a build with -tags cuda, kvmesh-cuda.so beside it and a GPU, else serve refuses to start and says which is missing)")
	fs.Float64Var(&p.queueShare, "queue-share", d.Batch.Share, "share of the engine's slots (--prefill-concurrency) queued batches may run on at once, at least one request; each runs only while no synchronous request does and yields to one between chunks and decode steps; 0: none here (peers pull this node's batches)")
	fs.DurationVar(&p.batch.StealInterval, "queue-steal-interval", d.Batch.StealInterval, "how often a node gossips its queued batches nobody runs, and an idle node asks up to two peers that gossip some for one (0 or less: never)")
	fs.DurationVar(&p.batch.LeaseTTL, "queue-lease", d.Batch.LeaseTTL, "how long a batch a peer pulled from this node stays with it without news; then it runs again elsewhere from its first unanswered request")
	fs.StringVar(&p.speculative, "speculative", d.Speculative, "speculative decoding: off, ngram (prompt lookup: guesses what followed the last tokens earlier in the prompt or answer) or draft (a smaller model of the same tokenizer, --speculative-draft, guesses); the answer is the model's own either way")
	fs.IntVar(&p.specTokens, "speculative-tokens", d.SpeculativeTokens, "tokens the proposer guesses per decode step, verified in one forward pass (1..16)")
	fs.StringVar(&p.draftDir, "speculative-draft", d.DraftDir, "Hugging Face model directory of the draft model of --speculative draft (same tokenizer.json and vocabulary as the model)")
	fs.StringVar(&p.role, "role", gossip.RoleBoth, "what kvmesh route sends this node: both, prefill (prompts to compute and publish) or decode (requests whose prompt a prefill node just published)")
}

func (p *prefillServeFlags) options() node.PrefillOptions {
	o := node.PrefillOptions{
		Disabled: !p.enabled, WeightsPath: p.weights, Seed: p.seed,
		Concurrency: p.concurrency, QueueSize: p.queue, QueueBytes: p.queueBytes, ResultTTL: p.resultTTL, MaxResults: p.maxResults,
		BackgroundBlocks: p.backgroundBlocks, Role: p.role, Backend: p.backend, ModelDir: p.modelDir, Batch: p.batch,
		MaxModelBytes: p.maxModelBytes, Speculative: p.speculative, SpeculativeTokens: p.specTokens, DraftDir: p.draftDir,
	}
	o.Batch.Share = p.queueShare
	if p.queueShare <= 0 {
		o.Batch.Share = -1 // none: the flag's 0 is the option's negative
	}
	if p.batch.StealInterval <= 0 {
		o.Batch.StealInterval = -1
	}
	o.Model.MaxContext = p.maxContext
	return o
}

// engineLine describes the prefill engine for serve's banner.
func engineLine(o node.PrefillOptions) string {
	if o.Disabled {
		return "off"
	}
	weights := fmt.Sprintf("seed %d", o.Seed)
	if o.WeightsPath != "" {
		weights = o.WeightsPath
	}
	if o.ModelDir != "" {
		return fmt.Sprintf("model directory %s (config.json, safetensors, tokenizer files); context at most %d; queue %d; role %s; backend %s",
			o.ModelDir, o.Model.MaxContext, o.QueueSize, o.Role, o.Backend)
	}
	m := o.Model
	return strings.Join([]string{
		fmt.Sprintf("%d layer(s), d=%d, %d heads (%d KV) of %d, FFN %d, vocab %d, context %d", m.Layers, m.Dim, m.Heads, m.KVHeads, m.HeadDim, m.FFNDim, m.Vocab, m.MaxContext),
		weights, fmt.Sprintf("queue %d", o.QueueSize), "role " + o.Role, "backend " + o.Backend,
	}, "; ")
}
