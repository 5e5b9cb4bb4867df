package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
)

// scalePlacement gathers the placement phase's figures.
type scalePlacement struct {
	balance []scaleBalanceRow
	moves   []scaleMoveRow
}

// scaleBalanceRow is how evenly placement spreads chunks at one size and
// fill.
type scaleBalanceRow struct {
	Nodes int `json:"nodes"`
	// Weights is "equal", or "1:2:4" (a third of the nodes each, weight
	// proportional to capacity).
	Weights string `json:"weights"`
	// ChunksPerNode is the mean number of chunks a node owns (R = 1): what
	// its capacity holds at the default chunk size (see the note).
	ChunksPerNode int `json:"chunks_per_node"`
	// MaxOverMean is the most loaded node's bytes over the mean, each
	// node's bytes divided by its weight's share.
	MaxOverMean float64 `json:"max_over_mean"`
	// Expected is 1 + sqrt(2 ln N / m), the balls-into-bins figure for m
	// chunks per node: what any hashing placement reaches.
	Expected float64 `json:"expected"`
	// OwnerUS is the CPU time of one Placement.Owner call (all N members
	// scored), in microseconds, on this machine under its load.
	OwnerUS float64 `json:"owner_us"`
}

// scaleMoveRow is what moves when one node is lost, or one joins.
type scaleMoveRow struct {
	Nodes    int    `json:"nodes"`
	Replicas int    `json:"replicas"`
	Change   string `json:"change"` // "loss" or "join"
	// MovedTimesN is the fraction of chunks whose owner set changed, times
	// N (1 is the ideal: only the lost node's share), mean and max over the
	// nodes tried, of 32 chunks a node: the lost node's share varies by
	// about 18% around 1/N from node to node.
	MovedTimesN    float64 `json:"moved_times_n"`
	MaxMovedTimesN float64 `json:"max_moved_times_n"`
	// MovedOverOwned is the chunks that moved over those the lost (or
	// new) node owned before (or after), over the tries: 1 when exactly
	// its chunks moved.
	MovedOverOwned float64 `json:"moved_over_owned"`
	// Stray counts chunks whose owners changed although the lost node was
	// not one of them (or the new node is not one now): must be 0.
	Stray int `json:"stray"`
	Tries int `json:"tries"`
}

// placementKeys returns n random chunk keys.
func scaleKeys(rng *rand.Rand, n int) []prefixhash.Key {
	keys := make([]prefixhash.Key, n)
	for i := range keys {
		for j := range keys[i] {
			keys[i][j] = byte(rng.Uint32())
		}
	}
	return keys
}

// owners places every key with p, in parallel over the CPUs; out[i] is the
// index in p.Members() of keys[i]'s primary owner, or -1 for none.
func ownersOf(p *store.Placement, keys []prefixhash.Key) []int {
	idx := make(map[string]int, len(p.Members()))
	for i, m := range p.Members() {
		idx[m.ID] = i
	}
	out := make([]int, len(keys))
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(keys); i += workers {
				o := p.Owner(keys[i])
				if o == "" {
					out[i] = -1
				} else {
					out[i] = idx[o]
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// scaleMembers returns n members named as the simulation names nodes, with
// weights from weight(i).
func scaleMembers(n int, weight func(i int) float64) []store.Member {
	ms := make([]store.Member, n)
	for i := range ms {
		ms[i] = store.Member{ID: simNodeID(i), Weight: weight(i)}
	}
	return ms
}

// measure runs the placement phase at n nodes.
func (s *scalePlacement) measure(ctx context.Context, o ScaleOptions, n int, quick bool) error {
	rng := rand.New(rand.NewPCG(o.Seed, uint64(n)))
	fills := pick(quick, []int{256, 1024, 2048}, []int{256})
	for _, weights := range []string{"equal", "1:2:4"} {
		w := func(int) float64 { return 1 << 30 }
		if weights != "equal" {
			w = func(i int) float64 { return float64(int64(1<<30) << (i % 3)) }
		}
		ms := scaleMembers(n, w)
		p := store.NewPlacement(ms, 1)
		var total float64
		for _, m := range ms {
			total += m.Weight
		}
		for _, fill := range fills {
			if err := ctx.Err(); err != nil {
				return err
			}
			keys := scaleKeys(rng, fill*n)
			start := processCPU()
			own := ownersOf(p, keys)
			cpu := processCPU() - start
			counts := make([]float64, n)
			for _, i := range own {
				counts[i]++
			}
			var worst float64
			for i, c := range counts {
				share := ms[i].Weight / total * float64(len(keys))
				worst = max(worst, c/share)
			}
			s.balance = append(s.balance, scaleBalanceRow{Nodes: n, Weights: weights, ChunksPerNode: fill, MaxOverMean: worst,
				Expected: 1 + math.Sqrt(2*math.Log(float64(n))/float64(fill)),
				OwnerUS:  float64(cpu) / float64(len(keys)) / float64(time.Microsecond)})
		}
	}

	keys := scaleKeys(rng, 32*n)
	for _, r := range []int{1, 2} {
		ms := scaleMembers(n, func(int) float64 { return 1 << 30 })
		before := store.NewPlacement(ms, r)
		tries := pick(quick, 3, 1)
		for _, change := range []string{"loss", "join"} {
			var moved []float64
			stray, movedAll, ownedAll := 0, 0, 0
			for range tries {
				if err := ctx.Err(); err != nil {
					return err
				}
				var after *store.Placement
				var who string
				if change == "loss" {
					gone := rng.IntN(n)
					who = ms[gone].ID
					after = store.NewPlacement(slices.Delete(slices.Clone(ms), gone, gone+1), r)
				} else {
					who = simNodeID(n + rng.IntN(1<<20))
					after = store.NewPlacement(append(slices.Clone(ms), store.Member{ID: who, Weight: 1 << 30}), r)
				}
				m, st, owned := movedChunks(before, after, keys, who, change == "loss")
				moved = append(moved, float64(m)/float64(len(keys))*float64(n))
				stray += st
				movedAll += m
				ownedAll += owned
			}
			var sum float64
			for _, m := range moved {
				sum += m
			}
			s.moves = append(s.moves, scaleMoveRow{Nodes: n, Replicas: r, Change: change, MovedTimesN: sum / float64(len(moved)),
				MaxMovedTimesN: slices.Max(moved), MovedOverOwned: float64(movedAll) / float64(max(ownedAll, 1)), Stray: stray, Tries: tries})
		}
	}
	return nil
}

// movedChunks counts the keys whose owner set differs between before and
// after, of those the strays (a key that moved though who, the node lost or
// the node that joined, is not among its owners before (loss) or after
// (join), or whose owners changed by more than who), and the keys who owns
// before (loss) or after (join).
func movedChunks(before, after *store.Placement, keys []prefixhash.Key, who string, loss bool) (moved, stray, owned int) {
	var a, b []string
	for _, k := range keys {
		a, b = before.Owners(a[:0], k), after.Owners(b[:0], k)
		if (loss && slices.Contains(a, who)) || (!loss && slices.Contains(b, who)) {
			owned++
		}
		if slices.Equal(a, b) {
			continue
		}
		moved++
		had, holds := a, b
		if !loss {
			had, holds = b, a
		}
		// had must name who; holds must be had without who, plus at most
		// one other member.
		if !slices.Contains(had, who) {
			stray++
			continue
		}
		kept := 0
		for _, o := range had {
			if o != who && slices.Contains(holds, o) {
				kept++
			}
		}
		if kept != len(had)-1 {
			stray++
		}
	}
	return moved, stray, owned
}

// report adds the phase's tables, plots and checks to res.
func (s *scalePlacement) report(res *Result, env *Env) {
	if len(s.balance) == 0 {
		return
	}
	res.AddTable("scale_balance", "placement balance: the most loaded node's bytes over the mean (each over its weight's share), "+
		"R = 1, random chunk keys placed by store.Placement; expected: 1 + sqrt(2 ln N / m) for m chunks a node", s.balance)
	res.AddTable("scale_moves", "chunks whose owners change when one node is lost or joins, times N (1: only that node's share moves); "+
		"stray: chunks that moved without the node being their owner (must be 0)", s.moves)
	res.Note("chunks per node at the default chunk size (512 tokens): a node of 64 GiB DRAM and 1 TiB NVMe holds about 17,000 chunks of an " +
		"8B-parameter model (128 KiB of KV a token, fp16) and about 7,000 of a 70B one (320 KiB a token); 1,024 to 4,096 chunks a node " +
		"is a node a tenth as large")
	largest := slices.MaxFunc(s.balance, func(a, b scaleBalanceRow) int { return a.Nodes - b.Nodes }).Nodes
	for _, r := range s.balance {
		if r.Nodes == largest && r.ChunksPerNode == slices.MaxFunc(s.balance, func(a, b scaleBalanceRow) int { return a.ChunksPerNode - b.ChunksPerNode }).ChunksPerNode {
			res.Checks = append(res.Checks, NewCheck(fmt.Sprintf("scale: placement balance, %d nodes, %s weights, %d chunks a node", r.Nodes, r.Weights, r.ChunksPerNode),
				"max_over_mean", r.MaxOverMean, "<=", 1.10, BackendKvmesh))
		}
	}
	for _, r := range s.moves {
		if r.Nodes == largest && r.Change == "loss" {
			res.Checks = append(res.Checks, NewCheck(fmt.Sprintf("scale: chunks moved on the loss of one of %d nodes, R=%d (mean over the nodes tried)", r.Nodes, r.Replicas),
				"moved_times_n", r.MovedTimesN, "<=", 1.2*float64(r.Replicas), BackendKvmesh))
			res.Checks = append(res.Checks, NewCheck(fmt.Sprintf("scale: chunks moved without cause, %d nodes, R=%d", r.Nodes, r.Replicas),
				"stray", float64(r.Stray), "<=", 0, BackendKvmesh))
		}
	}
	var series []Series
	for _, w := range []string{"equal", "1:2:4"} {
		byFill := map[int][2][]float64{}
		var fills []int
		for _, r := range s.balance {
			if r.Weights == w {
				if _, ok := byFill[r.ChunksPerNode]; !ok {
					fills = append(fills, r.ChunksPerNode)
				}
				xy := byFill[r.ChunksPerNode]
				byFill[r.ChunksPerNode] = [2][]float64{append(xy[0], float64(r.Nodes)), append(xy[1], r.MaxOverMean)}
			}
		}
		for _, f := range fills {
			series = append(series, Series{Name: fmt.Sprintf("%s, %d chunks/node", w, f), X: byFill[f][0], Y: byFill[f][1], Dashed: w != "equal"})
		}
	}
	savePlot(res, env, "scale_balance.png", LinePlot{Title: "placement: max/mean bytes per node", XLabel: "nodes", YLabel: "max / mean",
		LogX: true, XTick: intTick, YMin: 1, YMax: 1.6, Series: series})
}
