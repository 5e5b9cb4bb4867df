// Package llmd checks kvmesh's KV events against their main consumer:
// llm-d's KV-cache indexer (github.com/llm-d/llm-d-kv-cache), its own ZMQ
// subscriber, vLLM adapter, event pool and in-memory index, subscribed to
// two kvmesh nodes' --kv-events-addr. What a node's tiers hold must show
// in the index under the node's pod and the namespace's model, by tier,
// and leave it when the blocks leave; llm-d's longest-prefix scorer must
// rank the node that holds a prompt above the other.
//
// It is a module of its own so that llm-d and its dependencies
// (Kubernetes client libraries among them) stay out of kvmesh's go.mod:
//
//	cd test/llmd && go test ./...
//
// The llm-d version is pinned in go.mod. Where the Go module proxy does
// not serve llm-d (the sandbox this was written in answers 403 Forbidden
// for github.com/llm-d/llm-d-kv-cache, while it serves llm-d's
// dependencies), point it at a checkout of that commit without editing
// go.mod: .ci/run does this when KVMESH_LLMD_SRC names the checkout.
//
//	cp go.mod /tmp/llmd.mod && cp go.sum /tmp/llmd.sum
//	go mod edit -replace github.com/llm-d/llm-d-kv-cache=$KVMESH_LLMD_SRC /tmp/llmd.mod
//	GOFLAGS=-mod=mod go test -race -modfile=/tmp/llmd.mod ./...
package llmd
