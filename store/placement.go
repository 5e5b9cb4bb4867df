package store

import (
	"encoding/binary"
	"math"
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
// A Placement is immutable and safe for concurrent use; membership changes
// build a new one.
type Placement struct {
	members  []Member
	seeds    []uint64 // per-member hash seed, from its id
	replicas int
}

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
	p := &Placement{members: ms, seeds: make([]uint64, len(ms)), replicas: max(replicas, 1)}
	for i, m := range ms {
		p.seeds[i] = xxhash.Sum64String(m.ID)
	}
	return p
}

// Members returns the members, sorted by id. Do not modify the slice.
func (p *Placement) Members() []Member { return p.members }

// Replicas returns the replication factor R.
func (p *Placement) Replicas() int { return p.replicas }

// score returns member i's rendezvous score for key.
func (p *Placement) score(key prefixhash.Key, i int) float64 {
	w := p.members[i].Weight
	if !(w > 0) {
		return math.Inf(-1)
	}
	var b [prefixhash.KeySize + 8]byte
	copy(b[:], key[:])
	binary.LittleEndian.PutUint64(b[prefixhash.KeySize:], p.seeds[i])
	h := xxhash.Sum64(b[:])
	// u in (0,1): the top 53 bits, offset by half a step so it is never 0 or 1.
	u := (float64(h>>11) + 0.5) / (1 << 53)
	return -w / math.Log(u)
}

// Owners appends to dst the ids of key's owners, best first (at most R of
// them; fewer when fewer members have weight).
func (p *Placement) Owners(dst []string, key prefixhash.Key) []string {
	var top [8]struct {
		i int
		s float64
	}
	r := min(p.replicas, len(p.members), len(top))
	n := 0
	for i := range p.members {
		s := p.score(key, i)
		if math.IsInf(s, -1) {
			continue
		}
		// Insert into the sorted top-r list.
		j := min(n, r)
		for j > 0 && top[j-1].s < s {
			if j < r {
				top[j] = top[j-1]
			}
			j--
		}
		if j < r {
			top[j].i, top[j].s = i, s
			if n < r {
				n++
			}
		}
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
