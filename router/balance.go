package router

import (
	"hash/fnv"
	"io"
	"math/rand/v2"
	"sync"
	"time"
)

type nodeLoad struct {
	prompt, decode, requests int
	downUntil                time.Time
}

func (r *Router) loadLocked(id string) *nodeLoad {
	l := r.mu.load[id]
	if l == nil {
		l = &nodeLoad{}
		r.mu.load[id] = l
	}
	return l
}

// pick chooses among cands: by policy for prefill work (cost: uncached
// prompt tokens), by outstanding decode tokens for decode work. It
// returns -1 when cands is empty.
func (r *Router) pick(cands []backend, decode bool, session string) int {
	if len(cands) == 0 {
		return -1
	}
	switch {
	case r.opts.Policy == PolicyRandom:
		return rand.IntN(len(cands))
	case r.opts.Policy == PolicySession && session != "":
		// Rendezvous on the session, so a member change moves few sessions.
		best, bestH := 0, uint64(0)
		for i, c := range cands {
			h := fnv.New64a()
			io.WriteString(h, session)
			io.WriteString(h, c.id)
			if v := h.Sum64(); i == 0 || v > bestH {
				best, bestH = i, v
			}
		}
		return best
	case r.opts.Policy == PolicySession:
		return rand.IntN(len(cands))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	loads := make([]nodeLoad, len(cands))
	for i, c := range cands {
		loads[i] = *r.loadLocked(c.id)
	}
	return chooseLeastLoaded(loads, decode, rand.IntN(len(cands)))
}

// chooseLeastLoaded returns the index of the load with the fewest
// outstanding prompt tokens (decode: tokens to generate), then the fewest
// requests; among equals, the first from start on (a random start spreads
// ties).
func chooseLeastLoaded(loads []nodeLoad, decode bool, start int) int {
	key := func(l nodeLoad) [2]int {
		if decode {
			return [2]int{l.decode, l.requests}
		}
		return [2]int{l.prompt, l.requests}
	}
	best := start % len(loads)
	for k := 1; k < len(loads); k++ {
		i := (start + k) % len(loads)
		a, b := key(loads[i]), key(loads[best])
		if a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]) {
			best = i
		}
	}
	return best
}

// charge adds a request's work to a node's load: prefilled is called
// when its prompt is computed (the first byte of the answer), done when it
// ended; both may be called more than once.
func (r *Router) charge(id string, prompt, decode int) (prefilled, done func()) {
	r.mu.Lock()
	l := r.loadLocked(id)
	l.prompt += prompt
	l.decode += decode
	l.requests++
	r.mu.Unlock()
	r.pending.WithLabelValues(id, "prompt").Add(float64(prompt))
	r.pending.WithLabelValues(id, "decode").Add(float64(decode))
	var p, d sync.Once
	prefilled = func() {
		p.Do(func() {
			r.mu.Lock()
			l.prompt -= prompt
			r.mu.Unlock()
			r.pending.WithLabelValues(id, "prompt").Sub(float64(prompt))
		})
	}
	return prefilled, func() {
		prefilled()
		d.Do(func() {
			r.mu.Lock()
			l.decode -= decode
			l.requests--
			r.mu.Unlock()
			r.pending.WithLabelValues(id, "decode").Sub(float64(decode))
		})
	}
}

func (r *Router) markDown(id string) {
	r.mu.Lock()
	r.loadLocked(id).downUntil = time.Now().Add(routerBackoff)
	r.mu.Unlock()
}
