package bench

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestOptimumMatchesModel replays random sequences (one key per request)
// on the optimum and on a brute-force Belady with bypass: same hits.
func TestOptimumMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 50 {
		capacity := 1 + rng.IntN(6)
		seq := make([]prefixhash.Key, 200)
		uses := map[prefixhash.Key][]int32{}
		for i := range seq {
			seq[i] = prefixhash.Key{byte(rng.IntN(12))}
			uses[seq[i]] = append(uses[seq[i]], int32(i))
		}
		next := func(k prefixhash.Key, now int) int {
			for j := now + 1; j < len(seq); j++ {
				if seq[j] == k {
					return j
				}
			}
			return len(seq) + 1
		}
		o := newOptimum(capacity, uses)
		model := map[prefixhash.Key]bool{}
		hits, modelHits := 0, 0
		for now, k := range seq {
			if o.contains(k) {
				hits++
				o.touch(k, now)
			} else {
				o.insert(k, now)
			}
			if model[k] {
				modelHits++
				continue
			}
			if len(model) < capacity {
				model[k] = true
				continue
			}
			var victim prefixhash.Key
			far := -1
			for m := range model {
				if n := next(m, now); n > far {
					victim, far = m, n
				}
			}
			if far > next(k, now) {
				delete(model, victim)
				model[k] = true
			}
			if o.len() > capacity {
				t.Fatalf("iter %d: %d keys held, capacity %d", iter, o.len(), capacity)
			}
		}
		if hits != modelHits {
			t.Fatalf("iter %d (capacity %d): %d hits, the model %d", iter, capacity, hits, modelHits)
		}
	}
}
