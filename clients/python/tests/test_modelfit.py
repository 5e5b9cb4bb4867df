"""Latent (MLA) namespaces, scales, extra keys and the vllm key scheme, against real nodes,
through every path (the `client` fixture: shared memory, TCP, gRPC)."""
import itertools
import json
import pathlib

import numpy as np
import pytest

import kvmesh
from kvmesh import _namespace

REPO = pathlib.Path(__file__).resolve().parents[3]
_seq = itertools.count(1)


def prompt(n):
    """A fresh prompt of n tokens (no other test here has written its blocks)."""
    base = (next(_seq) + 7777) * 1_000_003
    return [(base + i * 7919) % (1 << 32) for i in range(n)]


TRANSPORT = {"shm": "auto", "tcp": "tcp", "grpc": "grpc"}


@pytest.fixture(params=["shm", "tcp", "grpc"])
def client(node, request):
    with kvmesh.Client(node.addr, transport=TRANSPORT[request.param]) as c:
        yield c
    moved = {k: v for k, v in c.counters.items() if v}
    assert moved and all(k.startswith(request.param) for k in moved), f"{request.param} path not taken: {c.counters}"


def kimi(**kw):
    """A small Kimi-K2.5-shaped latent namespace: one 576-wide latent per token and layer."""
    return kvmesh.Namespace("moonshotai/Kimi-K2.5-py", kw.pop("dtype", "bfloat16"), 16, layers=3,
                            kv_layout="latent", latent_dim=576, **kw)


def raw(ns, n, seed):
    """Random bits in ns's element size as numpy (uint16 carries bfloat16)."""
    dt = {1: np.uint8, 2: np.uint16, 4: np.float32}[ns.dtype_size]
    rng = np.random.default_rng(seed)
    if dt is np.float32:
        return rng.standard_normal(ns.block_shape(n)).astype(np.float32)
    if ns.dtype == "int8":
        return rng.integers(-128, 128, ns.block_shape(n), dtype=np.int8)
    a = rng.integers(0, np.iinfo(dt).max, ns.block_shape(n), dtype=dt)
    return a.view(np.float16) if ns.dtype == "float16" else a


def test_latent_round_trip(client):
    ns = kimi()
    toks = prompt(48)
    kv = raw(ns, 48, 1)
    assert kv.shape == (3, 48, 576)
    assert client.put(ns, toks, kv) == 3
    n, got = client.get(ns, toks, array="numpy")
    assert n == 48 and got.shape == (3, 48, 576) and np.array_equal(got, kv)
    out = np.zeros((3, 32, 576), np.uint16)
    n, got = client.get(ns, toks, out)
    assert n == 32 and got is out and np.array_equal(out, kv[:, :32])
    with pytest.raises(ValueError, match="latent_dim"):
        client.put(ns, toks, np.zeros((3, 2, 48, 1, 576), np.uint16))


@pytest.mark.parametrize("dtype,scales", [("fp8_e4m3", "block"), ("int8", "head")])
def test_scales_round_trip(client, dtype, scales):
    ns = kimi(dtype=dtype, scales=scales) if scales == "block" else \
        kvmesh.Namespace("py/int8", dtype, 16, layers=2, kv_heads=2, head_dim=8, scales=scales)
    toks = prompt(32)
    kv = raw(ns, 32, 2)
    sc = np.random.default_rng(3).random((2,) + ns.scales_shape(), dtype=np.float32)
    assert client.put(ns, toks, kv, scales=sc) == 2
    n, got, got_sc = client.get(ns, toks, array="numpy")
    assert n == 32 and np.array_equal(got.view(np.uint8), kv.view(np.uint8)) and np.array_equal(got_sc, sc)
    with pytest.raises(ValueError, match="scales"):
        client.put(ns, toks, kv)  # scales missing
    with pytest.raises(ValueError, match="scales"):
        client.put(ns, toks, kv, scales=sc[:1])


def test_extra_keys_separate_blocks(client):
    ns = kvmesh.Namespace("py/mm", "float32", 16, layers=2, kv_heads=1, head_dim=8, extra_key_bytes=32)
    toks = prompt(32)  # image placeholder tokens: the same for every image
    a, b = raw(ns, 32, 4), raw(ns, 32, 5)
    img_a, img_b = [None, [b"image-a", b"\x03"]], [None, [b"image-b", b"\x03"]]
    assert client.put(ns, toks, a, extra_keys=img_a) == 2
    assert client.put(ns, toks, b, extra_keys=img_b) == 2
    n, got = client.get(ns, toks, array="numpy", extra_keys=img_a)
    assert n == 32 and np.array_equal(got, a)
    n, got = client.get(ns, toks, array="numpy", extra_keys=img_b)
    assert n == 32 and np.array_equal(got[:, :, 16:], b[:, :, 16:])
    n, _ = client.get(ns, toks, array="numpy")  # no image: block 1 is not cached
    assert n == 16
    assert client.lookup(ns, toks, extra_keys=img_a).cached_tokens == 32
    assert client.lookup(ns, toks).cached_tokens == 16


def test_vllm_scheme_keys_are_vllm_hashes(client):
    """Blocks put under the vllm scheme are named by vLLM's own block hashes (the vectors an
    independent script computed from vLLM's definition)."""
    vs = json.loads((REPO / "prefixhash" / "testdata" / "vllm.json").read_text())["vectors"]
    v = next(v for v in vs if v["name"] == "mm-lora-salt-b16")
    ns = kvmesh.Namespace("py/vllm", "float16", v["block_tokens"], layers=1, kv_heads=1, head_dim=8,
                          tenant_salt=v["cache_salt"], lora=v["lora"], key_scheme="vllm", hash_seed=v["hash_seed"],
                          extra_key_bytes=128)
    b = v["block_tokens"]
    nb = len(v["tokens"]) // b
    extra = [[_namespace.vllm_mm_key(i, o - k * b) for i, o, n in v["mm"] if k * b + b > o and k * b < o + n]
             for k in range(nb)]
    kv = raw(ns, nb * b, 6)
    assert client.put(ns, v["tokens"], kv, extra_keys=extra) == nb
    res = client.lookup(ns, v["tokens"], extra_keys=extra)
    assert res.cached_blocks == nb
    assert kvmesh.keys(ns, v["tokens"], extra) == [h[:32] for h in v["hashes"]]
    n, got = client.get(ns, v["tokens"], array="numpy", extra_keys=extra)
    assert n == nb * b and np.array_equal(got.view(np.uint8), kv.view(np.uint8))  # random bits: NaNs too
