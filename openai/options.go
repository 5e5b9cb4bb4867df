package openai

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// Options configure an API. Every field but the peers' is required.
type Options struct {
	// Engine generates the answers.
	Engine *prefill.Engine
	// Tokenizer tokenizes prompts and reads answers back. Default
	// tokenizer.Bytes (UTF-8 bytes as token ids).
	Tokenizer tokenizer.Tokenizer
	// EOS are the model's end-of-sequence ids, which end every answer.
	EOS []uint32
	// Sampling are the model's default temperature and top_p
	// (generation_config.json), used where a request gives none. Default
	// zero: OpenAI's (temperature 1, top_p 1).
	Sampling prefill.SamplingDefaults
	// Concurrency is how many requests the engine runs at once, and
	// MaxWaiting how many more may wait for it; one more is answered 429.
	Concurrency, MaxWaiting int
	// Batch bounds the asynchronous API (POST /v1/queue).
	Batch BatchOptions
	// MaxInFlightBytes bounds, in bytes, what the requests being read and
	// decoded hold at once: each is charged four times its body (its
	// Content-Length, or its endpoint's limit when it has none) before its
	// first byte is read, and one with no room within a second is answered
	// 503 (body.go). Default DefaultMaxInFlightBytes.
	MaxInFlightBytes int64
	// DB keeps the batches, under keys of their own (batches); the caller
	// owns it and closes it after Close.
	DB *pebble.DB
	// DataDir holds the callback secret (DataDir/callback-secret) when
	// CallbackSecret is not set.
	DataDir string
	// CallbackSecret derives the tenants' callback keys (CallbackKey). Set
	// it to a secret every node of the cluster shares (the node derives
	// one from its tokens file's secret, or its gossip key), so that a
	// callback verifies with the same key whichever node delivers it.
	// Default: a secret of this node's own, made once in DataDir.
	CallbackSecret []byte
	// Alone says the node has no peers: its workers pull no batches.
	Alone bool
	// PeerHTTPS, PeerTLS and PeerToken are how the peers' HTTP addresses
	// are reached: over HTTPS with PeerTLS (as the node serves its own),
	// with the cluster credential PeerToken.
	PeerHTTPS bool
	PeerTLS   *tls.Config
	PeerToken string
	// Registerer takes the API's metrics.
	Registerer prometheus.Registerer
	// Logger receives the API's records. Default slog.Default().
	Logger *slog.Logger
}

// BatchOptions bound the batches of the asynchronous API (batch.go).
type BatchOptions struct {
	// MaxRequests is the most requests in one batch; more is 413.
	// Default 256.
	MaxRequests int
	// MaxBodyBytes bounds a batch's body, in bytes; past it, 413.
	// Default 16 MiB.
	MaxBodyBytes int64
	// TenantQueued is the most requests of one tenant (or of the node-wide
	// principal) queued or running at once; a batch that does not fit is
	// 429 with Retry-After. Default 4096.
	TenantQueued int
	// MaxQueued is the most requests queued or running on the node, all
	// tenants together; a batch that does not fit is 503. Default 65536.
	MaxQueued int
	// ResultTTL is how long a finished batch's responses are kept, from
	// when it finished; then GET answers 404. Default 24h.
	ResultTTL time.Duration
	// CallbackAllow are the hosts (HOST: the scheme's default port only;
	// or HOST:PORT) a
	// callback_url may name; others are refused with 400. Default none:
	// every callback_url is refused.
	CallbackAllow []string
	// Share is the share of the engine queued work may take: at most
	// max(1, ⌊Share × Concurrency⌋) queued requests (this node's batches
	// and those it pulls from its peers) run at once, each only while no
	// synchronous request is active, and each gives way to a synchronous
	// request that arrives, between two chunks or decode steps
	// (prefill.GenerateOptions.Background). Default 1; negative: none, the
	// node stores the batches it accepts and its peers run them.
	Share float64
	// StealInterval is how long a worker with nothing to run waits between
	// two rounds of asking its peers for a queued batch they have not
	// started (steal.go). Default 1s; negative: never (a node alone never
	// asks).
	StealInterval time.Duration
	// LeaseTTL is how long a batch a peer claimed stays with it without
	// news (an answer or a renewal, which it sends every LeaseTTL/3); then
	// the batch can be taken again, from its first unanswered request.
	// Default 30s.
	LeaseTTL time.Duration
}

// DefaultMaxInFlightBytes is Options.MaxInFlightBytes' default.
const DefaultMaxInFlightBytes = 256 << 20

// Defaults of BatchOptions.
const (
	DefaultBatchMaxRequests  = 256
	DefaultBatchMaxBodyBytes = 16 << 20
	DefaultBatchTenantQueued = 4096
	DefaultBatchMaxQueued    = 65536
	DefaultBatchResultTTL    = 24 * time.Hour
	DefaultBatchShare        = 1
	DefaultBatchSteal        = time.Second
	DefaultBatchLeaseTTL     = 30 * time.Second
)

// EnsureDefaults fills zero fields with their defaults.
func (o *BatchOptions) EnsureDefaults() {
	if o.MaxRequests == 0 {
		o.MaxRequests = DefaultBatchMaxRequests
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultBatchMaxBodyBytes
	}
	if o.TenantQueued == 0 {
		o.TenantQueued = DefaultBatchTenantQueued
	}
	if o.MaxQueued == 0 {
		o.MaxQueued = DefaultBatchMaxQueued
	}
	if o.ResultTTL == 0 {
		o.ResultTTL = DefaultBatchResultTTL
	}
	if o.Share == 0 {
		o.Share = DefaultBatchShare
	}
	if o.StealInterval == 0 {
		o.StealInterval = DefaultBatchSteal
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultBatchLeaseTTL
	}
}
