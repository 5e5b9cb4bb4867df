// Package node is the kvmesh daemon: configuration, membership (memberlist),
// the gRPC services, Prometheus metrics and the process lifecycle. It is the
// only package that knows memberlist and gRPC servers; it wires the store,
// the transfer engine and the prefill engine together.
package node
