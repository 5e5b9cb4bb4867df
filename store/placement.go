package store

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Member is a node as placement sees it: a stable id and a weight
// (proportional to the capacity it offers to the cluster).
type Member struct {
	ID     string
	Weight float64
}

// Placement maps placement-chunk keys to their owners by weighted rendezvous
// (highest-random-weight) hashing: every member gets a score for the key, the
// R highest scores own it. When a member joins or leaves, only the keys whose
// top-R set changed move; every other key keeps its owners, so a membership
// change never reshuffles the cache.
//
// Weighted scores follow Schindelhauer and Schomaker ("Weighted distributed
// hash tables", 2005): score = -w / ln(u), u ∈ (0,1) uniform from hash(key,
// member), which gives each member a share of keys proportional to its weight.
//
// Owners costs one hash per member and key (a lookup of a 128k-token prompt
// places 256 chunks: at 1,024 members, 262,144 scores). The scores are
// what they always were; they are computed faster, with the same results:
// the hash of (key, member seed) is xxhash64 of their 24 bytes, whose state
// after the key's two lanes is the same for every member, so it is taken
// once per key and each member's lane added to it (memberHash); and a
// score's logarithm is taken only for the best members of each distinct
// weight (the score grows with the hash among members of one weight), so
// a cluster of few node sizes scores N hashes and a few logarithms.
//
// A Placement is immutable and safe for concurrent use; membership changes
// build a new one.
type Placement struct {
	members  []Member
	seeds    []uint64  // per-member hash seed, from its id
	lanes    []uint64  // per member: its seed's xxhash64 round (xxRound)
	class    []int     // per member: index into weights, or -1 for no weight
	weights  []float64 // the distinct positive weights
	replicas int
}

// maxClasses is the most distinct weights Owners keeps the best members
// of; past it, it scores every member.
const maxClasses = 8

// NewPlacement returns the placement of members with replication factor
// replicas (at least 1; more than len(members) means every member). Members
// with a non-positive weight own nothing. The order of members does not
// matter.
func NewPlacement(members []Member, replicas int) *Placement {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	ms = slices.CompactFunc(ms, func(a, b Member) bool { return a.ID == b.ID })
	p := &Placement{members: ms, seeds: make([]uint64, len(ms)), lanes: make([]uint64, len(ms)), class: make([]int, len(ms)),
		replicas: max(replicas, 1)}
	for i, m := range ms {
		p.seeds[i] = xxhash.Sum64String(m.ID)
		p.lanes[i] = xxRound(p.seeds[i])
		p.class[i] = -1
		if m.Weight > 0 {
			c := slices.Index(p.weights, m.Weight)
			if c < 0 {
				c = len(p.weights)
				p.weights = append(p.weights, m.Weight)
			}
			p.class[i] = c
		}
	}
	return p
}

// Members returns the members, sorted by id. Do not modify the slice.
func (p *Placement) Members() []Member { return p.members }

// Replicas returns the replication factor R.
func (p *Placement) Replicas() int { return p.replicas }

// xxhash64's primes (github.com/cespare/xxhash/v2, the reference's names).
const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
)

// xxRound is xxhash64's round of one 8-byte lane into a zero accumulator.
func xxRound(lane uint64) uint64 { return bits.RotateLeft64(lane*xxPrime2, 31) * xxPrime1 }

// xxLane folds a lane's round into the state of xxhash64's short-input
// path.
func xxLane(h, round uint64) uint64 { return bits.RotateLeft64(h^round, 27)*xxPrime1 + xxPrime4 }

// keyState is xxhash64's state over a 24-byte input (key ‖ seed) once the
// key's two lanes are in: what every member's hash of key starts from.
func keyState(key prefixhash.Key) uint64 {
	h := xxPrime5 + prefixhash.KeySize + 8
	h = xxLane(h, xxRound(binary.LittleEndian.Uint64(key[:8])))
	return xxLane(h, xxRound(binary.LittleEndian.Uint64(key[8:])))
}

// memberHash finishes xxhash64(key ‖ seed) from keyState(key) and the
// seed's round: the same value as xxhash.Sum64 of the 24 bytes.
func memberHash(state, lane uint64) uint64 {
	h := xxLane(state, lane)
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}

// score returns member i's rendezvous score for the key whose hash with
// member i is h: -w / ln(u), u in (0,1) from the hash's top 53 bits, offset
// by half a step so it is never 0 or 1.
func (p *Placement) score(h uint64, i int) float64 {
	w := p.members[i].Weight
	if !(w > 0) {
		return math.Inf(-1)
	}
	u := (float64(h>>11) + 0.5) / (1 << 53)
	return -w / math.Log(u)
}

// candidate is a member in a ranking: its index and the figure it is
// ranked by (a hash's top 53 bits, or a score), best first, ties to the
// lower index (the order NewPlacement sorted members in).
type candidate[T uint64 | float64] struct {
	i int
	v T
}

// insert puts (i, v) into the ranking top[:*n], at most r long, if it
// belongs there.
func insert[T uint64 | float64](top []candidate[T], n *int, r, i int, v T) {
	j := min(*n, r)
	for j > 0 && top[j-1].v < v {
		if j < r {
			top[j] = top[j-1]
		}
		j--
	}
	if j < r {
		top[j] = candidate[T]{i, v}
		if *n < r {
			*n++
		}
	}
}

// Owners appends to dst the ids of key's owners, best first (at most R of
// them; fewer when fewer members have weight).
func (p *Placement) Owners(dst []string, key prefixhash.Key) []string {
	var top [8]candidate[float64]
	r := min(p.replicas, len(p.members), len(top))
	n := 0
	state := keyState(key)
	if len(p.weights) > maxClasses {
		for i := range p.members {
			if s := p.score(memberHash(state, p.lanes[i]), i); !math.IsInf(s, -1) {
				insert(top[:], &n, r, i, s)
			}
		}
	} else {
		// Among members of one weight the score grows with u: keep each
		// weight's best r by hash, then score only those.
		var best [maxClasses][8]candidate[uint64]
		var counts [maxClasses]int
		for i, c := range p.class {
			if c < 0 {
				continue
			}
			u := memberHash(state, p.lanes[i]) >> 11
			if k := counts[c]; k == r && best[c][r-1].v >= u {
				continue
			}
			insert(best[c][:], &counts[c], r, i, u)
		}
		// Score those, and rank them: score first, ties to the lower
		// index, as the ranking of every member would have it.
		var cands [maxClasses * 8]candidate[float64]
		k := 0
		for c := range p.weights {
			for _, b := range best[c][:counts[c]] {
				// b.v is the hash's top 53 bits: what score reads.
				cands[k] = candidate[float64]{b.i, p.score(b.v<<11, b.i)}
				k++
			}
		}
		slices.SortFunc(cands[:k], func(a, b candidate[float64]) int {
			switch {
			case a.v > b.v:
				return -1
			case a.v < b.v:
				return 1
			}
			return a.i - b.i
		})
		n = copy(top[:r], cands[:k])
	}
	for _, t := range top[:n] {
		dst = append(dst, p.members[t.i].ID)
	}
	return dst
}

// Owner returns key's primary owner, or "" when no member has weight.
func (p *Placement) Owner(key prefixhash.Key) string {
	var buf [1]string
	o := p.Owners(buf[:0], key)
	if len(o) == 0 {
		return ""
	}
	return o[0]
}

// chunkOwners places chunk keys with p, remembering the last: the blocks of
// a chunk come in a row and share its owners, so a call that places blocks
// scores the members once a chunk, not once a block.
type chunkOwners struct {
	p      *Placement
	key    prefixhash.Key
	owners []string
	valid  bool
}

// of returns the owners of the chunk whose key is key, best first. The
// slice is valid until the next call.
func (c *chunkOwners) of(key prefixhash.Key) []string {
	if !c.valid || key != c.key {
		c.owners = c.p.Owners(c.owners[:0], key)
		c.key, c.valid = key, true
	}
	return c.owners
}
