#!/usr/bin/env python3
"""Python get vs the Go client, on one node, in one run.

    /usr/bin/python3 clients/python/bench.py [--kvmesh BIN] [--duration 2] [-o table|json]

Starts a node (kvmesh serve on 127.0.0.1 port 0), puts one prompt of 32 MiB of
float16 blocks per block size (64 KiB, 1 MiB, 4 MiB), then reads it back over
and over for --duration seconds, single caller, each block into its place in
a preallocated buffer (Python and Go alternate in --rounds slices; medians):
  - Python, kvmesh.Client.get(ns, tokens, out) into a torch tensor, through
    shared memory and through gRPC;
  - Go, package client's Get into a []byte's slices (client.Into)
    (clients/python/benchgo), through shared memory, gRPC and TCP.
and times kvmesh.keys of a 128k-token prompt. Targets (issue 15): Python ≥ 0.8×
Go on each path; keys ≤ 5 ms.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "tests"))

import kvmesh  # noqa: E402
import torch  # noqa: E402
from conftest import Node  # noqa: E402

SIZES = {64 << 10: 1, 1 << 20: 16, 4 << 20: 64}  # block bytes -> layers (16 tokens x 8 heads x 128 x fp16 = 64 KiB a layer)
TOTAL = 32 << 20


def go_build(out):
    subprocess.run(["go", "build", "-o", str(out / "kvmesh"), "./cmd/kvmesh"], cwd=REPO, check=True)
    subprocess.run(["go", "build", "-o", str(out / "benchgo"), "./clients/python/benchgo"], cwd=REPO, check=True)
    return out / "kvmesh", out / "benchgo"


def py_get(addr, path, ns, tokens, dur):
    with kvmesh.Client(addr, transport={"shm": "auto"}.get(path, path)) as c:
        out = torch.empty(ns.block_shape(len(tokens)), dtype=torch.float16)
        n, _ = c.get(ns, tokens, out)
        assert n == len(tokens), (n, len(tokens))
        path += "_get"
        c.counters[path] = 0
        t0, iters = time.perf_counter(), 0
        while time.perf_counter() - t0 < dur:
            c.get(ns, tokens, out)
            iters += 1
        el = time.perf_counter() - t0
        assert c.counters[path] == iters * (len(tokens) // 16), c.counters
    return iters * len(tokens) // 16 * ns.block_bytes / el / 1e9


def go_get(benchgo, addr, transport, layers, blocks, first, dur):
    r = subprocess.run([str(benchgo), "-addr", addr, "-transport", transport, "-layers", str(layers), "-blocks",
                        str(blocks), "-first-token", str(first), "-duration", f"{dur}s"],
                       check=True, capture_output=True, text=True)
    return json.loads(r.stdout)["gb_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvmesh", help="kvmesh binary (default: go build)")
    ap.add_argument("--benchgo", help="benchgo binary (default: go build)")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per figure, over all rounds")
    ap.add_argument("--rounds", type=int, default=5, help="alternating slices per figure")
    ap.add_argument("-o", default="table", choices=["table", "json"])
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kvmesh-pybench-"))
    kv_bin, go_bin = (args.kvmesh, args.benchgo) if args.kvmesh and args.benchgo else go_build(tmp)
    node = Node(str(kv_bin), "--dram", "1GiB")
    rows = []
    try:
        for size, layers in SIZES.items():
            ns = kvmesh.Namespace("py/bench", "float16", 16, layers=layers, kv_heads=8, head_dim=128)
            blocks = TOTAL // size
            first = 1 + layers * 1_000_000
            tokens = list(range(first, first + 16 * blocks))
            with kvmesh.Client(node.addr) as c:
                assert c.put(ns, tokens, torch.randn(ns.block_shape(len(tokens))).half()) == blocks
            row = {"block_bytes": size, "blocks": blocks}
            # Python and Go alternate in short slices, and each figure is the median of its
            # slices, so that load from other processes weighs on both alike.
            d = args.duration / args.rounds
            samples = {k: [] for k in ("python_shm", "go_shm", "python_grpc", "go_grpc", "python_tcp", "go_tcp")}
            for _ in range(args.rounds):
                samples["python_shm"].append(py_get(node.addr, "shm", ns, tokens, d))
                samples["go_shm"].append(go_get(go_bin, node.addr, "auto", layers, blocks, first, d))
                samples["python_grpc"].append(py_get(node.addr, "grpc", ns, tokens, d))
                samples["python_tcp"].append(py_get(node.addr, "tcp", ns, tokens, d))
                samples["go_grpc"].append(go_get(go_bin, node.addr, "grpc", layers, blocks, first, d))
                samples["go_tcp"].append(go_get(go_bin, node.addr, "tcp", layers, blocks, first, d))
            for k, v in samples.items():
                row[k] = statistics.median(v)
            row["ratio_shm"] = row["python_shm"] / row["go_shm"]
            row["ratio_grpc"] = row["python_grpc"] / row["go_grpc"]
            row["ratio_tcp"] = row["python_tcp"] / row["go_tcp"]
            rows.append(row)
    finally:
        node.stop()
    ns = kvmesh.Namespace("py/bench", "bfloat16", 16, layers=32, kv_heads=8, head_dim=128)
    toks = list(range(128 * 1024))
    keys_ms = min((lambda t0: (kvmesh.keys(ns, toks), time.perf_counter() - t0)[1])(time.perf_counter())
                  for _ in range(10)) * 1e3
    rep = {"get": rows, "keys_128k_ms": keys_ms, "key_format": kvmesh.KEY_VERSION,
           "checks": {"python_get_vs_go >= 0.8 (every size and path)":
                      min(min(r["ratio_shm"], r["ratio_grpc"], r["ratio_tcp"]) for r in rows) >= 0.8,
                      "keys_128k <= 5 ms": keys_ms <= 5}}
    if args.o == "json":
        json.dump(rep, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'block':>7} {'py shm':>8} {'go shm':>8} {'ratio':>6}   {'py tcp':>8} {'go tcp':>8} {'ratio':>6}   "
          f"{'py grpc':>8} {'go grpc':>8} {'ratio':>6}  (GB/s)")
    for r in rows:
        print(f"{r['block_bytes'] >> 10:>5}Ki {r['python_shm']:8.2f} {r['go_shm']:8.2f} {r['ratio_shm']:6.2f}   "
              f"{r['python_tcp']:8.2f} {r['go_tcp']:8.2f} {r['ratio_tcp']:6.2f}   "
              f"{r['python_grpc']:8.2f} {r['go_grpc']:8.2f} {r['ratio_grpc']:6.2f}")
    print(f"keys of a 128k-token prompt: {keys_ms:.2f} ms")
    for k, v in rep["checks"].items():
        print(f"{'ok  ' if v else 'FAIL'} {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
