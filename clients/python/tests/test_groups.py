"""Namespaces with groups (hybrid models): keys, group keys, records and the hit rule against
the Go tests' golden files, and put/get/lookup/exists against a real `kvmesh serve`."""
import json
import pathlib

import numpy as np
import pytest

import kvmesh
from kvmesh import _namespace, block
from kvmesh._namespace import Group

REPO = pathlib.Path(__file__).resolve().parents[3]
torch = pytest.importorskip("torch")


def group_of(d, ns_dtype):
    return Group(d["kind"], d["layers"], window=d.get("window", 0), kv_layout=d["kv_layout"], dtype=d["dtype"],
                 kv_heads=d.get("kv_heads", 0), head_dim=d.get("head_dim", 0), latent_dim=d.get("latent_dim", 0),
                 state_bytes=d.get("state_bytes", 0), scales=d.get("scales", "none"))


def test_groups_golden():
    """prefixhash/testdata/groups.json: encoding, root, digest, chain and group keys, record
    sizes and the hit rule, as the Go tests pin them."""
    f = json.loads((REPO / "prefixhash" / "testdata" / "groups.json").read_text())
    assert f["key_version"] == kvmesh.KEY_VERSION
    assert [kvmesh.group_key(bytes(16), g).hex() for g in range(len(f["masks"]))] == f["masks"]
    for v in f["vectors"]:
        n = v["namespace"]
        ns = kvmesh.Namespace(n["model"], n["dtype"], n["block_tokens"], layers=n["layers"], tenant_salt=n["tenant_salt"],
                              lora=n.get("lora", ""), key_scheme=n.get("key_scheme", "kvmesh"),
                              hash_seed=n.get("hash_seed", ""), groups=[group_of(g, n["dtype"]) for g in v["groups"]])
        assert ns.encoding().hex() == v["encoding"], v["name"]
        assert ns.root().hex() == v["root"], v["name"]
        assert f"{ns.digest():016x}" == v["digest"], v["name"]
        keys = kvmesh.keys(ns, v["tokens"])
        assert keys == v["keys"], v["name"]
        for g, gk in enumerate(v["group_keys"]):
            assert [kvmesh.group_key(bytes.fromhex(k), g).hex() for k in keys] == gk, (v["name"], g)
            assert ns.group_bytes(g) == v["record_bytes"][g], (v["name"], g)
        for h in v["hits"]:
            held = [set(x) for x in h["held"]]
            p, per = _namespace.resume(ns.groups, ns.block_tokens, len(keys), lambda g, i: i in held[g])
            assert (p, per) == (h["blocks"], h["groups"]), (v["name"], h)


def hybrid_test_ns():
    """blocktest.Hybrid: the namespace of block/testdata/groups.json."""
    return kvmesh.Namespace("kvmesh/hybrid-test", "float16", 4, layers=7, groups=[
        Group("full", [1, 4], kv_heads=2, head_dim=8),
        Group("sliding", [0, 2, 3, 5], window=6, kv_heads=2, head_dim=8),
        Group("state", [6], dtype="float32", kv_heads=2, state_bytes=16),
        Group("indexer", [1, 4], kv_layout="latent", latent_dim=4)])


def test_group_records_golden():
    """block/testdata/groups.json: every group's records and TP/PP parts of them, byte for byte."""
    f = json.loads((REPO / "block" / "testdata" / "groups.json").read_text())
    n = f["namespace"]
    ns = kvmesh.Namespace(n["model"], n["dtype"], n["block_tokens"], layers=n["layers"],
                          groups=[group_of(g, n["dtype"]) for g in n["groups"]])
    assert ns == hybrid_test_ns()
    recs = f["records"]
    assert len(recs) >= 20
    t0 = next(r["tokens"] for r in recs if r["block"] == 0)
    for r in recs:
        g = r["group"]
        parent = ns.root_link() if r["block"] == 0 else _namespace.block_link(ns, ns.root_link(), _namespace.token_bytes(t0), [])
        p = block.rank_group_part(ns, g, r["tp_rank"], r["tp_size"], r["pp_rank"], r["pp_size"])
        assert list(p) == r["part"]
        view = block.record_view(ns, g)
        part = block.extract_part(view, bytes.fromhex(r["whole_payload"]), ns.block_tokens, p)
        rec, _ = block.encode_record(ns, parent, r["tokens"], part, tenant_tag=0xabcdef, part=p, group=g)
        assert rec.hex() == r["encoded"], (g, r["block"], r["part"])
        h, payload = block.decode_record(ns, rec, group=g)
        assert h.group == g and h.group_kind == ns.groups[g].kind and bytes(payload) == part
        with pytest.raises(block.CorruptBlock):
            block.decode_record(ns, rec, group=(g + 1) % len(ns.groups))


@pytest.mark.parametrize("field,mod", [
    ("groups[1].layers", lambda gs: gs.__setitem__(1, Group("sliding", [0, 1], window=6, kv_heads=2, head_dim=8))),
    ("groups[1].window", lambda gs: gs.__setitem__(1, Group("sliding", [0, 2], window=0, kv_heads=2, head_dim=8))),
    ("groups[2].state_bytes", lambda gs: gs.__setitem__(2, Group("state", [6], dtype="float32", state_bytes=6))),
    ("groups[0].kv_layout", lambda gs: gs.__setitem__(0, Group("full", [1, 4], kv_layout="state", state_bytes=4))),
])
def test_group_validation(field, mod):
    gs = list(hybrid_test_ns().groups)
    mod(gs)
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        kvmesh.Namespace("kvmesh/hybrid-test", "float16", 4, layers=7, groups=gs)


# ---- against a node ----

def gemma_like(model):
    """Gemma-style: a full layer, four sliding ones (a 32-token window), a recurrent state."""
    return kvmesh.Namespace(model, "bfloat16", 16, layers=6, groups=[
        Group("full", [5], kv_heads=2, head_dim=8),
        Group("sliding", [0, 1, 2, 3], window=32, kv_heads=2, head_dim=8),
        Group("state", [4], dtype="float32", kv_heads=2, state_bytes=64)])


def tensors(ns, n_blocks, seed):
    g = torch.Generator().manual_seed(seed)
    n = n_blocks * ns.block_tokens
    full = torch.randn(1, 2, n, 2, 8, generator=g).to(torch.bfloat16)
    sliding = torch.randn(4, 2, n, 2, 8, generator=g).to(torch.bfloat16)
    states = torch.randn(n_blocks, 1, 2, 16, generator=g)
    return full, sliding, states


@pytest.mark.parametrize("transport", ["auto", "tcp", "grpc"])
def test_groups_round_trip(node, transport):
    """Every group put, a full hit: get returns the full group's prefix, the window's blocks and
    the last state, bit for bit; without the newest state the hit is one block shorter, and
    lookup says the state group is why."""
    ns = gemma_like("py/hybrid-" + transport)
    nb = 6
    tokens = [(7919 * i + len(transport)) % (1 << 31) for i in range(nb * 16 + 3)]
    full, sliding, states = tensors(ns, nb, 1)
    with kvmesh.Client(node.addr, transport=transport) as c:
        assert c.put(ns, tokens, full, group=0) == nb
        assert c.put(ns, tokens, sliding, group=1) == nb
        # The states of every boundary but the last.
        assert c.put(ns, tokens[:(nb - 1) * 16], states[:nb - 1], group=2) == nb - 1
        l = c.lookup(ns, tokens)
        assert l.cached_blocks == nb - 1
        assert [(x.kind, x.blocks) for x in l.groups] == [("full", nb), ("sliding", nb), ("state", nb - 1)]
        ex = c.exists(ns, tokens)
        assert ex[0] == [True] * nb and ex[2] == [True] * (nb - 1) + [False]

        cached, got = c.get(ns, tokens)
        p = nb - 1
        assert cached == p * 16
        assert got[0].start == 0 and torch.equal(got[0].kv, full[:, :, :p * 16])
        w = 2  # 32 tokens of 16
        assert got[1].start == p - w and torch.equal(got[1].kv, sliding[:, :, (p - w) * 16:p * 16])
        assert torch.equal(got[2].kv, states[p - 1])

        # The newest state, from the last block on: a full hit.
        assert c.put(ns, tokens, states[nb - 1:], group=2, start=nb - 1) == 1
        cached, got = c.get(ns, tokens, array="numpy")
        assert cached == nb * 16 and got[1].start == nb - w
        assert np.array_equal(got[2].kv, states[nb - 1].numpy())


def test_groups_invalid(node):
    """A state of the wrong size and an unknown group are refused naming the field; no group at
    all with a namespace that has them is refused too."""
    ns = gemma_like("py/hybrid-invalid")
    tokens = list(range(32))
    with kvmesh.Client(node.addr, transport="grpc") as c:
        with pytest.raises(ValueError, match=r"groups\[2\]\.state_bytes"):
            c.put(ns, tokens, torch.zeros(2, 1, 2, 15), group=2)
        with pytest.raises(ValueError, match="group"):
            c.put(ns, tokens, torch.zeros(1, 2, 32, 2, 8, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="group"):
            c.put(ns, tokens, torch.zeros(1, 2, 32, 2, 8, dtype=torch.bfloat16), group=7)
        # The node names the field too (a raw stream with a short state).
        from kvmesh.v1 import cache_pb2
        req = cache_pb2.BatchPutRequest(namespace=ns.to_proto(), block=cache_pb2.BlockHeader(
            tokens=tokens[:16], payload_len=60, group=3), data=bytes(60))
        with pytest.raises(kvmesh.InvalidArgument, match=r"groups\[2\]\.state_bytes"):
            _raw_put(c, req)
        assert c.lookup(ns, tokens).cached_blocks == 0  # still serving
        cached, got = c.get(ns, tokens)  # nothing cached: empty tensors, no state
        assert cached == 0 and got[0].kv.shape == (1, 2, 0, 2, 8) and got[1].kv.shape == (4, 2, 0, 2, 8)
        assert got[2].kv is None


def _raw_put(c, req):
    import grpc
    from kvmesh.errors import from_rpc
    try:
        c._cache.BatchPut(iter([req]), timeout=10)
    except grpc.RpcError as e:
        raise from_rpc(e) from None


def test_groups_aio(node):
    """The asyncio client puts, looks up and reads a hybrid prompt as the sync one does."""
    import asyncio
    ns = gemma_like("py/hybrid-aio")
    nb = 4
    tokens = [(104729 * i) % (1 << 31) for i in range(nb * 16)]
    full, sliding, states = tensors(ns, nb, 2)

    async def run():
        async with kvmesh.aio.Client(node.addr) as c:
            assert await c.put(ns, tokens, full, group=0) == nb
            assert await c.put(ns, tokens, sliding, group=1) == nb
            assert await c.put(ns, tokens, states, group=2) == nb
            assert (await c.lookup(ns, tokens)).cached_blocks == nb
            assert (await c.exists(ns, tokens))[1] == [True] * nb
            return await c.get(ns, tokens)
    cached, got = asyncio.run(run())
    assert cached == nb * 16 and torch.equal(got[0].kv, full) and torch.equal(got[2].kv, states[nb - 1])
    assert torch.equal(got[1].kv, sliding[:, :, (nb - 2) * 16:])
