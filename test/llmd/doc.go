// Package llmd checks kvmesh's KV events against their main consumer:
// llm-d's KV-cache indexer (github.com/llm-d/llm-d-kv-cache), its own ZMQ
// subscriber, vLLM adapter, event pool and in-memory index, subscribed to
// a kvmesh node's --kv-events-addr. What the node's tiers hold must show
// in the index under the node's pod and the namespace's model, by tier,
// and leave it when the blocks leave.
//
// It is a module of its own so that llm-d and its dependencies
// (Kubernetes client libraries among them) stay out of kvmesh's go.mod:
//
//	cd test/llmd && go test ./...
//
// The llm-d version is pinned in go.mod. Where the Go module proxy does
// not serve llm-d (the sandbox this was written in answered 403 Forbidden,
// and could not resolve github.com for a direct fetch), point it at a
// checkout: go mod edit -replace github.com/llm-d/llm-d-kv-cache=/path.
package llmd
