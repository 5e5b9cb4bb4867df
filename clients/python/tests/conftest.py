"""Fixtures: the kvmesh binary and real `kvmesh serve` processes.

The binary is built once per session from the repository (go build) unless
KVMESH_BIN names one. Nodes bind every address to 127.0.0.1 port 0 and report
what they bound: in the JSON of --ready-file when the binary has that flag
(ready_addresses), else in the lines `kvmesh serve` prints (node_addresses).
"""
import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
if os.environ.get("KVMESH_PY_INSTALLED"):
    # CI: test the installed package, not the tree beside the tests.
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != REPO / "clients" / "python"]
    import kvmesh
    assert REPO / "clients" / "python" not in pathlib.Path(kvmesh.__file__).resolve().parents, kvmesh.__file__
else:
    sys.path.insert(0, str(REPO / "clients" / "python"))  # the package from the tree, also without installing


@pytest.fixture(scope="session")
def kvmesh_bin(tmp_path_factory):
    if os.environ.get("KVMESH_BIN"):
        return os.environ["KVMESH_BIN"]
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = tmp_path_factory.mktemp("bin") / "kvmesh"
    subprocess.run([go, "build", "-o", str(out), "./cmd/kvmesh"], cwd=REPO, check=True)
    return str(out)


def node_addresses(proc, deadline):
    """Reads what a starting `kvmesh serve` bound, from the lines it prints:
    {"grpc_addr", "data_addr", "shm_socket", "node_id"}."""
    got = {}
    pats = {"node_id": re.compile(r"serving node (\S+)"), "grpc_addr": re.compile(r"^\s+gRPC\s+(\S+)"),
            "data": re.compile(r"^\s+data\s+(\S+)\s+shm\s+(\S+)")}
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"kvmesh serve exited ({proc.poll()}) before reporting its addresses")
        for k, p in pats.items():
            m = p.search(line)
            if m:
                if k == "data":
                    got["data_addr"], got["shm_socket"] = m.group(1), m.group(2)
                else:
                    got[k] = m.group(1)
        if line.startswith("try:"):
            return got
    raise RuntimeError("kvmesh serve did not report its addresses in time")


@functools.lru_cache(maxsize=None)
def has_ready_file(binary):
    r = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True)
    return "--ready-file" in r.stdout + r.stderr


def ready_addresses(proc, path, deadline):
    """Reads the JSON that `kvmesh serve --ready-file path` writes once it serves."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kvmesh serve exited ({proc.returncode}) before it was ready")
        try:
            with open(path) as f:
                info = json.load(f)
            if info.get("pid") == proc.pid:
                return info
        except (OSError, ValueError):
            pass  # not written yet, or being written
        time.sleep(0.02)
    raise RuntimeError("kvmesh serve did not write its ready file in time")


class Node:
    def __init__(self, binary, *extra, env=None):
        self.dir = tempfile.mkdtemp(prefix="kvmesh-py-")
        args = [binary, "serve", "--data-dir", self.dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
                "--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--dram", "256MiB", "--nvme", "256MiB",
                "--log-level", "warn", *extra]
        ready = os.path.join(self.dir, "ready.json") if has_ready_file(binary) else None
        if ready:
            args += ["--ready-file", ready]
        self.stderr = open(os.path.join(self.dir, "stderr.log"), "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL if ready else subprocess.PIPE,
                                     stderr=self.stderr, text=True, env={**os.environ, **(env or {})})
        try:
            if ready:
                info = ready_addresses(self.proc, ready, time.monotonic() + 60)
            else:
                info = node_addresses(self.proc, time.monotonic() + 60)
        except Exception:
            self.stop()
            raise
        self.addr = info["grpc_addr"]
        self.shm_socket = info.get("shm_socket", "off")
        self.gossip_addr = info.get("gossip_addr")
        self.node_id = info.get("node_id")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def node(kvmesh_bin):
    n = Node(kvmesh_bin)
    yield n
    n.stop()


@pytest.fixture(scope="session")
def gossip_key(tmp_path_factory):
    """A gossip key file: a node with any credential (--auth-token-file,
    --tokens-file) refuses to gossip in the clear."""
    import base64
    k = tmp_path_factory.mktemp("gossip") / "gossip.key"
    k.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    return str(k)


@pytest.fixture(scope="session")
def start_node(kvmesh_bin):
    started = []

    def start(*extra, **kw):
        n = Node(kvmesh_bin, *extra, **kw)
        started.append(n)
        return n
    yield start
    for n in started:
        n.stop()
