"""The node's error details (proto/kvmesh/v1/errors.proto) as typed exceptions."""
import asyncio

import pytest

import kvmesh
from kvmesh import errors

torch = pytest.importorskip("torch")

NS = kvmesh.Namespace("py/errors", "float16", 16, layers=2, kv_heads=2, head_dim=8)


def kv_of(n, seed):
    return torch.randn(NS.block_shape(n), generator=torch.Generator().manual_seed(seed)).half()


def _len(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _field(num, payload):
    return _len(num << 3 | 2) + _len(len(payload)) + payload


def _any(type_name, value):
    return _field(3, _field(1, b"type.googleapis.com/" + type_name) + _field(2, value))


def test_parse_details():
    info = _field(1, b"QUOTA_EXCEEDED") + _field(2, b"kvmesh.dev") + _field(3, _field(1, b"namespace_digest") + _field(2, b"ab"))
    quota = _field(1, _field(1, b"namespace:ab") + _field(2, b"over"))
    bad = _field(1, _field(1, b"block.tokens") + _field(2, b"3 tokens"))
    raw = _field(1, b"\x08") + _any(b"google.rpc.ErrorInfo", info) + _any(b"google.rpc.QuotaFailure", quota) + \
        _any(b"google.rpc.BadRequest", bad) + _any(b"other.Message", b"\x08\x01")
    d = errors.parse_details(raw)
    assert d["reason"] == "QUOTA_EXCEEDED" and d["metadata"] == {"namespace_digest": "ab"}
    assert d["quota_violations"] == [("namespace:ab", "over")]
    assert d["field_violations"] == [("block.tokens", "3 tokens")]
    # Another domain's reason is not kvmesh's; bytes that do not parse give nothing.
    other = _any(b"google.rpc.ErrorInfo", _field(1, b"QUOTA_EXCEEDED") + _field(2, b"example.com"))
    assert errors.parse_details(other)["reason"] is None
    for junk in (b"\xff", b"\x1a\x05ab", raw[:-1], b"\x0f"):
        assert errors.parse_details(junk)["reason"] is None
    assert errors.known_reason("QUOTA_EXCEEDED") and not errors.known_reason("UNSPECIFIED")
    assert not errors.known_reason("NO_SUCH_REASON")


def test_quota_exceeded(start_node):
    n = start_node("--quota-dram", "1KiB", "--quota-nvme", "1KiB")
    toks = list(range(500, 532))
    for transport in ("auto", "grpc"):
        with kvmesh.Client(n.addr, transport=transport) as c:
            with pytest.raises(kvmesh.QuotaExceeded) as e:
                c.put(NS, toks, kv_of(32, 1))
            assert isinstance(e.value, kvmesh.ResourceExhausted) and e.value.code == "RESOURCE_EXHAUSTED"
            assert e.value.reason == "QUOTA_EXCEEDED" and errors.known_reason(e.value.reason)
            digest = e.value.metadata["namespace_digest"]
            assert e.value.quota_violations[0][0] == "namespace:" + digest
            assert c.get(NS, toks)[0] == 0  # refused, nothing stored; the node still serves

    async def aio_put():
        async with kvmesh.aio.Client(n.addr, transport="grpc") as c:
            await c.put(NS, toks, kv_of(32, 1))
    with pytest.raises(kvmesh.QuotaExceeded):
        asyncio.run(aio_put())


def test_invalid_argument_details(node):
    big = kvmesh.Namespace("py/big", "float32", 4096, layers=64, kv_heads=8, head_dim=128)
    with kvmesh.Client(node.addr, transport="grpc") as c:
        with pytest.raises(kvmesh.BlockTooLarge) as e:
            c.get(big, list(range(4096)))
    assert isinstance(e.value, kvmesh.InvalidArgument) and isinstance(e.value, ValueError)
    assert e.value.reason == "BLOCK_TOO_LARGE" and int(e.value.metadata["limit"]) > 0
    assert [f for f, _ in e.value.field_violations] == ["namespace"]


TOKENS = """
secret: "0123456789abcdef0123456789abcdef-pytest"
tokens:
  - {token: acme-r, tenant: acme, scopes: [read]}
  - {token: node-to-node, scopes: [cluster, read, write]}
"""


def test_permission_details(start_node, tmp_path, gossip_key):
    f = tmp_path / "tokens.yaml"
    f.write_text(TOKENS)
    n = start_node("--tokens-file", str(f), "--gossip-key-file", gossip_key)
    toks = list(range(600, 632))
    with kvmesh.Client(n.addr, token="acme-r", transport="grpc") as c:
        with pytest.raises(kvmesh.ScopeMissing) as e:
            c.put(NS, toks, kv_of(32, 2))
    assert isinstance(e.value, kvmesh.PermissionDenied)
    assert e.value.reason == "SCOPE_MISSING" and e.value.metadata["scope"] == "write"
    with kvmesh.Client(n.addr, transport="grpc") as c:
        with pytest.raises(kvmesh.Unauthenticated) as e:
            c.lookup(NS, toks)
    assert isinstance(e.value, kvmesh.PermissionDenied) and e.value.reason is None
