"""Multi-GPU instances against a real node: tensor- and pipeline-parallel ranks put their parts of
the same blocks and read any slice back, whatever parallel layout wrote them (issue 23)."""
import asyncio
import itertools

import numpy as np
import pytest

import kvmesh
from kvmesh import block
from kvmesh.v1 import admin_pb2

_seq = itertools.count(1)


def prompt(n):
    """A fresh prompt of n tokens (no other test has written its blocks)."""
    base = (next(_seq) + 55_555) * 1_000_003
    return [(base + i * 7919) % (1 << 32) for i in range(n)]


def split_ns(model="py/mgi", heads=4, layers=5):
    return kvmesh.Namespace(model, "float16", 16, layers=layers, kv_heads=heads, head_dim=8)


def full_kv(ns, n, seed=0):
    return np.random.default_rng(seed).standard_normal(ns.block_shape(n)).astype(np.float16)


def rank_slice(ns, full, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
    p = kvmesh.rank_part(ns, tp_rank, tp_size, pp_rank, pp_size)
    if ns.kv_layout == "latent":
        return np.ascontiguousarray(full[p.l0:p.l1])
    return np.ascontiguousarray(full[p.l0:p.l1, :, :, p.h0:p.h1])


def cut(ns, kv, n):
    return kv[:, :n] if ns.kv_layout == "latent" else kv[:, :, :n]


DATA_PLANES = {"shm": "auto", "tcp": "tcp"}


@pytest.fixture(params=sorted(DATA_PLANES))
def plane(request):
    return request.param


def test_tp2_written_read_at_every_layout(node, plane):
    """Two TP ranks write; until both have, nothing is a hit; then TP 1, 2, 4 and PP 2 ranks read
    their slices (through the data plane and through gRPC) equal to the original's."""
    ns = split_ns()
    toks = prompt(50)  # 3 full blocks and a tail
    full = full_kv(ns, 50, 1)
    with kvmesh.Client(node.addr, transport=DATA_PLANES[plane]) as c, \
            kvmesh.Client(node.addr, transport="grpc") as g:
        assert c.put(ns, toks, rank_slice(ns, full, 0, 2), tp_rank=0, tp_size=2) == 3
        assert c.lookup(ns, toks).cached_tokens == 0
        n, kv = c.get(ns, toks, array="numpy")
        assert n == 0 and kv.shape == ns.block_shape(0)
        assert c.put(ns, toks, rank_slice(ns, full, 1, 2), tp_rank=1, tp_size=2) == 3
        assert c.counters[plane + "_put"] == 6
        assert c.lookup(ns, toks).cached_tokens == 48
        for rank in [(0, 1, 0, 1), (1, 2, 0, 1), (0, 4, 0, 1), (3, 4, 0, 1), (0, 1, 1, 2), (2, 4, 0, 2),
                     (1, 2, 1, 2), (5, 8, 0, 1)]:
            kw = dict(zip(("tp_rank", "tp_size", "pp_rank", "pp_size"), rank))
            want = cut(ns, rank_slice(ns, full, *rank), 48)
            for cl in (c, g):
                n, kv = cl.get(ns, toks, array="numpy", **kw)
                assert n == 48 and kv.shape == want.shape and np.array_equal(kv, want), (rank, cl.counters)
                out = np.zeros(rank_slice(ns, full, *rank).shape, np.float16)
                n, same = cl.get(ns, toks, out, **kw)
                assert n == 48 and same is out and np.array_equal(cut(ns, out, 48), want)
        assert c.counters[plane + "_get"] > 0 and c.counters["grpc_get"] == 0


def test_pp_stages_then_whole(node, plane):
    """Uneven pipeline stages (5 layers over 3: vLLM gives 2, 2, 1, the extra layers to the stages
    before the last) write; a single-GPU reader reads the whole block."""
    ns = split_ns("py/mgi-pp")
    toks = prompt(32)
    full = full_kv(ns, 32, 2)
    assert [tuple(kvmesh.rank_part(ns, 0, 1, r, 3))[:2] for r in range(3)] == [(0, 2), (2, 4), (4, 5)]
    with kvmesh.Client(node.addr, transport=DATA_PLANES[plane]) as c:
        for r in (2, 0):
            assert c.put(ns, toks, rank_slice(ns, full, 0, 1, r, 3), pp_rank=r, pp_size=3) == 2
        assert c.lookup(ns, toks).cached_tokens == 0
        n, _ = c.get(ns, toks, pp_rank=2, pp_size=3)
        assert n == 0  # the stage's own layers are there, but the block is not complete
        assert c.put(ns, toks, rank_slice(ns, full, 0, 1, 1, 3), pp_rank=1, pp_size=3) == 2
        n, kv = c.get(ns, toks, array="numpy")
        assert n == 32 and np.array_equal(kv, full)


def test_latent_tp8_stores_one_copy(node, plane):
    """Eight TP ranks of an MLA model put the same latent: the first sends it, the other seven are
    acknowledged without sending (they claim first); every rank reads the whole latent."""
    ns = kvmesh.Namespace("py/mgi-mla", "bfloat16", 16, layers=3, kv_layout="latent", latent_dim=64)
    toks = prompt(64)
    lat = np.random.default_rng(3).integers(0, 1 << 16, ns.block_shape(64), dtype=np.uint16)
    sent = 0
    for r in range(8):
        with kvmesh.Client(node.addr, transport=DATA_PLANES[plane]) as c:
            assert c.put(ns, toks, lat, tp_rank=r, tp_size=8) == 4
            sent += c.counters[plane + "_put"]
    assert sent == 4
    with kvmesh.Client(node.addr, transport=DATA_PLANES[plane]) as c:
        for r in (0, 7):
            n, got = c.get(ns, toks, array="numpy", tp_rank=r, tp_size=8)
            assert n == 64 and np.array_equal(got, lat)


def test_replicated_heads(node):
    """tp_size 8 over 2 KV heads: ranks 0-3 hold head 0, ranks 4-7 head 1; the second rank of a head
    sends nothing."""
    ns = split_ns("py/mgi-rep", heads=2, layers=2)
    toks = prompt(16)
    full = full_kv(ns, 16, 4)
    puts = []
    for r in (0, 1, 4, 5):
        with kvmesh.Client(node.addr) as c:
            assert c.put(ns, toks, rank_slice(ns, full, r, 8), tp_rank=r, tp_size=8) == 1
            puts.append(c.counters["shm_put"] + c.counters["tcp_put"])
    assert puts == [1, 0, 1, 0]
    with kvmesh.Client(node.addr) as c:
        n, kv = c.get(ns, toks, array="numpy", tp_rank=6, tp_size=8)
        assert n == 16 and np.array_equal(kv, rank_slice(ns, full, 6, 8))


def test_conflicting_part_refused(node, plane):
    """A part overlapping stored bytes with other bytes is refused (PartConflict, an
    InvalidArgument), nothing of it stored; an identical part again is a no-op; the node keeps
    serving."""
    ns = split_ns("py/mgi-conflict", heads=2, layers=2)
    toks = prompt(32)
    full = full_kv(ns, 32, 5)
    with kvmesh.Client(node.addr, transport=DATA_PLANES[plane]) as c:
        mine = rank_slice(ns, full, 0, 2)
        assert c.put(ns, toks, mine, tp_rank=0, tp_size=2) == 2
        assert c.put(ns, toks, mine, tp_rank=0, tp_size=2) == 2  # identical: no-op
        other = mine.copy()
        other[0, 0, 20, 0, 0] += 1  # block 1 differs
        with pytest.raises(kvmesh.PartConflict, match="conflict") as e:
            c.put(ns, toks, other, tp_rank=0, tp_size=2)
        assert isinstance(e.value, kvmesh.InvalidArgument)
        assert c.put(ns, toks, rank_slice(ns, full, 1, 2), tp_rank=1, tp_size=2) == 2
        n, kv = c.get(ns, toks, array="numpy")
        assert n == 32 and np.array_equal(kv, full)


def test_bad_ranks_refused_before_any_call(node):
    ns = split_ns("py/mgi-bad", heads=4, layers=5)
    toks = prompt(16)
    with kvmesh.Client(node.addr) as c:
        c._call = lambda *a, **k: pytest.fail("a call went out")
        c.meta = lambda *a, **k: pytest.fail("a call went out")
        kv = rank_slice(ns, full_kv(ns, 16), 0, 2)
        for kw, msg in [(dict(tp_size=3), r"size 3 for 4 KV heads.*valid: 1, 2, 4, or a multiple of 4"),
                        (dict(tp_rank=2, tp_size=2), "tensor-parallel rank 2 of size 2"),
                        (dict(pp_size=6), r"6 pipeline stages for 5 layers"), (dict(pp_rank=-1, pp_size=2),
                                                                                "pipeline rank -1 of size 2")]:
            with pytest.raises(kvmesh.BadPart, match=msg):
                c.put(ns, toks, kv, **kw)
            with pytest.raises(kvmesh.BadPart, match=msg):
                c.get(ns, toks, **kw)
        with pytest.raises(ValueError, match=r"want \[5, 2, 16, 1, 8\].*tp_rank 1 of 4"):
            c.put(ns, toks, kv, tp_rank=1, tp_size=4)
        with pytest.raises(ValueError, match=r"out: shape"):
            c.get(ns, toks, np.zeros((5, 2, 16, 4, 8), np.float16), tp_rank=1, tp_size=2)


def test_parts_need_a_data_plane(node):
    """gRPC's BatchPut carries whole blocks: a rank's part through gRPC alone is refused, saying so;
    a whole block through gRPC still works and its slices are read through gRPC."""
    ns = split_ns("py/mgi-grpc", heads=2, layers=2)
    toks = prompt(16)
    full = full_kv(ns, 16, 7)
    with kvmesh.Client(node.addr, transport="grpc") as g:
        with pytest.raises(kvmesh.KVMeshError, match="data plane"):
            g.put(ns, toks, rank_slice(ns, full, 0, 2), tp_rank=0, tp_size=2)
        assert g.lookup(ns, toks).cached_tokens == 0
        assert g.put(ns, toks, full) == 1
        n, kv = g.get(ns, toks, array="numpy", tp_rank=1, tp_size=2, pp_rank=1, pp_size=2)
        assert n == 16 and np.array_equal(kv, rank_slice(ns, full, 1, 2, 1, 2))


def test_scales_per_head_parts(node):
    ns = kvmesh.Namespace("py/mgi-int8", "int8", 16, layers=2, kv_heads=2, head_dim=8, scales="head")
    toks = prompt(32)
    rng = np.random.default_rng(8)
    full = rng.integers(-100, 100, ns.block_shape(32), dtype=np.int8)
    sc = rng.random((2,) + ns.scales_shape(), dtype=np.float32)
    with kvmesh.Client(node.addr) as c:
        for r in range(2):
            assert c.put(ns, toks, rank_slice(ns, full, r, 2), scales=np.ascontiguousarray(sc[:, :, r:r + 1]),
                         tp_rank=r, tp_size=2) == 2
        n, kv, got = c.get(ns, toks, array="numpy")
        assert n == 32 and np.array_equal(kv, full) and np.array_equal(got, sc)
        n, kv, got = c.get(ns, toks, array="numpy", tp_rank=1, tp_size=2, pp_rank=0, pp_size=2)
        assert n == 32 and np.array_equal(got, sc[:, 0:1, 1:2])


def test_aio_ranks(node):
    ns = split_ns("py/mgi-aio")
    toks = prompt(32)
    full = full_kv(ns, 32, 9)

    async def main():
        async with kvmesh.aio.Client(node.addr) as c:
            got = await asyncio.gather(*(c.put(ns, toks, rank_slice(ns, full, r, 4), tp_rank=r, tp_size=4)
                                         for r in range(4)))
            assert got == [2] * 4
            (n, kv), = await c.batch_get(ns, [toks], array="numpy", tp_rank=1, tp_size=2)
            assert n == 32 and np.array_equal(kv, rank_slice(ns, full, 1, 2))
    asyncio.run(main())


def test_rank_part_matches_put_layout():
    """The block's stored order: a TP rank's heads of one layer are one run of the whole payload."""
    ns = split_ns(heads=4, layers=2)
    p = kvmesh.rank_part(ns, 1, 2)
    whole = np.arange(ns.block_bytes, dtype=np.uint64).astype(np.uint8).tobytes()
    part = block.extract_part(ns, whole, 16, p)
    cell = 2 * 16 * 8 * 2
    assert part == whole[2 * cell:4 * cell] + whole[6 * cell:8 * cell]


def test_bad_range_on_the_wire_is_an_item_error(node, plane):
    """A get-part of a range that is no part (sent as is, past the client's checks) is a miss for
    that item; the connection and the node keep serving."""
    ns = split_ns("py/mgi-wire", heads=4, layers=2)
    toks = prompt(32)
    full = full_kv(ns, 32, 10)
    with kvmesh.Client(node.addr, transport=DATA_PLANES[plane]) as c:
        assert c.put(ns, toks, full) == 2
        m = c.meta(ns)
        conn = c._shm_conn(m) if plane == "shm" else c._tcp_conn(m)
        keys = kvmesh._namespace.key_bytes(ns.salted(m.salt), toks)
        got = []
        parts = [block.Part(0, 2, 1, 3), block.Part(0, 2, 2, 4)]  # heads [1,3) is not an aligned slice
        if plane == "shm":
            conn.get(keys, lambda i, _mem, _mem_np, _off, n: got.append((i, n)), parts)
        else:
            conn.get(keys, lambda i, n: (got.append((i, n)), [memoryview(bytearray(n))])[1], lambda i: None, parts)
        hl = block.namespace_header_len(ns)
        assert got == [(1, hl + block.part_len(ns, 16, parts[1]))]
        assert not conn.closed
        n, kv = c.get(ns, toks, array="numpy", tp_rank=1, tp_size=2)
        assert n == 32 and np.array_equal(kv, rank_slice(ns, full, 1, 2))


def test_ranks_on_two_nodes(start_node):
    """Two ranks write their parts through different nodes of a cluster; a third client reads the
    blocks whole (each completes at its owner: a part put on another node is pushed there too)."""
    import time
    a = start_node()
    b = start_node("--join", a.gossip_addr)
    with kvmesh.Client(a.addr) as ca, kvmesh.Client(b.addr) as cb:
        deadline = time.monotonic() + 60
        while True:  # membership converges asynchronously (gossip): bounded wait for both to see two
            sizes = [len(c._call(c._admin.Members, admin_pb2.MembersRequest()).members) for c in (ca, cb)]
            if sizes == [2, 2]:
                break
            assert time.monotonic() < deadline, f"members {sizes}"
            time.sleep(0.05)
        ns = split_ns("py/mgi-cluster", heads=2, layers=2)
        toks = prompt(16 * 16)
        full = full_kv(ns, 16 * 16, 11)
        assert ca.put(ns, toks, rank_slice(ns, full, 0, 2), tp_rank=0, tp_size=2) == 16
        assert ca.lookup(ns, toks).cached_tokens == 0
        assert cb.put(ns, toks, rank_slice(ns, full, 1, 2), tp_rank=1, tp_size=2) == 16
        # A part put on a node that does not own its block reaches the owner by an asynchronous
        # push: bounded wait until both nodes see every block complete.
        deadline = time.monotonic() + 60
        while True:
            cached = [c.lookup(ns, toks).cached_tokens for c in (ca, cb)]
            if cached == [256, 256]:
                break
            assert time.monotonic() < deadline, f"cached tokens {cached}"
            time.sleep(0.05)
    for node in (a, b):
        with kvmesh.Client(node.addr, transport="grpc") as reader:
            n, kv = reader.get(ns, toks, array="numpy")
            assert n == 256 and np.array_equal(kv, full)
            n, kv = reader.get(ns, toks, array="numpy", pp_rank=1, pp_size=2)
            assert n == 256 and np.array_equal(kv, full[1:])
