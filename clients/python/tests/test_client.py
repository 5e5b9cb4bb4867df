"""kvmesh.Client and kvmesh.aio.Client against real `kvmesh serve` processes."""
import asyncio
import itertools
import json
import subprocess

import numpy as np
import pytest

import kvmesh

torch = pytest.importorskip("torch")

_seq = itertools.count(1)


def prompt(n, salt=None):
    """A fresh prompt of n tokens (no other test has written its blocks)."""
    base = (salt if salt is not None else next(_seq)) * 1_000_003
    return [(base + i * 7919) % (1 << 32) for i in range(n)]


def ns_of(dtype, block_tokens=16, model="py/test"):
    return kvmesh.Namespace(model, dtype, block_tokens, layers=3, kv_heads=2, head_dim=8)


def rand_torch(ns, n, dtype):
    g = torch.Generator().manual_seed(n)
    return torch.randn(ns.block_shape(n), generator=g).to(dtype)


TRANSPORT = {"shm": "auto", "tcp": "tcp", "grpc": "grpc"}  # the path a get takes -> Client(transport=)


@pytest.fixture(params=["shm", "tcp", "grpc"])
def path(request):
    return request.param


@pytest.fixture
def client(node, path):
    with kvmesh.Client(node.addr, transport=TRANSPORT[path]) as c:
        yield c
    moved = {k: v for k, v in c.counters.items() if k.endswith("_get") and v}
    assert not moved or set(moved) == {path + "_get"}, f"{path} path not taken: {c.counters}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_round_trip_bit_exact(client, dtype):
    tdt = getattr(torch, dtype)
    ns = ns_of(dtype)
    toks = prompt(70)
    kv = rand_torch(ns, 70, tdt)
    assert client.put(ns, toks, kv) == 4
    n, got = client.get(ns, toks)
    assert n == 64 and got.dtype == tdt and got.shape == ns.block_shape(64)
    assert torch.equal(got.view(torch.uint8 if dtype != "float32" else torch.int32),
                       kv[:, :, :64].contiguous().view(torch.uint8 if dtype != "float32" else torch.int32))
    out = torch.zeros(ns.block_shape(70), dtype=tdt)
    n2, same = client.get(ns, toks, out)
    assert n2 == 64 and same is out and torch.equal(out[:, :, :64], kv[:, :, :64])
    assert torch.count_nonzero(out[:, :, 64:]) == 0  # past the cached prefix: untouched


@pytest.mark.parametrize("dtype,np_dtype", [("float16", np.float16), ("float32", np.float32), ("bfloat16", np.uint16)])
def test_numpy_round_trip_bit_exact(client, dtype, np_dtype):
    ns = ns_of(dtype)
    toks = prompt(48)
    rng = np.random.default_rng(7)
    kv = rng.integers(0, 1 << 16, size=ns.block_shape(48), dtype=np.uint16).view(np.uint16)
    kv = kv.view(np.float16) if np_dtype is np.float16 else kv
    if np_dtype is np.float32:
        kv = rng.standard_normal(ns.block_shape(48)).astype(np.float32)
    assert client.put(ns, toks, kv) == 3
    n, got = client.get(ns, toks, array="numpy")
    assert n == 48 and isinstance(got, np.ndarray) and got.dtype == kv.dtype
    assert got.tobytes() == kv.tobytes()
    out = np.empty_like(kv)
    assert client.get(ns, toks, out)[0] == 48 and out.tobytes() == kv.tobytes()


def test_numpy_and_torch_agree(client):
    """What torch wrote, numpy reads bit for bit (bfloat16 as raw uint16)."""
    ns = ns_of("bfloat16")
    toks = prompt(32)
    kv = rand_torch(ns, 32, torch.bfloat16)
    client.put(ns, toks, kv)
    n, a = client.get(ns, toks, array="numpy")
    assert n == 32 and a.dtype == np.uint16 and a.tobytes() == kv.view(torch.int16).numpy().tobytes()


def test_partial_prefix(client):
    ns = ns_of("float16")
    toks = prompt(80)
    kv = rand_torch(ns, 80, torch.float16)
    assert client.put(ns, toks[:32], kv[:, :, :32].contiguous()) == 2
    assert client.lookup(ns, toks).cached_tokens == 32
    n, got = client.get(ns, toks)
    assert n == 32 and torch.equal(got, kv[:, :, :32])
    # A prompt that diverges inside block 1 shares block 0 only.
    other = toks[:20] + prompt(60)
    n, got = client.get(ns, other)
    assert n == 16 and torch.equal(got, kv[:, :, :16])
    # Nothing cached: zero tokens, an empty tensor.
    n, got = client.get(ns, prompt(40))
    assert n == 0 and got.shape[2] == 0
    # Shorter than a block: nothing to store or read.
    assert client.put(ns, toks[:5], kv[:, :, :5].contiguous()) == 0
    assert client.get(ns, toks[:5])[0] == 0


def test_lookup_blocks(client, node):
    ns = ns_of("float32")
    toks = prompt(50)
    client.put(ns, toks, rand_torch(ns, 50, torch.float32))
    r = client.lookup(ns, toks)
    assert r.cached_tokens == 48 and r.cached_blocks == 3 and r.prompt_tokens == 50
    assert [b.node for b in r.blocks] == [node.node_id] * 3
    assert {b.tier for b in r.blocks} <= {"dram", "nvme"}


def test_keys_match_inspect_lookup(client, node, kvmesh_bin):
    """The keys the node prints for a prompt are the keys Python computes."""
    ns = ns_of("float16")
    toks = prompt(40)
    client.put(ns, toks, rand_torch(ns, 40, torch.float16))
    out = subprocess.run([kvmesh_bin, "inspect", "--addr", node.addr, "lookup", "--tokens", ",".join(map(str, toks)),
                          "--model", ns.model, "--dtype", ns.dtype, "--block-tokens", "16", "--layers", "3",
                          "--kv-heads", "2", "--head-dim", "8", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    got = json.loads(out)
    assert got["cached_tokens"] == 32
    assert [b["key"] for b in got["blocks"]] == kvmesh.keys(ns, toks)[:2]
    assert got["namespace_digest"] == f"{ns.digest():016x}"


def test_node_key_format(node):
    """A node built from this tree keys blocks as kvmesh.keys does."""
    with kvmesh.Client(node.addr) as c:
        assert c.meta(ns_of("float16")).key_version == kvmesh.KEY_VERSION


def test_shm_and_grpc_same_bytes(node):
    if node.shm_socket in ("", "off"):
        pytest.skip("node serves no shared memory")
    ns = ns_of("bfloat16")
    toks = prompt(64)
    kv = rand_torch(ns, 64, torch.bfloat16)
    with kvmesh.Client(node.addr) as a, kvmesh.Client(node.addr, transport="grpc") as b, \
            kvmesh.Client(node.addr, transport="tcp") as t:
        assert a.put(ns, toks, kv) == 4 and a.counters["shm_put"] == 4
        n1, x = a.get(ns, toks)
        n2, y = b.get(ns, toks)
        assert a.counters["shm_get"] == 4 and a.counters["grpc_get"] == 0
        assert a._shm.in_place, "an open-mode client reads the node's DRAM arena in place"
        assert b.counters["grpc_get"] == 4 and b.counters["shm_get"] == 0
        assert n1 == n2 == 64 and x.view(torch.int16).numpy().tobytes() == y.view(torch.int16).numpy().tobytes()
        n3, w = t.get(ns, toks)
        assert t.counters["tcp_get"] == 4 and n3 == 64 and torch.equal(w.view(torch.int16), x.view(torch.int16))
        # Written over gRPC, read through shared memory; written over TCP, read over gRPC.
        toks2 = prompt(32)
        assert b.put(ns, toks2, kv[:, :, :32].contiguous()) == 2 and b.counters["grpc_put"] == 2
        n, z = a.get(ns, toks2)
        assert n == 32 and torch.equal(z, kv[:, :, :32])
        toks3 = prompt(32)
        assert t.put(ns, toks3, kv[:, :, 32:].contiguous()) == 2 and t.counters["tcp_put"] == 2
        n, z = b.get(ns, toks3)
        assert n == 32 and torch.equal(z, kv[:, :, 32:])


def test_batch(client):
    ns = ns_of("float16")
    ps = [prompt(n) for n in (16, 40, 64)]
    kvs = [rand_torch(ns, len(p), torch.float16) for p in ps]
    assert client.batch_put(ns, list(zip(ps, kvs))) == [1, 2, 4]
    got = client.batch_get(ns, ps + [prompt(32)])
    assert [n for n, _ in got] == [16, 32, 64, 0]
    for (n, kv), want in zip(got, kvs):
        assert torch.equal(kv, want[:, :, :n])
    outs = [torch.zeros_like(k) for k in kvs]
    got = client.batch_get(ns, ps, outs)
    assert all(g[1] is o for g, o in zip(got, outs))
    assert torch.equal(outs[2], kvs[2])


def test_out_smaller_than_prompt(client):
    """An out with room for fewer tokens than the prompt gets the blocks that fit."""
    ns = ns_of("float16")
    toks = prompt(64)
    kv = rand_torch(ns, 64, torch.float16)
    client.put(ns, toks, kv)
    out = torch.empty(ns.block_shape(40), dtype=torch.float16)
    n, _ = client.get(ns, toks, out)
    assert n == 32 and torch.equal(out[:, :, :32], kv[:, :, :32])


class NotContiguous:
    pass


@pytest.mark.parametrize("case", ["layers", "kv_dim", "heads", "head_dim", "tokens", "ndim", "dtype", "np_dtype",
                                  "noncontig", "np_noncontig", "type", "list"])
def test_bad_put_inputs(node, case):
    ns = ns_of("float16")
    toks = prompt(32)
    good = torch.zeros(ns.block_shape(32), dtype=torch.float16)
    kv = {
        "layers": torch.zeros((2, 2, 32, 2, 8), dtype=torch.float16),
        "kv_dim": torch.zeros((3, 1, 32, 2, 8), dtype=torch.float16),
        "heads": torch.zeros((3, 2, 32, 4, 8), dtype=torch.float16),
        "head_dim": torch.zeros((3, 2, 32, 2, 16), dtype=torch.float16),
        "tokens": torch.zeros((3, 2, 31, 2, 8), dtype=torch.float16),
        "ndim": torch.zeros((3, 2, 32, 16), dtype=torch.float16),
        "dtype": good.float(),
        "np_dtype": np.zeros(ns.block_shape(32), np.float32),
        "noncontig": torch.zeros((3, 2, 32, 8, 2), dtype=torch.float16).transpose(3, 4),
        "np_noncontig": np.zeros((3, 2, 32, 8, 2), np.float16).transpose(0, 1, 2, 4, 3),
        "type": NotContiguous(),
        "list": good.tolist(),
    }[case]
    calls = []
    with kvmesh.Client(node.addr) as c:
        c._call = lambda *a, **k: calls.append(a) or pytest.fail("a call went out")
        with pytest.raises(ValueError, match="kv|expected|want"):
            c.put(ns, toks, kv)
        with pytest.raises(ValueError):
            c.batch_put(ns, [(toks, good), (toks, kv)])
    assert not calls


@pytest.mark.parametrize("case", ["shape", "dtype", "noncontig", "outs_len", "array", "tokens"])
def test_bad_get_inputs(node, case):
    ns = ns_of("float16")
    toks = prompt(32)
    with kvmesh.Client(node.addr) as c:
        c._call = lambda *a, **k: pytest.fail("a call went out")
        with pytest.raises(ValueError):
            if case == "shape":
                c.get(ns, toks, torch.zeros((3, 2, 32, 2, 9), dtype=torch.float16))
            elif case == "dtype":
                c.get(ns, toks, torch.zeros(ns.block_shape(32), dtype=torch.bfloat16))
            elif case == "noncontig":
                c.get(ns, toks, torch.zeros((3, 2, 2, 32, 8), dtype=torch.float16).transpose(2, 3))
            elif case == "outs_len":
                c.batch_get(ns, [toks, toks], [torch.zeros(ns.block_shape(32), dtype=torch.float16)])
            elif case == "array":
                c.get(ns, toks, array="jax")
            elif case == "tokens":
                c.get(ns, [1, -2, 3])
    with kvmesh.Client(node.addr) as c, pytest.raises(TypeError):
        c.get("not a namespace", toks)


def test_typed_errors(node):
    with kvmesh.Client("127.0.0.1:1", timeout=2) as c:
        with pytest.raises(kvmesh.Unavailable):
            c.lookup(ns_of("float16"), prompt(16))
    # A server that accepts and never answers: the call runs into its deadline. (A tiny
    # timeout against the real node can finish in time on an idle loopback.)
    import socket
    import threading
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        held = []

        def hold():
            try:
                while True:
                    held.append(mute.accept()[0])
            except OSError:
                pass  # closed: the test is over
        t = threading.Thread(target=hold, daemon=True)
        t.start()
        with kvmesh.Client("127.0.0.1:%d" % mute.getsockname()[1], timeout=0.5) as c:
            with pytest.raises(kvmesh.DeadlineExceeded):
                c.lookup(ns_of("float16"), prompt(16))
        mute.shutdown(socket.SHUT_RDWR)
    t.join(5)
    for conn in held:
        conn.close()
    # The node's own InvalidArgument (a block over its size limit) comes back typed, with its message.
    big = kvmesh.Namespace("py/big", "float32", 4096, layers=64, kv_heads=8, head_dim=128)
    with kvmesh.Client(node.addr, transport="grpc") as c:
        with pytest.raises(kvmesh.InvalidArgument) as e:
            c.get(big, prompt(4096))
        assert "block" in str(e.value) or "namespace" in str(e.value)


def test_async_200_concurrent(node):
    ns = ns_of("float16")
    ps = [prompt(32) for _ in range(200)]
    kvs = [rand_torch(ns, 32, torch.float16) for _ in ps]

    async def run():
        async with kvmesh.aio.Client(node.addr) as c:
            stored = await asyncio.gather(*(c.put(ns, p, kv) for p, kv in zip(ps, kvs)))
            got = await asyncio.gather(*(c.get(ns, p) for p in ps))
            looks = await asyncio.gather(*(c.lookup(ns, p) for p in ps))
            return stored, got, looks
    stored, got, looks = asyncio.run(run())
    assert stored == [2] * 200
    assert all(n == 32 and torch.equal(kv, want) for (n, kv), want in zip(got, kvs))
    assert all(lk.cached_tokens == 32 for lk in looks)


def test_async_network_path(node):
    ns = ns_of("float32")
    toks = prompt(48)
    kv = rand_torch(ns, 48, torch.float32)

    async def run():
        async with kvmesh.aio.Client(node.addr, transport="grpc") as c:
            assert await c.put(ns, toks, kv) == 3
            out = torch.empty_like(kv)
            n, _ = await c.get(ns, toks, out)
            r = await c.batch_get(ns, [toks, prompt(16)])
            return n, out, r, c.counters
    n, out, r, counters = asyncio.run(run())
    assert n == 48 and torch.equal(out, kv) and [x[0] for x in r] == [48, 0]
    assert counters["shm_get"] == counters["tcp_get"] == 0 and counters["grpc_get"] > 0


def test_async_tcp_path(node):
    ns = ns_of("float16")
    toks = prompt(48)
    kv = rand_torch(ns, 48, torch.float16)

    async def run():
        async with kvmesh.aio.Client(node.addr, transport="tcp") as c:
            await c.put(ns, toks, kv)
            return await asyncio.gather(*(c.get(ns, toks) for _ in range(20))), c.counters
    got, counters = asyncio.run(run())
    assert all(n == 48 and torch.equal(x, kv) for n, x in got) and counters["tcp_get"] == 60


def test_blocks_larger_than_a_message(node, path):
    """A 4 MiB block comes over gRPC in several messages (the node's ChunkBytes); through
    shared memory in one piece. Both land bit-exact."""
    ns = kvmesh.Namespace("py/big-blocks", "float16", 16, layers=64, kv_heads=8, head_dim=128)
    assert ns.block_bytes == 4 << 20
    toks = prompt(40)
    kv = rand_torch(ns, 40, torch.float16)
    with kvmesh.Client(node.addr, transport=TRANSPORT[path]) as c:
        assert c.put(ns, toks, kv) == 2
        out = torch.empty_like(kv)
        n, _ = c.get(ns, toks, out)
        assert n == 32 and torch.equal(out[:, :, :32], kv[:, :, :32])
        assert c.counters[path + "_get"] == 2


def test_parallel_streams_prefix(node):
    """A large read over gRPC runs as several streams; the answer is still the cached
    prefix, and only it lands."""
    ns = kvmesh.Namespace("py/big-blocks", "float16", 16, layers=64, kv_heads=8, head_dim=128)
    toks = prompt(16 * 8)
    kv = rand_torch(ns, 16 * 6, torch.float16)
    with kvmesh.Client(node.addr, transport="grpc") as c:
        assert c.put(ns, toks[:16 * 6], kv) == 6
        out = torch.zeros(ns.block_shape(16 * 8), dtype=torch.float16)
        from kvmesh import _core
        plan = _core.GetPlan(ns, [toks], [out], None, c.meta(ns))
        assert len(plan.streams(plan.missing())) == 4
        n, _ = c.get(ns, toks, out)
        assert n == 96 and torch.equal(out[:, :, :96], kv)
        assert torch.count_nonzero(out[:, :, 96:]) == 0


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2", "int8"])
def test_one_byte_dtypes(client, dtype):
    """fp8 travels as raw bytes (torch uint8, or its float8 types; numpy uint8); int8 as int8."""
    ns = ns_of(dtype)
    toks = prompt(32)
    if dtype == "int8":
        kv = torch.randint(-128, 128, ns.block_shape(32), dtype=torch.int8)
    else:
        kv = torch.randint(0, 256, ns.block_shape(32), dtype=torch.uint8)
    assert client.put(ns, toks, kv) == 2
    out = torch.empty_like(kv)
    assert client.get(ns, toks, out)[0] == 32 and torch.equal(out, kv)
    n, a = client.get(ns, toks, array="numpy")
    assert n == 32 and a.tobytes() == kv.numpy().tobytes()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_tensors(client):
    """CUDA tensors go through pinned host memory both ways."""
    ns = ns_of("bfloat16")
    toks = prompt(48)
    kv = rand_torch(ns, 48, torch.bfloat16).cuda()
    assert client.put(ns, toks, kv) == 3
    out = torch.zeros_like(kv)
    n, got = client.get(ns, toks, out)
    assert n == 48 and got is out and torch.equal(out, kv)


def test_auto_without_shared_memory(start_node):
    """A node that serves no shared memory: auto moves blocks over its TCP data plane."""
    n = start_node("--shm-socket", "off")
    ns = ns_of("float16")
    toks = prompt(48)
    kv = rand_torch(ns, 48, torch.float16)
    with kvmesh.Client(n.addr) as c:
        assert c.put(ns, toks, kv) == 3 and c.counters["tcp_put"] == 3
        got = c.get(ns, toks)
        assert got[0] == 48 and torch.equal(got[1], kv)
        assert c.counters["tcp_get"] == 3 and c.counters["shm_get"] == 0


def test_bad_transport(node):
    with pytest.raises(ValueError, match="transport"):
        kvmesh.Client(node.addr, transport="rdma")
    with pytest.raises(ValueError, match="transport"):
        kvmesh.aio.Client(node.addr, transport="shm")
