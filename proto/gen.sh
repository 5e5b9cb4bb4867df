#!/usr/bin/env bash
# Regenerates the Go and Python code from proto/kvmesh/v1/*.proto:
#
#   bash proto/gen.sh
#
# Tools, pinned so that the committed output is reproducible:
#   protoc               3.21.12  Debian bookworm's protobuf-compiler
#   protoc-gen-go        v1.36.12 google.golang.org/protobuf (the version in go.mod)
#   protoc-gen-go-grpc   v1.6.2   google.golang.org/grpc/cmd/protoc-gen-go-grpc
#   grpc_tools.protoc    Debian's python3-grpc-tools, run by /usr/bin/python3
# The Go plugins are installed into a private GOBIN, never onto PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

want_protoc="libprotoc 3.21.12"
if [[ "$(protoc --version)" != "$want_protoc" ]]; then
	echo "proto/gen.sh: need $want_protoc (apt-get install protobuf-compiler), have: $(protoc --version 2>&1)" >&2
	exit 1
fi
py=/usr/bin/python3
if ! "$py" -c 'import grpc_tools.protoc' 2>/dev/null; then
	echo "proto/gen.sh: need Debian's python3-grpc-tools (apt-get install python3-grpc-tools)" >&2
	exit 1
fi

bin="${TMPDIR:-/tmp}/kvmesh-proto-bin"
GOBIN="$bin" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOBIN="$bin" go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

protos=(kvmesh/v1/types.proto kvmesh/v1/errors.proto kvmesh/v1/cache.proto kvmesh/v1/admin.proto kvmesh/v1/prefill.proto kvmesh/v1/peer.proto kvmesh/v1/object.proto)

rm -f proto/kvmesh/v1/*.pb.go
PATH="$bin:$PATH" protoc -I proto \
	--go_out=proto --go_opt=paths=source_relative \
	--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	"${protos[@]}"

out=clients/python
rm -f "$out"/kvmesh/v1/*_pb2.py "$out"/kvmesh/v1/*_pb2_grpc.py
mkdir -p "$out/kvmesh/v1"
"$py" -m grpc_tools.protoc -I proto --python_out="$out" --grpc_python_out="$out" "${protos[@]}"
touch "$out/kvmesh/__init__.py" "$out/kvmesh/v1/__init__.py"
