// Package client is the Go client of kvmesh's gRPC API, for inference workers
// and the CLI, and of the same-host shared-memory path.
package client
