// Command kvmesh is the kvmesh binary: serve, inspect, prefill and version
// (bench comes with its package). It parses flags and calls packages;
// no logic lives here.
//
// Every flag can also be set by a KVMESH_* environment variable (the flag
// name in upper case, dashes as underscores: --data-dir is KVMESH_DATA_DIR)
// and, for serve, by a YAML config file (--config) whose keys are the flag
// names. A flag on the command line wins over the environment, which wins
// over the config file. A command that fails prints one line saying what to
// do and exits with status 1.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/gpu"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	root := rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(stderr, "kvmesh:", err)
		return 1
	}
	return 0
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "kvmesh",
		Short:         "kvmesh: a distributed, tiered KV-cache store for LLM inference",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w; see '%s --help'", err, c.CommandPath())
	})
	root.AddCommand(serveCmd(), routeCmd(), inspectCmd(), prefillCmd(), benchCmd(), healthCmd(), versionCmd())
	return root
}

// envLayer applies KVMESH_* variables to the flags of c not set on the
// command line.
func envLayer(c *cobra.Command) error {
	var err error
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, e)
			}
		}
	})
	return err
}

// releaseVersion is the release a build is stamped with:
// -ldflags "-X main.releaseVersion=0.1.0" (deploy/release.sh, the
// Dockerfile). Empty in other builds.
var releaseVersion string

// version is the release the binary was stamped with, else the module
// version the Go toolchain recorded, else "(devel)".
func version() string {
	if releaseVersion != "" {
		return releaseVersion
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the kvmesh version, and whether its GPU features are on",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "kvmesh", version())
			fmt.Fprintln(cmd.OutOrStdout(), gpu.Status())
		},
	}
}
