#!/usr/bin/env python3
"""kvmesh from Python: put a prompt's KV blocks, look the prompt up, read the blocks back.

Run a node (go run ./cmd/kvmesh serve), then:

    python3 clients/python/example.py [--addr 127.0.0.1:7600] [--text "..."] [--token T]

It uses the kvmesh package in this directory (pip install ./clients/python, or
run it from the tree) and needs Debian's python3-grpcio and python3-numpy
(torch is optional: numpy arrays work the same).

The prompt is tokenized byte by byte (each UTF-8 byte is a token id), as by
`kvmesh inspect lookup --text`, and the blocks are written under the demo
namespace that `kvmesh inspect lookup --model kvmesh/demo` names, so afterwards

    kvmesh inspect lookup --model kvmesh/demo --text "<the same text>"

shows them cached. The KV here is made-up numbers; an inference engine would
pass its K/V tensors, shaped [layers, 2, tokens, kv_heads, head_dim].
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy as np
    import kvmesh
except ImportError as e:
    sys.exit(f"example.py: {e}: it needs grpcio, protobuf and numpy; on Debian apt-get install python3-grpcio "
             f"python3-numpy and run it with /usr/bin/python3 (this is {sys.executable})")

DEMO = kvmesh.Namespace("kvmesh/demo", "float32", block_tokens=16, layers=2, kv_heads=2, head_dim=16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=os.environ.get("KVMESH_ADDR", "127.0.0.1:7600"),
                    help="the node's gRPC address (default $KVMESH_ADDR, else 127.0.0.1:7600)")
    ap.add_argument("--text", default="The quick brown fox jumps over the lazy dog. ",
                    help="the prompt; one token per UTF-8 byte")
    ap.add_argument("--token", default=None, help="bearer token, for a node that requires one")
    args = ap.parse_args()

    tokens = list(args.text.encode("utf-8"))
    kv = np.random.default_rng(0).standard_normal(DEMO.block_shape(len(tokens))).astype(np.float32)
    try:
        with kvmesh.Client(args.addr, token=args.token) as c:
            stored = c.put(DEMO, tokens, kv)
            print(f"stored {stored} blocks of {DEMO.block_bytes} bytes")
            hit = c.lookup(DEMO, tokens)
            first = hit.blocks[0].node if hit.blocks else "-"
            print(f"cached {hit.cached_tokens} of {len(tokens)} tokens ({hit.cached_blocks} blocks, first on {first})")
            n, got = c.get(DEMO, tokens, array="numpy")
            path = "shared memory" if c.counters["shm_get"] else "gRPC"
    except kvmesh.KVMeshError as e:
        print(f"kvmesh at {args.addr}: {e.code}: {e}", file=sys.stderr)
        return 1
    if not np.array_equal(got, kv[:, :, :n]):
        print(f"read back {n} tokens: KV DIFFERS", file=sys.stderr)
        return 1
    print(f"read back {n} tokens through {path}: KV matches; keys {', '.join(k[:8] for k in kvmesh.keys(DEMO, tokens))}…")
    return 0


if __name__ == "__main__":
    sys.exit(main())
