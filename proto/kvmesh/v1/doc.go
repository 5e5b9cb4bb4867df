// Package kvmeshv1 is kvmesh's gRPC API, kvmesh.v1: the .proto files in this
// directory and the Go code generated from them. The Python code generated
// from the same files lives in clients/python.
//
// Services: CacheService (Lookup, BatchGet, BatchPut, Exists, Publish,
// Stats) for inference workers; AdminService (Members, DropNamespace,
// BlockInfo, SetQuota, Quotas, WhoAmI) for operators; ObjectService (Put,
// Get, Remove, Retain) for objects by name and the retention of cached
// values; PeerService (Lookup, Remove, Retain) that nodes ask each other;
// and PrefillService (Prefill, GetResult,
// Engine), served when the node runs its bundled prefill engine. Nodes also
// serve grpc.health.v1 and server reflection.
//
// The generated files (*.pb.go) are committed and never edited by hand.
// After editing a .proto, regenerate everything with
//
//	bash proto/gen.sh
//
// which pins its tools: Debian's protoc 3.21.12, protoc-gen-go v1.36.12 (the
// protobuf version in go.mod), protoc-gen-go-grpc v1.6.2 and Debian's
// python3-grpc-tools. Field numbers are never reused; removed fields are
// reserved. codec.go is written by hand: the proto codec that nodes and the
// Go client use on their connections (Codec); so is reason.go, the
// ErrorInfo reasons of errors.proto as strings (ErrorReason.Reason,
// ParseErrorReason).
//
// The contract is checked by buf (buf.yaml at the repository root, pinned by
// proto/tools/package-lock.json):
//
//	(cd proto/tools && npm ci) && bash proto/check.sh
//
// runs buf lint (the STANDARD rules, no exceptions) and buf breaking against
// proto/released, the last released contract (see its README.md): a change
// that removes or renames anything fails; additions pass. CI runs it.
//
// # Concurrency
//
// The generated messages are plain structs: not safe for concurrent
// mutation, safe to read from many goroutines once built. Codec is safe
// for concurrent use.
package kvmeshv1
