// Command kvmesh is the kvmesh binary: serve, inspect, prefill, bench and
// version. It parses flags and calls packages; no logic lives here.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "kvmesh",
		Short:         "kvmesh: a distributed, tiered KV-cache store for LLM inference",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(versionCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvmesh:", err)
		os.Exit(1)
	}
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the kvmesh version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			v := "(devel)"
			if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
				v = bi.Main.Version
			}
			fmt.Fprintln(cmd.OutOrStdout(), "kvmesh", v)
		},
	}
}
