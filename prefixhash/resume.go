package prefixhash

// Presence is what a caller of Resume knows of one group's record of one
// block: held, missing, or not asked yet.
type Presence uint8

const (
	// Unknown: not asked yet. Resume then lists the record in its need.
	Unknown Presence = iota
	// Held: the record is cached.
	Held
	// Missing: it is not.
	Missing
)

// A Probe names group Group's record of block Block of a chain.
type Probe struct{ Group, Block int }

// Hit is the answer of the hit rule for a chain of a namespace with
// groups.
type Hit struct {
	// Blocks is P: the longest prefix, in blocks, that a reader can resume
	// after. Every full and indexer group holds blocks [0,P), every
	// sliding group the blocks that cover the last Window tokens before
	// P (blocks [P-⌈Window/B⌉, P)), every state group its state at P (its
	// record of block P-1). P = 0 always qualifies.
	Blocks int
	// Groups says, per group, what it allows on its own, so that a caller
	// sees why P is shorter than the full-attention blocks: a full or
	// indexer group's leading blocks held; for a sliding or state group,
	// the longest prefix no longer than every full and indexer group's
	// at which the group alone would let a reader resume (at least
	// Blocks).
	Groups []int
}

// Resume applies the hit rule to a chain of n blocks whose records of
// groups (a namespace's, in order; Groups.All) are as held says, for
// blocks of blockTokens tokens. held is asked at most once per record and
// only as far as the answer needs: a full group's leading blocks up to its
// first miss, then, walking down from the full groups' prefix, the state
// at each candidate P and the window before it.
//
// If held answers Unknown for a record the answer depends on, Resume
// returns the probes it needs at the first candidate it could not decide
// (a caller asks for them, and perhaps for more below, and calls again);
// the Hit is then not final. With a held that never answers Unknown, need
// is empty.
func Resume(groups []Group, blockTokens, n int, held func(g, i int) Presence) (hit Hit, need []Probe) {
	lead := make([]int, len(groups))
	for g, gr := range groups {
		if !gr.Kind.EveryBlock() {
			continue
		}
		for ; lead[g] < n; lead[g]++ {
			p := held(g, lead[g])
			if p == Unknown {
				return Hit{Groups: make([]int, len(groups))}, append(need, Probe{g, lead[g]})
			}
			if p == Missing {
				break
			}
		}
	}
	return ResumeFrom(groups, blockTokens, n, lead, held)
}

// ResumeFrom is Resume for a caller that knows every full and indexer
// group's leading blocks held, lead[g] (a cluster's lookup finds them in
// one round): held is asked of sliding and state groups only.
func ResumeFrom(groups []Group, blockTokens, n int, lead []int, held func(g, i int) Presence) (hit Hit, need []Probe) {
	hit.Groups = make([]int, len(groups))
	full := n
	for g, gr := range groups {
		if !gr.Kind.EveryBlock() {
			hit.Groups[g] = -1
			continue
		}
		hit.Groups[g] = min(lead[g], n)
		full = min(full, hit.Groups[g])
	}
	// Sliding windows are read block by block from P-1 down, over and
	// over as P falls: memo keeps each record's answer.
	var memo [][]Presence
	ask := func(g, i int) Presence {
		if groups[g].Kind != GroupSliding {
			return held(g, i)
		}
		if memo == nil {
			memo = make([][]Presence, len(groups))
		}
		if memo[g] == nil {
			memo[g] = make([]Presence, full)
		}
		if memo[g][i] == Unknown {
			memo[g][i] = held(g, i)
		}
		return memo[g][i]
	}
	for p := full; ; p-- {
		ok := true
		for g, gr := range groups {
			if gr.Kind.EveryBlock() {
				continue
			}
			var first, last int // the records the group needs at p: [first, last)
			if gr.Kind == GroupState {
				first, last = max(0, p-1), p
			} else {
				first, last = max(0, p-gr.WindowBlocks(blockTokens)), p
			}
			holds, asked := true, len(need)
			for i := last - 1; i >= first; i-- {
				if a := ask(g, i); a == Missing {
					holds = false
					need = need[:asked] // it fails whatever they are
					break
				} else if a == Unknown {
					need = append(need, Probe{g, i})
				}
			}
			if holds && len(need) == asked && hit.Groups[g] < 0 {
				hit.Groups[g] = p
			}
			ok = ok && holds
		}
		if len(need) > 0 {
			return hit, need
		}
		if ok { // p = 0 always is
			hit.Blocks = p
			return hit, nil
		}
	}
}
