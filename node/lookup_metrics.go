package node

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// lookupCounts counts, per namespace, the prompt tokens looked up and how
// many of them were cached: a hit ratio per namespace. Its rows are
// bounded: a namespace gets one on its first lookup that finds blocks
// (so a flood of made-up namespaces gets none), while fewer than
// maxNamespaceSeries exist, and keeps it until the node restarts, so that
// every series only grows, as a counter must; the other lookups are
// counted under "other". The common case (a namespace with a row) takes
// no lock.
type lookupCounts struct {
	rows  sync.Map // uint64 digest → *lookupRow
	n     atomic.Int64
	mu    sync.Mutex // serializes adding rows
	other lookupRow
}

type lookupRow struct{ prompt, cached atomic.Int64 }

// add counts one lookup of namespace digest d.
func (l *lookupCounts) add(d uint64, prompt, cached int) {
	r := &l.other
	if v, ok := l.rows.Load(d); ok {
		r = v.(*lookupRow)
	} else if cached > 0 && l.n.Load() < maxNamespaceSeries {
		l.mu.Lock()
		if v, ok := l.rows.Load(d); ok {
			r = v.(*lookupRow)
		} else if l.n.Load() < maxNamespaceSeries {
			r = new(lookupRow)
			l.rows.Store(d, r)
			l.n.Add(1)
		}
		l.mu.Unlock()
	}
	r.prompt.Add(int64(prompt))
	r.cached.Add(int64(cached))
}

// lookupCollector shows lookupCounts as kvmesh_namespace_lookup_*_tokens_total,
// labelled like the other namespace series.
type lookupCollector struct {
	l              *lookupCounts
	labelKey       []byte
	model          func(uint64) string
	prompt, cached *prometheus.Desc
}

func newLookupCollector(l *lookupCounts, labelKey []byte, model func(uint64) string) *lookupCollector {
	rows := fmt.Sprintf(" The namespace label is the namespace's digest in hex (a keyed hash of it on a node with tenants), the model label its model id; the first %d namespaces whose lookups found blocks have a row each, the rest are counted under namespace=\"other\".", maxNamespaceSeries)
	return &lookupCollector{l: l, labelKey: labelKey, model: model,
		prompt: prometheus.NewDesc("kvmesh_namespace_lookup_prompt_tokens_total", "Tokens of the prompts looked up, per namespace."+rows, []string{"namespace", "model"}, nil),
		cached: prometheus.NewDesc("kvmesh_namespace_lookup_cached_tokens_total", "Tokens of looked-up prompts found in the longest cached prefix, per namespace."+rows, []string{"namespace", "model"}, nil),
	}
}

func (c *lookupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.prompt
	ch <- c.cached
}

func (c *lookupCollector) Collect(ch chan<- prometheus.Metric) {
	emit := func(r *lookupRow, name, model string) {
		ch <- prometheus.MustNewConstMetric(c.prompt, prometheus.CounterValue, float64(r.prompt.Load()), name, model)
		ch <- prometheus.MustNewConstMetric(c.cached, prometheus.CounterValue, float64(r.cached.Load()), name, model)
	}
	c.l.rows.Range(func(k, v any) bool {
		d := k.(uint64)
		model := ""
		if c.model != nil {
			model = c.model(d)
		}
		if model == "" {
			model = "unknown"
		}
		emit(v.(*lookupRow), namespaceLabel(c.labelKey, d), model)
		return true
	})
	emit(&c.l.other, otherNamespaces, otherNamespaces)
}
