// Package transfer is kvmesh's data plane: it moves batches of opaque
// (key, bytes) pairs between nodes, separately from the gRPC control plane.
//
// It will hold a framed protocol over TCP (batched requests, vectored writes,
// pooled buffers, several connections per peer, deadlines, bounded in-flight
// bytes), a same-host transport through shared memory for a worker beside its
// node, and the place where an RDMA verbs transport plugs in when NICs exist.
package transfer
