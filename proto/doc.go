// Package proto holds kvmesh's .proto files (under kvmesh/v1) and the Go code
// generated from them.
package proto
