package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/prefill"
)

// prefillMetrics are the PrefillService's metrics, registered beside the
// node's. mode is "sync" or "queued".
type prefillMetrics struct {
	requests      *prometheus.CounterVec   // mode: prefills that returned a result
	failed        *prometheus.CounterVec   // mode: prefills that failed (bad input included)
	promptTokens  *prometheus.CounterVec   // mode
	cachedTokens  *prometheus.CounterVec   // mode
	ttft          *prometheus.HistogramVec // mode
	sessionHints  prometheus.Counter
	queueRejected prometheus.Counter
}

func newPrefillMetrics(reg *prometheus.Registry, engine *prefill.Engine, q *queue) *prefillMetrics {
	m := &prefillMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_prefill_requests_total",
			Help: "Prefills that returned a result, by mode (sync or queued).",
		}, []string{"mode"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_prefill_failures_total",
			Help: "Prefill requests refused or failed, by mode (sync or queued).",
		}, []string{"mode"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_prefill_prompt_tokens_total",
			Help: "Prompt tokens of the prefills that returned a result, by mode.",
		}, []string{"mode"}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_prefill_cached_tokens_total",
			Help: "Prompt tokens whose K/V came from the cache instead of being computed, by mode.",
		}, []string{"mode"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvmesh_prefill_ttft_seconds",
			Help:    "Time to first token of the prefills that returned a result, by mode (queued: from the start of the run).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"mode"}),
		sessionHints: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_prefill_session_hints_total",
			Help: "Prefill requests that carried a session id (the session field or x-session-affinity); a hint only, hits never depend on it.",
		}),
		queueRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_prefill_queue_rejected_total",
			Help: "Queued prefill requests refused because the queue was full.",
		}),
	}
	stat := func(name, help string, f func(prefill.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(engine.Stats())) })
	}
	queueGauge := func(name, help string, results bool) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			pending, kept := q.depth()
			if results {
				return float64(kept)
			}
			return float64(pending)
		})
	}
	reg.MustRegister(m.requests, m.failed, m.promptTokens, m.cachedTokens, m.ttft, m.sessionHints, m.queueRejected,
		stat("kvmesh_prefill_preemptions_total", "Chunks of queued prefills cancelled for a synchronous one and computed again.",
			func(s prefill.Stats) int64 { return s.Preempted }),
		stat("kvmesh_prefill_published_blocks_total", "New blocks the prefill engine published to the cache.",
			func(s prefill.Stats) int64 { return s.Published }),
		stat("kvmesh_prefill_dropped_blocks_total", "New blocks the prefill engine did not publish (queue full, cache refused, shutdown).",
			func(s prefill.Stats) int64 { return s.DroppedBlocks }),
		stat("kvmesh_prefill_lost_blocks_total", "Blocks a lookup reported cached that the engine recomputed anyway (missing, corrupt, fetch failed).",
			func(s prefill.Stats) int64 { return s.LostBlocks }),
		speculative(engine, "kvmesh_speculative_proposed_tokens_total", "Tokens the engine's speculative proposer guessed.",
			func(s prefill.Stats) int64 { return s.Proposed }),
		speculative(engine, "kvmesh_speculative_accepted_tokens_total", "Of the tokens the speculative proposer guessed, those the model accepted (each one generated).",
			func(s prefill.Stats) int64 { return s.Accepted }),
		queueGauge("kvmesh_prefill_queue_pending", "Queued prefill requests not yet done (queued or running).", false),
		queueGauge("kvmesh_prefill_queue_results", "Results of queued prefill requests kept for GetResult.", true),
	)
	return m
}

// speculative returns a counter of the engine's speculative decoding,
// labelled with its proposer.
func speculative(engine *prefill.Engine, name, help string, f func(prefill.Stats) int64) prometheus.Collector {
	method, _ := engine.Speculative()
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"proposer": method}},
		func() float64 { return float64(f(engine.Stats())) })
}

// done counts a prefill that returned a result.
func (m *prefillMetrics) done(mode string, res prefill.Result) {
	m.requests.WithLabelValues(mode).Inc()
	m.promptTokens.WithLabelValues(mode).Add(float64(res.Usage.PromptTokens))
	m.cachedTokens.WithLabelValues(mode).Add(float64(res.Usage.CachedTokens))
	m.ttft.WithLabelValues(mode).Observe(res.TTFT.Seconds())
}
