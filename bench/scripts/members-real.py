#!/usr/bin/env python3
"""members-real.py BIN N [REPEATS]: membership times on N real `kvmesh serve`
processes on loopback (--gossip-profile lan, the scale suite's default), to
set beside `kvmesh bench scale --phases membership --nodes N` (issue 35).

For each repeat: a join (a new process; timed from its ready file, written
once its join returned, until every other node's kvmesh_cluster_members
counts it), a graceful leave (SIGTERM) and a crash (SIGKILL), each timed
until 99% and all of the other nodes' counts show it. Every node's /metrics
is polled about every 50 ms, so times carry that much resolution and the
load of the polling itself. Ports are 0, read back from ready files."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BIN, N = sys.argv[1], int(sys.argv[2])
REPEATS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
D = tempfile.mkdtemp()
procs = {}


def start(i, seed=None):
    nid = "n%d" % i
    os.makedirs(os.path.join(D, nid), exist_ok=True)
    ready = os.path.join(D, nid + ".ready")
    args = ["nice", BIN, "serve", "--node-id", nid, "--data-dir", os.path.join(D, nid),
            "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0",
            "--gossip-addr", "127.0.0.1:0", "--ready-file", ready, "--dram", "16777216", "--nvme", "0",
            "--log-level", "error", "--gossip-profile", "lan"]
    if seed:
        args += ["--join", seed]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(os.path.join(D, nid + ".log"), "w"))
    for _ in range(600):
        if os.path.exists(ready) and os.path.getsize(ready) > 0:
            break
        time.sleep(0.05)
    else:
        raise SystemExit(nid + " did not start")
    t = time.monotonic()
    info = json.load(open(ready))
    procs[nid] = (p, info)
    return nid, t


def members(nid):
    try:
        with urllib.request.urlopen("http://%s/metrics" % procs[nid][1]["http_addr"], timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("kvmesh_cluster_members "):
                    return int(float(line.split()[1]))
    except OSError:
        return -1
    return -1


def watch(nodes, want, t0, limit=120):
    """Times after t0 at which each node first counts want members."""
    seen = {}
    lock = threading.Lock()

    def poll(nid):
        while time.monotonic() - t0 < limit:
            if members(nid) == want:
                with lock:
                    seen[nid] = time.monotonic() - t0
                return
            time.sleep(0.05)

    ts = [threading.Thread(target=poll, args=(n,)) for n in nodes]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if len(seen) < len(nodes):
        raise SystemExit("%d of %d nodes never counted %d members" % (len(nodes) - len(seen), len(nodes), want))
    v = sorted(seen.values())
    return v[min(len(v) - 1, (len(v) * 99 + 99) // 100 - 1)], v[-1]


def main():
    seed = None
    for i in range(N):
        nid, _ = start(i, seed)
        if seed is None:
            seed = procs[nid][1]["gossip_addr"]
    watch(list(procs), N, time.monotonic())
    nxt = N
    res = {"join": [], "leave": [], "crash": []}
    for _ in range(REPEATS):
        others = list(procs)
        nid, t0 = start(nxt, seed)
        nxt += 1
        res["join"].append(watch(others, N + 1, t0))
        victim = [n for n in procs if n != "n0"][0]
        p, _ = procs.pop(victim)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        res["leave"].append(watch(list(procs), N, t0))
        p.wait()
        victim = [n for n in procs if n != "n0"][0]
        p, _ = procs.pop(victim)
        t0 = time.monotonic()
        p.send_signal(signal.SIGKILL)
        res["crash"].append(watch(list(procs), N - 1, t0))
        p.wait()
        # Back to N members for the next repeat.
        nid, _ = start(nxt, seed)
        nxt += 1
        watch(list(procs), N, time.monotonic())
    for ev, v in res.items():
        alls = sorted(a for _, a in v)
        p99s = sorted(p for p, _ in v)
        print("nodes %d %-5s p99 %.2f s, all %.2f s (median of %d; all min %.2f max %.2f)" % (
            N, ev, p99s[len(p99s) // 2], alls[len(alls) // 2], len(v), alls[0], alls[-1]))


try:
    main()
finally:
    for p, _ in procs.values():
        p.kill()
    for p, _ in procs.values():
        p.wait()
    subprocess.run(["rm", "-rf", D])
