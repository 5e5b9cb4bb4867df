package bench

import (
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/store"
)

// admissionSweepRow is one capacity of the NVMe admission sweep: the same
// nodes (DRAM for part of their capacity, NVMe for the rest, under
// store.EvictReuse) writing every DRAM victim to NVMe, and only those asked
// for again (`kvmesh serve --nvme-admission reused`).
type admissionSweepRow struct {
	PooledCapacityFraction float64 `json:"pooled_capacity_fraction"`
	CapacityBlocksPerNode  int     `json:"capacity_blocks_per_node" table:"wide"`
	DRAMBlocksPerNode      int     `json:"dram_blocks_per_node" table:"wide"`
	// AllRatioVsIdeal and AllNVMeBytesPerRequest: every victim written.
	AllRatioVsIdeal        float64 `json:"all_ratio_vs_ideal"`
	AllNVMeBytesPerRequest float64 `json:"all_nvme_bytes_per_request"`
	// Reused…: only victims asked for again written; Unadmitted counts
	// the victims dropped instead (over all nodes).
	ReusedRatioVsIdeal        float64 `json:"reused_ratio_vs_ideal"`
	ReusedNVMeBytesPerRequest float64 `json:"reused_nvme_bytes_per_request"`
	ReusedUnadmitted          int64   `json:"reused_unadmitted" table:"wide"`
	// HitRatioChange is reused / all hit ratio; WritesChange, reused / all
	// NVMe bytes written.
	HitRatioChange float64 `json:"hit_ratio_change"`
	WritesChange   float64 `json:"nvme_writes_change"`
}

// admissionSweep replays the trace on kvmesh nodes the bench starts at each
// capacity of NodeSweep, DRAM holding DRAMFraction of it, under
// store.EvictReuse with NVMe admission off and on, and reports the hit
// ratio and the NVMe bytes the nodes wrote per request of each.
func (tr *traceReplay) admissionSweep(res *Result) error {
	o := tr.o
	tr.bar = tr.env.Progress.Bar(int64(2*len(o.NodeSweep)*len(tr.t.Requests)), "trace: NVMe admission sweep on kvmesh nodes")
	defer tr.bar.Finish()
	var rows []admissionSweepRow
	for _, f := range o.NodeSweep {
		c := tr.capacityOf(f)
		dram := max(1, int(math.Round(o.DRAMFraction*float64(c))))
		// What the node's DRAM holds: 1 MiB at least (dramBytesFor).
		row := admissionSweepRow{PooledCapacityFraction: f, CapacityBlocksPerNode: c,
			DRAMBlocksPerNode: min(c, int(dramBytesFor(dram, tr.blockBytes)/int64(tr.blockBytes+128)))}
		for _, admission := range []string{"all", "reused"} {
			st, err := tr.play(o.Cluster, traceRun{RoutingRandom, false, c, f, string(store.EvictReuse), dram, admission})
			if err != nil {
				return err
			}
			var written, unadmitted int64
			for _, t := range st.Tiers {
				written += t.WrittenBytes
				if t.Name == "nvme" {
					unadmitted += t.Evicted.Unadmitted
				}
			}
			perRequest := float64(written) / float64(max(st.Requests, 1))
			if admission == "all" {
				row.AllRatioVsIdeal, row.AllNVMeBytesPerRequest = st.RatioVsIdeal, perRequest
			} else {
				row.ReusedRatioVsIdeal, row.ReusedNVMeBytesPerRequest, row.ReusedUnadmitted = st.RatioVsIdeal, perRequest, unadmitted
			}
		}
		if row.AllRatioVsIdeal > 0 {
			row.HitRatioChange = row.ReusedRatioVsIdeal / row.AllRatioVsIdeal
		}
		if row.AllNVMeBytesPerRequest > 0 {
			row.WritesChange = row.ReusedNVMeBytesPerRequest / row.AllNVMeBytesPerRequest
		}
		rows = append(rows, row)
	}
	res.AddTable("nvme_admission", fmt.Sprintf("NVMe admission on kvmesh nodes (random routing, pooled, %d nodes, --eviction reuse, "+
		"DRAM for %.0f%% of each node's --max-blocks (1 MiB at least), NVMe for the rest): hit ratio / ideal and NVMe bytes written per request "+
		"with --nvme-admission all and reused, in the same run", o.Nodes, 100*o.DRAMFraction), rows)
	return nil
}
