"""Tokens, tenants and TLS, against nodes started with them."""
import shutil
import subprocess

import pytest

import kvmesh

torch = pytest.importorskip("torch")

TOKENS = """
secret: "0123456789abcdef0123456789abcdef-pytest"
tokens:
  - {token: acme-rw, tenant: acme, scopes: [read, write]}
  - {token: acme-r, tenant: acme, scopes: [read]}
  - {token: beta-rw, tenant: beta, scopes: [read, write]}
  - {token: ops-r, scopes: [read]}
  - {token: ops-rw, scopes: [read, write]}
  - {token: node-to-node, scopes: [cluster, read, write]}
"""

NS = kvmesh.Namespace("py/auth", "float16", 16, layers=2, kv_heads=2, head_dim=8)


def kv_of(n, seed):
    return torch.randn(NS.block_shape(n), generator=torch.Generator().manual_seed(seed)).half()


@pytest.fixture(scope="module")
def tenant_node(start_node, tmp_path_factory, gossip_key):
    f = tmp_path_factory.mktemp("auth") / "tokens.yaml"
    f.write_text(TOKENS)
    return start_node("--tokens-file", str(f), "--gossip-key-file", gossip_key)


PATHS = {"shm": "auto", "tcp": "tcp", "grpc": "grpc"}


@pytest.mark.parametrize("path", list(PATHS))
def test_tenant_round_trip(tenant_node, path):
    shm = PATHS[path]
    toks = list(range(7000 + len(path) * 100, 7048 + len(path) * 100))
    kv = kv_of(48, 1)
    with kvmesh.Client(tenant_node.addr, token="acme-rw", transport=shm) as c:
        m = c.meta(NS)
        assert m.salt and m.tag, "a tenant's client learns its salt and tag"
        assert c.put(NS, toks, kv) == 3
        n, got = c.get(NS, toks)
        assert n == 48 and torch.equal(got, kv)
        assert c.lookup(NS, toks).cached_tokens == 48
        assert c.counters[path + "_get"] == 3
        assert c.counters[path + "_put"] == 3
        if path == "shm":
            assert not c._shm.in_place, "a tenant was given the node's arena, which holds every tenant's blocks"
    # The tenant's read-only token reads them; the other tenant sees nothing.
    with kvmesh.Client(tenant_node.addr, token="acme-r", transport=shm) as c:
        assert c.get(NS, toks)[0] == 48
    with kvmesh.Client(tenant_node.addr, token="beta-rw", transport=shm) as c:
        assert c.lookup(NS, toks).cached_tokens == 0
        assert c.get(NS, toks)[0] == 0


def test_arena_is_a_writers_privilege(tenant_node):
    """Only a node-wide writer maps the node's DRAM arena in place: a node-wide reader (like a
    tenant) reads copies in its own region, and gets the same bytes."""
    toks = list(range(7600, 7632))
    kv = kv_of(32, 6)
    with kvmesh.Client(tenant_node.addr, token="ops-rw", transport="auto") as w:
        assert w.put(NS, toks, kv) == 2
        assert w._shm.in_place, "a node-wide writer reads the node's DRAM in place"
    with kvmesh.Client(tenant_node.addr, token="ops-r", transport="auto") as r:
        n, got = r.get(NS, toks)
        assert n == 32 and torch.equal(got, kv)
        assert r.counters["shm_get"] == 2
        assert not r._shm.in_place, "a node-wide reader was given the arena, which it could reopen writable"


@pytest.mark.parametrize("token", ["ops-r", "acme-r"])
def test_reopen_attack(tenant_node, token):
    """What a hostile reader does with the descriptors the node sends it: reopen each through
    /proc/self/fd read-write (a memfd's inode is mode 0777) and write through it. None is the
    arena, and none can be written (the region is sealed against writes)."""
    import mmap
    import os
    import socket
    from kvmesh import _shm
    sock = tenant_node.shm_socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(sock)
        tok = token.encode()
        s.sendall(_shm.frame_header(_shm.HELLO, 0, len(tok), tok, flags=_shm.FLAG_ARENA) + tok)
        msg, fds, _flags, _addr = socket.recv_fds(s, _shm.HEADER_LEN + 32, 4)
    try:
        assert len(fds) == 1, f"{token} was sent {len(fds)} descriptors: the arena is a writer's privilege"
        for fd in fds:
            try:
                rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
            except OSError:
                continue
            try:
                size = os.fstat(rw).st_size
                with pytest.raises(OSError):
                    os.pwrite(rw, os.pread(rw, 1, size - 1), size - 1)
                with pytest.raises(OSError):
                    mmap.mmap(rw, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(rw)
    finally:
        for fd in fds:
            os.close(fd)


def test_tenant_keys_are_salted(tenant_node):
    toks = list(range(8000, 8032))
    with kvmesh.Client(tenant_node.addr, token="acme-rw") as c:
        c.put(NS, toks, kv_of(32, 2))
        m = c.meta(NS)
        r = c.lookup(NS, toks)
    salted = [k.hex() for k in kvmesh._namespace.key_bytes(NS.salted(m.salt), toks, m.key_version)]
    plain = [k.hex() for k in kvmesh._namespace.key_bytes(NS, toks, m.key_version)]
    assert [b.key for b in r.blocks] == salted != plain


def test_refused_tokens(tenant_node):
    toks = list(range(9000, 9032))
    for token in (None, "wrong"):
        with kvmesh.Client(tenant_node.addr, token=token) as c:
            with pytest.raises(kvmesh.PermissionDenied):
                c.lookup(NS, toks)
    with kvmesh.Client(tenant_node.addr, token="acme-r") as c:
        with pytest.raises(kvmesh.PermissionDenied):
            c.put(NS, toks, kv_of(32, 3))


def test_shared_token(start_node, tmp_path, gossip_key):
    f = tmp_path / "token"
    f.write_text("s3cret-shared-token\n")
    n = start_node("--auth-token-file", str(f), "--gossip-key-file", gossip_key)
    toks = list(range(100, 132))
    with kvmesh.Client(n.addr, token="s3cret-shared-token") as c:
        assert c.put(NS, toks, kv_of(32, 4)) == 2 and c.get(NS, toks)[0] == 32
        assert c.counters["shm_put"] == 2 and c.counters["shm_get"] == 2
    with kvmesh.Client(n.addr, token="nope") as c, pytest.raises(kvmesh.PermissionDenied):
        c.get(NS, toks)


def test_tls_and_token(start_node, tmp_path, gossip_key):
    if not shutil.which("openssl"):
        pytest.skip("needs openssl to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=kvmesh-test",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    tok = tmp_path / "token"
    tok.write_text("tls-token\n")
    n = start_node("--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(cert), "--auth-token-file", str(tok),
                   "--gossip-key-file", gossip_key)
    toks = list(range(200, 248))
    kv = kv_of(48, 5)
    for path, transport in PATHS.items():
        with kvmesh.Client(n.addr, token="tls-token", tls={"ca": str(cert)}, transport=transport) as c:
            c.put(NS, toks, kv)
            got = c.get(NS, toks)
            assert got[0] == 48 and torch.equal(got[1], kv)
            assert c.counters[path + "_get"] == 3, (path, c.counters)
    with kvmesh.Client(n.addr, token="tls-token", transport="grpc", timeout=3) as c, pytest.raises(kvmesh.KVMeshError):
        c.lookup(NS, toks)  # plain text to a TLS node
