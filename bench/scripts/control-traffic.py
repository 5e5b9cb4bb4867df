#!/usr/bin/env python3
"""control-traffic.py BIN N [SECONDS] [RATE]: the control requests each node
receives (kvmesh_control_requests_total{kind}: forwarded queue requests,
routers' lookups, claims, leases) on N real `kvmesh serve` processes and one
`kvmesh route` on loopback (ports 0, read back from ready files and the
router's log; 16 MiB DRAM each, the bundled engine, --gossip-profile local).
Issue 35: this traffic should not grow with the cluster.

Phases, SECONDS each (default 20), counters summed over the nodes before and
after each:
  idle        nothing sent.
  queue       GET /v1/queue/{id} of a random batch (one batch accepted by
              each node, completed before the phase) at a random node, RATE
              per node per second (default 1): a client polling its batch
              at whichever node its load balancer picks.
  route-queue the same GETs through the router.
  route       completions (random short prompt, max_tokens 1) through the
              router, RATE per node per second.
  route-long  the same with random 1,100-token prompts (bytes: two whole
              placement chunks, whose blocks are pushed to their owners),
              RATE/4 per node per second.
The load is open-loop (paced by a schedule, 8 senders); each line prints the
client requests sent, the control requests received per node per second by
kind, and per client request. Beside them, not counted as control: the
data-plane requests nodes served (pushes to owners, gets, lookups), the
lookups nodes sent to a prompt's owners (kvmesh_cluster_remote_lookups_total:
the lookup's fan-out), and the data-plane connections open per node at the
phase's end."""
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BIN, N = sys.argv[1], int(sys.argv[2])
SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 20
RATE = float(sys.argv[4]) if len(sys.argv) > 4 else 1
KINDS = ("queue_forwarded", "lookup", "claim", "lease")
D = tempfile.mkdtemp()
procs = []


def start(i, seed):
    nid = "n%d" % i
    ready = os.path.join(D, nid + ".ready")
    args = ["nice", BIN, "serve", "--node-id", nid, "--data-dir", os.path.join(D, nid),
            "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0",
            "--gossip-addr", "127.0.0.1:0", "--ready-file", ready, "--dram", "16777216", "--nvme", "0",
            "--log-level", "warn", "--gossip-profile", "local"]
    if seed:
        args += ["--join", seed]
    procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(os.path.join(D, nid + ".log"), "w")))
    for _ in range(1200):
        if os.path.exists(ready) and os.path.getsize(ready) > 0:
            return json.load(open(ready))
        time.sleep(0.05)
    raise SystemExit(nid + " did not start")


def start_router(seed):
    log = os.path.join(D, "router.log")
    procs.append(subprocess.Popen(["nice", BIN, "route", "--join", seed, "--http-addr", "127.0.0.1:0",
                                   "--gossip-profile", "local", "--log-level", "warn"],
                                  stdout=open(log, "w"), stderr=subprocess.STDOUT))
    for _ in range(1200):
        m = re.search(r"openai +http://([0-9.:]+)/v1", open(log).read())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise SystemExit("the router did not start")


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def scrape(nodes, prefix):
    """Sum over the nodes of each series starting with prefix, by its labels."""
    out = {}
    for n in nodes:
        _, b = call("GET", "http://%s/metrics" % n["http_addr"])
        for line in b.decode().splitlines():
            if line.startswith(prefix):
                k, v = line.rsplit(" ", 1)
                out[k] = out.get(k, 0) + float(v)
    return out


def control(nodes):
    s = scrape(nodes, "kvmesh_control_requests_total")
    out = {k: s.get('kvmesh_control_requests_total{kind="%s"}' % k, 0) for k in KINDS}
    # Beside them, not counted in them: the calls between nodes' stores
    # (lookups of a prompt's owners, pushes and gets on the data plane).
    s = scrape(nodes, "kvmesh_transfer_requests_total")
    out["data"] = s.get('kvmesh_transfer_requests_total{transport="tcp"}', 0)
    s = scrape(nodes, "kvmesh_cluster_remote_lookups_total")
    out["lookups"] = s.get("kvmesh_cluster_remote_lookups_total", 0)
    return out


def conns(nodes):
    """Data-plane connections open on each node (pushes and gets from peers)."""
    out = []
    for n in nodes:
        _, b = call("GET", "http://%s/metrics" % n["http_addr"])
        out += [float(line.rsplit(" ", 1)[1]) for line in b.decode().splitlines()
                if line.startswith('kvmesh_transfer_connections{transport="tcp"}')]
    return out


def paced(total, seconds, send):
    """Calls send(i) for i < total on a schedule spread over seconds; 8 senders."""
    t0 = time.monotonic()
    nxt = [0]
    lock = threading.Lock()
    codes = {}

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= total:
                return
            wait = t0 + i * seconds / total - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            c = send(i)
            with lock:
                codes[c] = codes.get(c, 0) + 1

    ts = [threading.Thread(target=worker) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.monotonic() - t0, codes


def phase(name, nodes, total, send):
    c0 = control(nodes)
    if total == 0:
        time.sleep(SECONDS)
        took, codes = SECONDS, {}
    else:
        took, codes = paced(total, SECONDS, send)
    c1 = control(nodes)
    d = {k: c1[k] - c0[k] for k in KINDS}
    per = ", ".join("%s %.2f" % (k, d[k] / took / N) for k in KINDS)
    all_ = sum(d.values())
    line = "nodes %d %-11s %5.1f s, %d client requests %s: control per node per second %.2f (%s)" % (
        N, name, took, total, json.dumps(codes, sort_keys=True), all_ / took / N, per)
    if total:
        line += ", per client request %.2f" % (all_ / total)
    c = conns(nodes)
    line += "; beside: data-plane requests per node per second %.2f (peer lookups %.2f), connections per node mean %.1f max %d" % (
        (c1["data"] - c0["data"]) / took / N, (c1["lookups"] - c0["lookups"]) / took / N, sum(c) / max(1, len(c)), max(c, default=0))
    print(line, flush=True)


def main():
    nodes = [start(0, None)]
    seed = nodes[0]["gossip_addr"]
    for i in range(1, N):
        nodes.append(start(i, seed))
    router = start_router(seed)
    # Gossip settles: every node counts every node and the router.
    for _ in range(600):
        s = scrape(nodes, "kvmesh_cluster_members ")
        if s.get("kvmesh_cluster_members", 0) == N * (N + 1):
            break
        time.sleep(0.2)
    else:
        raise SystemExit("gossip did not settle")
    ids = []
    for n in nodes:
        _, b = call("POST", "http://%s/v1/queue" % n["http_addr"],
                    {"requests": [{"model": "kvmesh", "prompt": "a batch of " + n["node_id"], "max_tokens": 1, "temperature": 0}]})
        ids.append((n, json.loads(b)["request_id"]))
    for n, i in ids:
        for _ in range(600):
            _, b = call("GET", "http://%s/v1/queue/%s" % (n["http_addr"], i))
            if json.loads(b).get("status") == "completed":
                break
            time.sleep(0.1)
    rnd = random.Random(1)
    total = int(RATE * N * SECONDS)
    phase("idle", nodes, 0, None)
    picks = [(rnd.choice(nodes), rnd.choice(ids)[1]) for _ in range(total)]
    phase("queue", nodes, total, lambda i: call("GET", "http://%s/v1/queue/%s" % (picks[i][0]["http_addr"], picks[i][1]))[0])
    phase("route-queue", nodes, total, lambda i: call("GET", "http://%s/v1/queue/%s" % (router, picks[i][1]))[0])
    prompts = ["request %d of the control traffic run: %s" % (i, rnd.random()) for i in range(total)]
    phase("route", nodes, total, lambda i: call("POST", "http://%s/v1/completions" % router,
                                                {"model": "kvmesh", "prompt": prompts[i], "max_tokens": 1, "temperature": 0})[0])
    # Prompts of 1,100 tokens (two whole 512-token chunks), a quarter of the
    # rate: their blocks are pushed to their chunks' owners.
    longs = ["".join(rnd.choice("abcdefgh ") for _ in range(1100)) for _ in range(total // 4)]
    phase("route-long", nodes, len(longs), lambda i: call("POST", "http://%s/v1/completions" % router,
                                                          {"model": "kvmesh", "prompt": longs[i], "max_tokens": 1, "temperature": 0})[0])


try:
    main()
finally:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    subprocess.run(["rm", "-rf", D])
