package node

import (
	"fmt"
	"math"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/openai"
	"github.com/kvmesh/kvmesh/prefill"
)

// PrefillOptions configure the node's bundled prefill engine and its queue
// of requests (Options.Prefill). The zero value is the default engine: the
// seeded model of prefill.DefaultConfig, one synchronous prefill at a time,
// a queue of 256 requests whose results are kept for an hour.
type PrefillOptions struct {
	// Disabled turns the engine off: PrefillService is not served and no
	// queue is opened. Default false.
	Disabled bool
	// WeightsPath names a safetensors file with the model's weights
	// (Hugging Face Llama tensor names, float32), shaped as Model. Default
	// "": weights generated from Seed, the same on every machine.
	WeightsPath string
	// ModelDir, when set, names a Hugging Face model directory served
	// instead (llama, mistral, qwen2 or qwen3): config.json (the shape),
	// model.safetensors or model.safetensors.index.json and its shards
	// (F32, BF16 or F16, widened to float32 once: prefill.LoadCheckpoint),
	// generation_config.json (EOS ids, default temperature and top_p) and,
	// if present, tokenizer.json and tokenizer_config.json (package
	// tokenizer: the OpenAI API then tokenizes with it and renders chats
	// with its chat template; without one, as ChatML when the vocabulary
	// has <|im_start|> and <|im_end|>). Model's BlockTokens and MaxContext
	// (as a cap) still apply; WeightsPath and Seed do not. Default "": the
	// seeded model, byte tokens.
	ModelDir string
	// MaxModelBytes bounds the memory the weights of ModelDir or
	// WeightsPath take once loaded (float32, prefill.Config.WeightBytes): a
	// larger model is refused at start, before anything is loaded.
	// Default 0: the machine's physical memory.
	MaxModelBytes int64
	// Seed seeds the generated weights. Every node of a cluster must use
	// the same Seed (and Model) to share blocks: the namespace includes the
	// weights' digest. Default 0.
	Seed uint64
	// Model is the model's shape; zero fields take prefill.DefaultConfig's.
	Model prefill.Config
	// Concurrency is how many synchronous prefills run at once; the others
	// wait. Default 1: one prefill already uses every core.
	Concurrency int
	// QueueSize is the most queued requests not yet done (queued or
	// running); a request beyond it is refused with ResourceExhausted.
	// Default 256.
	QueueSize int
	// QueueBytes is the most bytes the queued requests not yet done may
	// hold (4 bytes a prompt token, and the session id); a request beyond
	// it is refused with ResourceExhausted. One tenant holds at most half
	// of QueueSize and of QueueBytes. Default 64 MiB.
	QueueBytes int64
	// ResultTTL is how long the result of a queued request is kept after it
	// finished; GetResult answers NotFound after that. Default 1h.
	ResultTTL time.Duration
	// MaxResults is the most results kept; past it the oldest are deleted
	// before their TTL. Default 4096.
	MaxResults int
	// BackgroundBlocks is the size in blocks of the chunks queued work is
	// computed in (prefill.Options.BackgroundBlocks): a synchronous request
	// preempts a queued one between two checks within a chunk, and at most
	// one chunk's work is redone. Default 2.
	BackgroundBlocks int
	// MaxWaiting is the most requests of the OpenAI-compatible HTTP API
	// that wait for the engine beyond the Concurrency it runs; one more is
	// answered 429 with Retry-After. Default 64.
	MaxWaiting int
	// Batch bounds the asynchronous API (POST /v1/queue).
	Batch openai.BatchOptions
	// Backend runs the engine's model: BackendCPU (gonum on the host) or
	// BackendCUDA (the products with the weights through cuBLAS on CUDA
	// device Options.GPU; needs a build with -tags cuda, its kvmesh-cuda.so
	// and a GPU, or the node refuses to start and says which is missing).
	// Default BackendCPU.
	Backend string
	// Role is what the node does for a router (kvmesh route), gossiped in
	// its gossip.MemberMeta: gossip.RoleBoth, gossip.RolePrefill (the
	// router sends it prompts to compute and publish) or gossip.RoleDecode
	// (the router sends it requests whose prompt a prefill node has just
	// published: it loads the whole cached prefix and computes only what
	// is missing). A node answers every request it is sent, whatever its
	// role. Default gossip.RoleBoth.
	Role string
	// Speculative is the engine's proposer of speculative decoding
	// (prefill.SpeculativeOptions): prefill.SpeculateOff,
	// prefill.SpeculateNgram (prompt lookup) or prefill.SpeculateDraft (the
	// model of DraftDir). The tokens are those without speculation (greedy)
	// or distributed as them (sampling); only the decode's cost changes.
	// Default prefill.SpeculateOff.
	Speculative string
	// SpeculativeTokens is how many tokens the proposer guesses per step,
	// 1..prefill.MaxSpeculativeTokens. Default
	// prefill.DefaultSpeculativeTokens.
	SpeculativeTokens int
	// DraftDir is the Hugging Face model directory of the draft model
	// (Speculative prefill.SpeculateDraft, and only then): a smaller model
	// of the same tokenizer (its tokenizer.json, if either has one, must be
	// the model's, byte for byte) and vocabulary. Its blocks are cached
	// under a namespace of its own. MaxModelBytes bounds it too.
	DraftDir string
}

// Defaults of PrefillOptions.
const (
	DefaultPrefillQueueSize  = 256
	DefaultPrefillQueueBytes = 64 << 20
	DefaultPrefillResultTTL  = time.Hour
	DefaultPrefillMaxResults = 4096
	DefaultPrefillMaxWaiting = 64
)

// EnsureDefaults fills zero fields with their defaults.
func (o *PrefillOptions) EnsureDefaults() {
	o.Model.EnsureDefaults()
	if o.Concurrency == 0 {
		o.Concurrency = prefill.DefaultConcurrency
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultPrefillQueueSize
	}
	if o.QueueBytes == 0 {
		o.QueueBytes = DefaultPrefillQueueBytes
	}
	if o.ResultTTL == 0 {
		o.ResultTTL = DefaultPrefillResultTTL
	}
	if o.MaxResults == 0 {
		o.MaxResults = DefaultPrefillMaxResults
	}
	if o.BackgroundBlocks == 0 {
		o.BackgroundBlocks = prefill.DefaultBackgroundBlocks
	}
	if o.MaxWaiting == 0 {
		o.MaxWaiting = DefaultPrefillMaxWaiting
	}
	if o.Role == "" {
		o.Role = gossip.RoleBoth
	}
	if o.Backend == "" {
		o.Backend = BackendCPU
	}
	if o.Speculative == "" {
		o.Speculative = prefill.SpeculateOff
	}
	if o.SpeculativeTokens == 0 {
		o.SpeculativeTokens = prefill.DefaultSpeculativeTokens
	}
	o.Batch.EnsureDefaults()
}

// Validate names the first field that cannot work (as "Prefill.Field").
// maxBlockBytes is the node's MaxBlockBytes: the engine's blocks must fit.
func (o *PrefillOptions) Validate(maxBlockBytes int) error {
	bad := func(field, format string, args ...any) error {
		return &OptionError{Field: "Prefill." + field, Msg: fmt.Sprintf(format, args...)}
	}
	if o.Disabled {
		return nil
	}
	if o.ModelDir != "" && o.WeightsPath != "" {
		return bad("ModelDir", "give a model directory or a weights file, not both")
	}
	if o.MaxModelBytes < 0 {
		return bad("MaxModelBytes", "%d is negative", o.MaxModelBytes)
	}
	if err := o.Model.Validate(); err != nil {
		return bad("Model", "%s", err.Error())
	}
	switch {
	case o.Concurrency < 1 || o.Concurrency > 64:
		return bad("Concurrency", "%d is outside 1..64", o.Concurrency)
	case o.QueueSize < 1 || o.QueueSize > 1<<20:
		return bad("QueueSize", "%d is outside 1..%d", o.QueueSize, 1<<20)
	case o.QueueBytes < 64<<10 || o.QueueBytes > 1<<40:
		return bad("QueueBytes", "%d bytes is outside 64KiB..1TiB", o.QueueBytes)
	case o.ResultTTL < time.Second:
		return bad("ResultTTL", "%v is shorter than 1s", o.ResultTTL)
	case o.MaxResults < 1 || o.MaxResults > 1<<24:
		return bad("MaxResults", "%d is outside 1..%d", o.MaxResults, 1<<24)
	case o.BackgroundBlocks < 1 || o.BackgroundBlocks > 1<<16:
		return bad("BackgroundBlocks", "%d is outside 1..%d", o.BackgroundBlocks, 1<<16)
	case o.Backend != BackendCPU && o.Backend != BackendCUDA:
		return bad("Backend", "%q: want %s or %s", o.Backend, BackendCPU, BackendCUDA)
	case o.Role != gossip.RoleBoth && o.Role != gossip.RolePrefill && o.Role != gossip.RoleDecode:
		return bad("Role", "%q: want both, prefill or decode", o.Role)
	case o.Speculative != prefill.SpeculateOff && o.Speculative != prefill.SpeculateNgram && o.Speculative != prefill.SpeculateDraft:
		return bad("Speculative", "%q: want %s, %s or %s", o.Speculative, prefill.SpeculateOff, prefill.SpeculateNgram, prefill.SpeculateDraft)
	case o.SpeculativeTokens < 1 || o.SpeculativeTokens > prefill.MaxSpeculativeTokens:
		return bad("SpeculativeTokens", "%d is outside 1..%d", o.SpeculativeTokens, prefill.MaxSpeculativeTokens)
	case o.Speculative == prefill.SpeculateDraft && o.DraftDir == "":
		return bad("DraftDir", "speculative decoding with a draft model needs its model directory")
	case o.Speculative != prefill.SpeculateDraft && o.DraftDir != "":
		return bad("DraftDir", "a draft model is given, but Speculative is %s, not %s", o.Speculative, prefill.SpeculateDraft)
	case o.MaxWaiting < 0 || o.MaxWaiting > 1<<16:
		return bad("MaxWaiting", "%d is outside 0..%d", o.MaxWaiting, 1<<16)
	case o.Batch.MaxRequests < 1 || o.Batch.MaxRequests > 1<<16:
		return bad("Batch.MaxRequests", "%d is outside 1..%d", o.Batch.MaxRequests, 1<<16)
	case o.Batch.MaxBodyBytes < 1<<10 || o.Batch.MaxBodyBytes > 1<<30:
		return bad("Batch.MaxBodyBytes", "%d is outside 1KiB..1GiB", o.Batch.MaxBodyBytes)
	case o.Batch.TenantQueued < o.Batch.MaxRequests || o.Batch.TenantQueued > o.Batch.MaxQueued:
		// Below MaxRequests, a full batch would be refused forever.
		return bad("Batch.TenantQueued", "%d is outside Batch.MaxRequests (%d)..Batch.MaxQueued (%d)", o.Batch.TenantQueued, o.Batch.MaxRequests, o.Batch.MaxQueued)
	case o.Batch.MaxQueued > 1<<24:
		return bad("Batch.MaxQueued", "%d is over %d", o.Batch.MaxQueued, 1<<24)
	case o.Batch.ResultTTL < time.Second:
		return bad("Batch.ResultTTL", "%v is shorter than 1s", o.Batch.ResultTTL)
	case math.IsNaN(o.Batch.Share) || o.Batch.Share > 1:
		return bad("Batch.Share", "%g is over 1 (a share of the engine; negative: none)", o.Batch.Share)
	case o.Batch.LeaseTTL < 100*time.Millisecond:
		return bad("Batch.LeaseTTL", "%v is shorter than 100ms", o.Batch.LeaseTTL)
	}
	// The namespace's layout does not depend on the weights.
	if size := block.EncodedLen(o.Model.BlockTokens, o.Model.Namespace(0, "").BlockBytes()); size > maxBlockBytes {
		return bad("Model", "its blocks are %d bytes encoded, over MaxBlockBytes (%d)", size, maxBlockBytes)
	}
	return nil
}

// engineOptions returns the prefill engine's options.
func (o *PrefillOptions) engineOptions(n *Node) prefill.Options {
	return prefill.Options{
		Config:           o.Model,
		WeightsPath:      o.WeightsPath,
		ModelDir:         o.ModelDir,
		MaxModelBytes:    o.MaxModelBytes,
		Seed:             o.Seed,
		Concurrency:      o.Concurrency,
		BackgroundBlocks: o.BackgroundBlocks,
		Speculative:      prefill.SpeculativeOptions{Method: o.Speculative, Tokens: o.SpeculativeTokens},
		Logger:           n.log,
	}
}
