// Command chartpack packages the kvmesh Helm chart for a release
// (deploy/release.sh): chartcheck.Package, from the command line.
//
//	go -C deploy/chartcheck run ./cmd/chartpack -chart DIR -version V -image REPO -mtime UNIX -out DIR
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/deploy/chartcheck"
)

func main() {
	chart := flag.String("chart", "../helm/kvmesh", "the chart's directory")
	version := flag.String("version", "", "the release: the chart's version and appVersion, the default image tag")
	image := flag.String("image", "kvmesh", "the default image repository")
	mtime := flag.Int64("mtime", 0, "the archive entries' time, in Unix seconds (the commit's)")
	out := flag.String("out", ".", "the directory the archive goes to")
	flag.Parse()
	if *version == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "chartpack: -version is required, and no arguments; see -h")
		os.Exit(2)
	}
	path, err := chartcheck.Package(*chart, *version, *image, time.Unix(*mtime, 0), *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(path)
}
