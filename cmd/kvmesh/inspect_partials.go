package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/client"
)

type partRangeJSON struct {
	L0 int `json:"l0"`
	L1 int `json:"l1"`
	H0 int `json:"h0"`
	H1 int `json:"h1"`
}

type partialJSON struct {
	Key        string          `json:"key"`
	Namespace  string          `json:"namespace"`
	Tokens     int             `json:"tokens"`
	Parts      []partRangeJSON `json:"parts"`
	Layers     int             `json:"layers"`
	Heads      int             `json:"heads"`
	Covered    int             `json:"covered_cells"`
	AgeSeconds float64         `json:"age_seconds"`
	Bytes      int64           `json:"bytes"`
}

type partialsJSON struct {
	Total  int           `json:"total"`
	Blocks []partialJSON `json:"blocks"`
}

func partialsCmd(f *inspectFlags) *cobra.Command {
	var limit int
	c := &cobra.Command{
		Use:   "partials",
		Short: "Incomplete blocks: which parts (layer and head ranges of parallel ranks) are present",
		Long: `The incomplete blocks of the node at --addr, oldest first: blocks whose parts
(layers [l0,l1) and KV heads [h0,h1) put by tensor- and pipeline-parallel
ranks) do not cover every layer and head yet. They are not served; they
expire after the node's --partial-ttl and are dropped first when memory is
needed. PARTS lists the ranges present as L0-L1xH0-H1; COVERED the cells
(layer × head) present out of all.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ps []client.PartialBlock
			var total int
			err := f.withNode(cmd, func(ctx context.Context, c *client.Client) (err error) {
				ps, total, err = c.Partials(ctx, limit)
				return err
			})
			if err != nil {
				return err
			}
			out := partialsJSON{Total: total, Blocks: []partialJSON{}}
			for _, p := range ps {
				j := partialJSON{Key: p.Key.String(), Namespace: fmt.Sprintf("%016x", p.NamespaceDigest), Tokens: p.Tokens,
					Parts: []partRangeJSON{}, Layers: p.Layers, Heads: p.Heads, Covered: p.Covered,
					AgeSeconds: p.Age.Seconds(), Bytes: p.Bytes}
				for _, r := range p.Parts {
					j.Parts = append(j.Parts, partRangeJSON{L0: r.L0, L1: r.L1, H0: r.H0, H1: r.H1})
				}
				out.Blocks = append(out.Blocks, j)
			}
			return f.print(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "KEY\tNAMESPACE\tAGE\tCOVERED\tPARTS")
				for _, b := range out.Blocks {
					var rs []string
					for _, r := range b.Parts {
						rs = append(rs, fmt.Sprintf("%d-%dx%d-%d", r.L0, r.L1, r.H0, r.H1))
					}
					fmt.Fprintf(w, "%s\t%s\t%.1fs\t%d/%d\t%s\n", b.Key, b.Namespace, b.AgeSeconds, b.Covered, b.Layers*b.Heads, strings.Join(rs, " "))
				}
				fmt.Fprintf(w, "\n%d incomplete blocks (%d shown)\n", out.Total, len(out.Blocks))
			})
		},
	}
	c.Flags().IntVar(&limit, "limit", 100, "most blocks shown, the oldest (at most 1000)")
	return c
}
