// Package ready is the format of a node's ready file: the JSON document
// `kvmesh serve --ready-file PATH` writes once the node serves, naming the
// addresses it bound, so that scripts and tests can start a node with every
// port 0 and read back where it listens instead of guessing a free port.
//
// The file is written atomically (a temporary file in the same directory,
// renamed over PATH), so a reader that finds it finds it whole; the node
// removes it when it stops serving. The package imports nothing of kvmesh,
// so a script's helper or a benchmark reads it without linking the node.
package ready

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/internal/atomicfile"
)

// Info is the ready file's content. Addresses are host:port as other
// processes reach them: the port the node bound (never 0) and, for an
// address bound to an unspecified host (0.0.0.0, ::), the advertised host.
type Info struct {
	NodeID     string `json:"node_id"`     // the node's id in the cluster
	PID        int    `json:"pid"`         // the serving process
	GRPCAddr   string `json:"grpc_addr"`   // gRPC API (and health checks)
	HTTPAddr   string `json:"http_addr"`   // /metrics, /healthz and the OpenAI-compatible API
	DataAddr   string `json:"data_addr"`   // TCP data plane; "" for a node without one
	GossipAddr string `json:"gossip_addr"` // membership: what other nodes --join; "" without one
	ShmSocket  string `json:"shm_socket"`  // shared-memory data plane's unix socket; "" when off
}

// ErrExited is returned by Wait when the process exited before it wrote
// its ready file.
var ErrExited = errors.New("ready: process exited before it was ready")

// Write writes info to path atomically (atomicfile.Write), mode 0644.
func Write(path string, info Info) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("ready: encode: %w", err)
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("ready: write %s: %w", path, err)
	}
	return nil
}

// Read reads and decodes the ready file at path. A file that does not
// exist yet is an error that wraps fs.ErrNotExist.
func Read(path string) (Info, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Info{}, fmt.Errorf("ready: %w", err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("ready: %s is not a ready file: %w", path, err)
	}
	if info.GRPCAddr == "" || info.PID <= 0 {
		return Info{}, fmt.Errorf("ready: %s has no grpc_addr or pid", path)
	}
	return info, nil
}

// Wait polls path until the ready file is there and returns it. It fails as
// soon as exited is closed (the process died first: ErrExited), when the
// file cannot be read for another reason than its absence, or when ctx
// ends. A nil exited is never closed.
func Wait(ctx context.Context, path string, exited <-chan struct{}) (Info, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := Read(path)
		switch {
		case err == nil:
			return info, nil
		case !errors.Is(err, fs.ErrNotExist):
			return Info{}, err
		}
		select {
		case <-exited:
			return Info{}, ErrExited
		case <-ctx.Done():
			return Info{}, fmt.Errorf("ready: no ready file at %s: %w", path, context.Cause(ctx))
		case <-tick.C:
		}
	}
}
