#!/usr/bin/env python3
"""kvmesh from Python: put blocks, look the prompt up, read the blocks back.

Run a node (go run ./cmd/kvmesh serve), then:

    python3 clients/python/example.py [--addr 127.0.0.1:7600] [--text "..."]

It needs grpcio and protobuf (Debian: apt-get install python3-grpcio). The
code under kvmesh/v1 is generated from proto/kvmesh/v1 by proto/gen.sh.

The prompt is tokenized byte by byte (each UTF-8 byte is a token id), as by
`kvmesh inspect lookup --text`, and the blocks are written under the demo
namespace that `kvmesh inspect lookup --model kvmesh/demo` names, so afterwards

    kvmesh inspect lookup --model kvmesh/demo --text "<the same text>"

shows them cached. The payloads here are made-up bytes; an inference engine
would send its K/V tensors, laid out [layer][K|V][token][kv_head][head_dim].
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import grpc
    from kvmesh.v1 import cache_pb2, cache_pb2_grpc, types_pb2
except ImportError as e:
    sys.exit(f"example.py: {e}: it needs grpcio and protobuf; on Debian apt-get install python3-grpcio "
             f"and run it with /usr/bin/python3 (this is {sys.executable})")

DEMO_NAMESPACE = types_pb2.Namespace(
    model="kvmesh/demo", dtype=types_pb2.DTYPE_FLOAT32, block_tokens=16,
    layer_start=0, layer_end=2, kv_heads=2, head_dim=16)

DTYPE_SIZE = {types_pb2.DTYPE_FLOAT32: 4, types_pb2.DTYPE_FLOAT16: 2, types_pb2.DTYPE_BFLOAT16: 2,
              types_pb2.DTYPE_FP8_E4M3: 1, types_pb2.DTYPE_FP8_E5M2: 1, types_pb2.DTYPE_INT8: 1}

CHUNK = 1 << 20  # payload bytes per message; the node accepts messages up to 4 MiB


def block_bytes(ns):
    """Payload size of one block: layers x {K,V} x tokens x kv_heads x head_dim x dtype size."""
    return ((ns.layer_end - ns.layer_start) * 2 * ns.block_tokens * ns.kv_heads * ns.head_dim
            * DTYPE_SIZE[ns.dtype])


def put_requests(ns, tokens, payloads):
    """The BatchPut stream: the namespace first, then per block a header and its payload in chunks.

    The headers leave parent empty: each block chains from the previous block
    of the stream, and the first from the namespace root.
    """
    b = ns.block_tokens
    for i, payload in enumerate(payloads):
        for off in range(0, len(payload), CHUNK):
            req = cache_pb2.BatchPutRequest(data=payload[off:off + CHUNK])
            if i == 0 and off == 0:
                req.namespace.CopyFrom(ns)
            if off == 0:
                req.block.CopyFrom(cache_pb2.BlockHeader(tokens=tokens[i * b:(i + 1) * b], payload_len=len(payload)))
            yield req


def read_prefix(stub, ns, tokens):
    """Reads the cached prefix of a prompt with BatchGet; returns the payloads in order."""
    blocks = []
    for frame in stub.BatchGet(cache_pb2.BatchGetRequest(namespace=ns, tokens=tokens, prefix=True), timeout=10):
        if frame.offset == 0 and frame.key:  # a block's first frame
            if not frame.found:
                break
            blocks.append(bytearray())
        blocks[-1] += frame.data
    return [bytes(b) for b in blocks]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default="127.0.0.1:7600", help="the node's gRPC address")
    ap.add_argument("--text", default="The quick brown fox jumps over the lazy dog. ",
                    help="the prompt; one token per UTF-8 byte")
    args = ap.parse_args()

    ns = DEMO_NAMESPACE
    tokens = list(args.text.encode("utf-8"))
    n = len(tokens) // ns.block_tokens
    size = block_bytes(ns)
    payloads = [bytes((i * 31 + j) % 251 for j in range(size)) for i in range(n)]

    with grpc.insecure_channel(args.addr) as channel:
        stub = cache_pb2_grpc.CacheServiceStub(channel)
        try:
            put = stub.BatchPut(put_requests(ns, tokens, payloads), timeout=10)
            print(f"stored {put.stored} blocks of {size} bytes")

            look = stub.Lookup(cache_pb2.LookupRequest(namespace=ns, tokens=tokens), timeout=10)
            print(f"cached {look.cached_tokens} of {look.prompt_tokens} tokens "
                  f"({look.cached_blocks} blocks, first on {look.blocks[0].node_id if look.blocks else '-'})")

            got = read_prefix(stub, ns, tokens)
        except grpc.RpcError as e:
            print(f"kvmesh at {args.addr}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    if got != payloads:
        print(f"read back {len(got)} blocks: payloads DIFFER", file=sys.stderr)
        return 1
    print(f"read back {len(got)} blocks: payloads match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
