"""Key format 3, block format 4 and parts, without a node: the namespace encoding, headers and
part records byte by byte against the spec's layout, the rank -> part mapping (Go's
block.RankPart), bad ranges, and the tensor slicing of put and get (every rank's put of a block
assembled as the node assembles parts, then read back at other parallel sizes)."""
import hashlib
import struct

import numpy as np
import pytest

import kvmesh
from kvmesh import _core, _tensors, _xxhash, block
from kvmesh._namespace import DTYPE_IDS

needs_xxhash = pytest.mark.skipif(not _xxhash.available, reason="needs libxxhash")


def s(x):
    b = x.encode()
    return struct.pack("<I", len(b)) + b


def test_encoding_v3_by_hand():
    """The canonical encoding, built field by field from the spec (§1): no layer range, no TP."""
    ns = kvmesh.Namespace("meta-llama/Llama-3.1-8B", "bfloat16", 16, 32, 8, 128, tenant_salt="t")
    want = s("kvmesh/ns/v3") + s("meta-llama/Llama-3.1-8B") + bytes([3]) + struct.pack("<4I", 16, 32, 8, 128) + s("t")
    assert ns.encoding() == want
    assert ns.root() == hashlib.sha256(want).digest()[:16]
    assert ns.digest() == int.from_bytes(hashlib.sha256(want).digest()[:8], "little")
    lat = kvmesh.Namespace("moonshotai/Kimi-K2.5", "fp8_e4m3", 16, 61, kv_layout="latent", latent_dim=576,
                           scales="block", lora="a")
    want = (s("kvmesh/ns/v3") + s("moonshotai/Kimi-K2.5") + bytes([4]) + struct.pack("<4I", 16, 61, 0, 0) + s("") +
            bytes([1, 1]) + struct.pack("<I", 576) + b"\x02" + s("a") + bytes([3, 1]))
    assert lat.encoding() == want
    assert kvmesh.KEY_VERSION == 3


def test_namespace_migration_errors():
    with pytest.raises(TypeError, match="tp_rank is no longer part of the namespace"):
        kvmesh.Namespace("m", "float16", 16, 32, 8, 128, tp_rank=1)
    with pytest.raises(TypeError, match="tp_size"):
        kvmesh.Namespace("m", "float16", 16, 32, 8, 128, tp_size=2)
    with pytest.raises(ValueError, match="layers.*layer range.*pp_rank"):
        kvmesh.Namespace("m", "float16", 16, (0, 32), 8, 128)
    for bad in (0, -1, (1 << 20) + 1, 1.5, True):
        with pytest.raises(ValueError, match="namespace layers"):
            kvmesh.Namespace("m", "float16", 16, bad, 8, 128)
    ns = kvmesh.Namespace("m", "float16", 16, 32, 8, 128)
    assert ns.layers == 32 and ns.block_shape() == (32, 2, 16, 8, 128)


def test_proto_namespace_has_layers():
    """kvmesh.v1.Namespace carries the model's layers; the deprecated layer range and TP fields of
    key format 2 stay unset (the stubs come from proto/ via proto/gen.sh)."""
    m = kvmesh.Namespace("m", "float16", 16, 32, 8, 128).to_proto()
    assert m.layers == 32
    assert (m.layer_start, m.layer_end, m.tp_rank, m.tp_size) == (0, 0, 0, 0)


def test_rank_part_tp():
    ns = kvmesh.Namespace("m", "float16", 16, 32, 8, 128)
    assert kvmesh.rank_part(ns) == block.whole_part(ns) == (0, 32, 0, 8)
    for tp in (1, 2, 4, 8):
        w = 8 // tp
        assert [kvmesh.rank_part(ns, r, tp) for r in range(tp)] == [(0, 32, r * w, r * w + w) for r in range(tp)]
    # More ranks than heads: vLLM replicates each head over tp/H ranks.
    assert [kvmesh.rank_part(ns, r, 16).h0 for r in range(16)] == [r // 2 for r in range(16)]
    assert [kvmesh.rank_part(ns, r, 32)[2:] for r in (0, 3, 4, 31)] == [(0, 1), (0, 1), (1, 2), (7, 8)]
    assert block.replicated(ns, 16) and not block.replicated(ns, 8) and not block.replicated(ns, 1)
    lat = kvmesh.Namespace("m", "bfloat16", 16, 61, kv_layout="latent", latent_dim=576)
    assert {kvmesh.rank_part(lat, r, 8) for r in range(8)} == {(0, 61, 0, 1)}
    assert block.replicated(lat, 8) and not block.replicated(lat, 1)


def test_rank_part_pp_is_vllms_partition():
    def vllm(layers, pp):  # vLLM's get_pp_indices, restated
        parts = [layers // pp] * pp
        for i in range(2, layers % pp + 2):
            parts[-i] += 1
        out, start = [], 0
        for n in parts:
            out.append((start, start + n))
            start += n
        return out
    for layers in (1, 2, 5, 32, 61):
        ns = kvmesh.Namespace("m", "float16", 16, layers, 8, 128)
        for pp in range(1, min(layers, 9) + 1):
            got = [tuple(kvmesh.rank_part(ns, 0, 1, r, pp))[:2] for r in range(pp)]
            assert got == vllm(layers, pp), (layers, pp)
    ns = kvmesh.Namespace("m", "float16", 16, 61, 8, 128)
    assert kvmesh.rank_part(ns, 3, 4, 1, 2) == (31, 61, 6, 8)


@pytest.mark.parametrize("kw,msg", [
    (dict(tp_size=3), r"^block: invalid part: tensor-parallel size 3 for 8 KV heads: it must divide the heads or be a "
                      r"multiple of them \(valid: 1, 2, 4, 8, or a multiple of 8\)$"),
    (dict(tp_size=12), r"size 12 .*valid: 1, 2, 4, 8, or a multiple of 8"),
    (dict(tp_rank=2, tp_size=2), r"tensor-parallel rank 2 of size 2: want 0 <= rank < size"),
    (dict(tp_rank=-1, tp_size=2), r"tensor-parallel rank -1 of size 2"),
    (dict(tp_size=0), r"tensor-parallel rank 0 of size 0"),
    (dict(pp_size=33), r"33 pipeline stages for 32 layers: a stage holds at least one layer"),
    (dict(pp_rank=2, pp_size=2), r"pipeline rank 2 of size 2: want 0 <= rank < size"),
    (dict(pp_size=0), r"pipeline rank 0 of size 0"),
    (dict(tp_rank=1.0, tp_size=2), r"tp_rank 1.0 is not an int"),
    (dict(pp_size=True), r"pp_size True is not an int"),
])
def test_rank_part_bad(kw, msg):
    ns = kvmesh.Namespace("m", "float16", 16, 32, 8, 128)
    with pytest.raises(kvmesh.BadPart, match=msg) as e:
        kvmesh.rank_part(ns, **kw)
    assert isinstance(e.value, kvmesh.InvalidArgument) and isinstance(e.value, ValueError)


def test_check_part_bad():
    ns = kvmesh.Namespace("m", "int8", 16, 4, 8, 16, scales="head")
    block.check_part(ns, block.Part(1, 3, 4, 6))
    for p, msg in [((0, 5, 0, 8), r"layers \[0,5\): want a non-empty range inside \[0,4\)"),
                   ((2, 2, 0, 8), "non-empty range"), ((-1, 2, 0, 8), "non-empty range"),
                   ((0, 4, 1, 3), r"heads \[1,3\) of 8: a head range is one of the equal slices of the 8 KV heads "
                                  r"\(width 8: \[0,8\); width 4: \[0,4\), \[4,8\); width 2: \[0,2\), \[2,4\), …"),
                   ((0, 4, 0, 3), "equal slices"), ((0, 4, 6, 10), "equal slices"), ((0, 4, 2, 2), "equal slices")]:
        with pytest.raises(kvmesh.BadPart, match=msg):
            block.check_part(ns, p)
    lat = kvmesh.Namespace("m", "bfloat16", 16, 4, kv_layout="latent", latent_dim=64)
    with pytest.raises(kvmesh.BadPart, match=r"no heads to split, every rank holds it whole \(heads \[0,1\)\)"):
        block.check_part(lat, (0, 4, 0, 2))
    blk = kvmesh.Namespace("m", "int8", 16, 4, 8, 16, scales="block")
    with pytest.raises(kvmesh.BadPart, match="per-block scales"):
        kvmesh.rank_part(blk, 0, 2)
    assert kvmesh.rank_part(blk, 0, 1, 1, 2) == (2, 4, 0, 8)


@needs_xxhash
def test_header_layout():
    """Every field of the fixed header at its offset (spec §2), whole and part."""
    ns = kvmesh.Namespace("m", "int8", 4, 6, 4, 8, scales="head", tenant_salt="x", extra_key_bytes=20)
    tokens = [7, 8, 9, 10]
    parent = ns.root_link()
    p = block.Part(2, 5, 2, 4)
    plen = block.part_len(ns, 4, p)
    assert plen == 3 * 2 * (2 * 4 * 8) + 4 * 3 * 2 * 2
    h, link = block.encode_header(ns, parent, tokens, 0x1122334455667788, 99, extra=[b"abc"], part=p)
    assert len(h) % 64 == 0 and len(h) == block.namespace_header_len(ns)
    assert h[:4] == b"KVMB" and struct.unpack_from("<H", h, 4)[0] == 4 and h[6] == 3
    assert h[7] == 0 and struct.unpack_from("<II", h, 8) == (len(h), 4)
    assert struct.unpack_from("<Q", h, 16)[0] == ns.digest()
    assert h[24:40] == link[:16] and h[40:56] == parent[:16]
    assert (h[56], h[57], h[58], h[59]) == (DTYPE_IDS["int8"], 0, 2, 0)
    assert struct.unpack_from("<5I", h, 60) == (6, 4, 8, 0, 0)
    assert struct.unpack_from("<QQQ", h, 80) == (plen, 0x1122334455667788, 99)
    assert struct.unpack_from("<4I", h, 104) == (2, 5, 2, 4)
    assert bytes(h[128:144]) == struct.pack("<4I", *tokens)
    x = struct.unpack_from("<I", h, 144)[0]
    assert x == ns.extension_room() == 24
    assert bytes(h[148:148 + 11]) == struct.pack("<II", 1, 3) + b"abc" and not any(h[159:148 + x])
    assert struct.unpack_from("<Q", h, 120)[0] == _xxhash.xxh64(bytes(h[:120]) + bytes(h[128:148 + x]))
    d = block.decode_header(h)
    assert d.part == p and not d.whole() and d.payload_len == plen and d.extra == [b"abc"] and d.tenant == 99
    block.check_namespace(d, ns, p)
    with pytest.raises(block.CorruptBlock, match="want layers"):
        block.check_namespace(d, ns)
    w, _ = block.encode_header(ns, parent, tokens, 0)
    dw = block.decode_header(w)
    assert dw.whole() and dw.payload_len == ns.block_bytes and dw.part == (0, 6, 0, 4)


@needs_xxhash
def test_header_refuses_other_formats_and_damage():
    ns = kvmesh.Namespace("m", "float16", 4, 2, 2, 8)
    h, _ = block.encode_header(ns, ns.root_link(), [1, 2, 3, 4], 0)
    for off, val, msg in [(4, 3, "block format 3"), (6, 2, "key format 2"), (0, 0, "magic"), (130, 9, "checksum"),
                          (108, 1, "checksum")]:
        b = bytearray(h)
        b[off] = val
        with pytest.raises(block.CorruptBlock, match=msg):
            block.decode_header(b)
    with pytest.raises(kvmesh.BadPart, match=r"layers \[0,3\): want a non-empty range inside \[0,2\)"):
        block.encode_header(ns, ns.root_link(), [1, 2, 3, 4], 0, part=(0, 3, 0, 2))


def _whole_payload(ns, tokens, seed=0):
    """A random whole block payload of ns (with its scales)."""
    return np.random.default_rng(seed).integers(0, 256, ns.block_bytes, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("ns", [
    kvmesh.Namespace("m", "int8", 4, 5, 8, 8, scales="head"),
    kvmesh.Namespace("m", "fp8_e4m3", 4, 5, 4, 8, scales="block"),
    kvmesh.Namespace("m", "float16", 4, 5, 4, 8),
    kvmesh.Namespace("m", "fp8_e4m3", 4, 5, kv_layout="latent", latent_dim=24, scales="block"),
])
def test_part_payloads_tile_the_block(ns):
    """The parts of any TP x PP layout tile the whole payload: extract then place rebuilds it
    byte for byte, and each part's length is part_len."""
    B = ns.block_tokens
    whole = _whole_payload(ns, B)
    for tp in [t for t in (1, 2, 4, 8, 16) if ns.kv_layout == "latent" or ns.scales != "block" or t == 1]:
        for pp in (1, 2, 3):
            rebuilt = bytearray(ns.block_bytes)
            for r in range(tp):
                for q in range(pp):
                    p = kvmesh.rank_part(ns, r, tp, q, pp)
                    part = block.extract_part(ns, whole, B, p)
                    assert len(part) == block.part_len(ns, B, p)
                    block.place_part(ns, rebuilt, part, B, p)
            assert bytes(rebuilt) == whole, (tp, pp)
    assert block.extract_part(ns, whole, B, block.whole_part(ns)) == whole


def test_part_payload_order():
    """A split part is, per layer, its heads' [K|V][token][head_dim] runs, then per layer its heads'
    [K|V] scales (spec §2)."""
    ns = kvmesh.Namespace("m", "int8", 2, 2, 4, 3, scales="head")
    B, L, H, D = 2, 2, 4, 3
    kv = np.arange(L * H * 2 * B * D, dtype=np.uint8).reshape(L, H, 2, B, D)
    sc = np.arange(L * H * 2, dtype="<f4").reshape(L, H, 2)
    whole = kv.tobytes() + sc.tobytes()
    p = block.Part(1, 2, 2, 4)
    assert block.extract_part(ns, whole, B, p) == kv[1:2, 2:4].tobytes() + sc[1:2, 2:4].tobytes()


@needs_xxhash
def test_record_round_trip_and_damage():
    ns = kvmesh.Namespace("m", "float16", 4, 3, 4, 8)
    p = kvmesh.rank_part(ns, 1, 2, 1, 3)
    payload = bytes(range(256)) * (block.part_len(ns, 4, p) // 256) + bytes(block.part_len(ns, 4, p) % 256)
    rec, link = block.encode_record(ns, ns.root_link(), [1, 2, 3, 4], payload, part=p)
    h, pl = block.decode_record(ns, rec)
    assert h.part == p and bytes(pl) == payload and h.key == link[:16]
    bad = bytearray(rec)
    bad[-1] ^= 1
    with pytest.raises(block.CorruptBlock, match="payload checksum"):
        block.decode_record(ns, bad)
    with pytest.raises(ValueError, match="holds"):
        block.encode_record(ns, ns.root_link(), [1, 2, 3, 4], payload[:-2], part=p)


class _Node:
    """What the node does with parts, for the slicing tests: assemble each block from the part
    records put (checked against the header), serve whole blocks and part records."""

    def __init__(self, ns):
        self.ns, self.blocks, self.cover = ns, {}, {}

    def put(self, plan):
        ns, B = self.ns, self.ns.block_tokens
        keys, _chunks, heads, payloads = plan.shm_items()
        for k, h, runs in zip(keys, heads, payloads):
            part = b"".join(np.ascontiguousarray(r).tobytes() for r in runs)
            if _xxhash.available:
                hdr, _ = block.decode_record(ns, h + part)
            else:
                hdr = block.decode_header(h)
            assert hdr.key == k
            buf = self.blocks.setdefault(k, bytearray(ns.block_bytes))
            block.place_part(ns, buf, part, B, hdr.part)
            p = hdr.part
            self.cover.setdefault(k, set()).update((l, x) for l in range(p.l0, p.l1) for x in range(p.h0, p.h1))

    def complete(self, k):
        return len(self.cover.get(k, ())) == self.ns.layers * self.ns.heads


def _plan_put(ns, tokens, kv, rank, scales=None):
    sl = _core.rank_slice(ns, *rank)
    return _core.PutPlan(ns, [(tokens, kv, scales)], _core.Meta(key_version=kvmesh.KEY_VERSION), sl)


def _slice_of(ns, full, rank):
    p = kvmesh.rank_part(ns, *rank)
    if ns.kv_layout == "latent":
        return np.ascontiguousarray(full[p.l0:p.l1])
    return np.ascontiguousarray(full[p.l0:p.l1, :, :, p.h0:p.h1])


@pytest.mark.parametrize("ns", [
    kvmesh.Namespace("m", "float32", 4, 4, 4, 8),
    kvmesh.Namespace("m", "float16", 4, 5, 2, 8),
    kvmesh.Namespace("m", "bfloat16", 4, 3, kv_layout="latent", latent_dim=12),
])
def test_slicing_round_trips(ns):
    """Put at TP 2 (and PP 2), assemble as the node does, read at TP 1, 2, 4 and PP 2: every read
    equals the slice of the original tensor; through part records (data planes) and whole
    blocks (gRPC) alike."""
    B, n = ns.block_tokens, 3 * ns.block_tokens
    tokens = list(range(100, 100 + n + 1))  # a tail shorter than a block is not stored
    rng = np.random.default_rng(5)
    full = rng.standard_normal(ns.block_shape(n + 1)).astype(_tensors.numpy_dtype(ns)) if ns.dtype != "bfloat16" \
        else rng.integers(0, 1 << 16, ns.block_shape(n + 1), dtype=np.uint16)
    node = _Node(ns)
    writers = [(r, 2, 0, 1) for r in range(2)]
    for i, rank in enumerate(writers):
        plan = _plan_put(ns, tokens, _slice_of(ns, full, rank), rank)
        node.put(plan)
        # Every TP rank holds the whole latent: the first rank's put completes the blocks.
        assert all(node.complete(k) for k in plan.keys()) == (i == len(writers) - 1 or ns.kv_layout == "latent")
    readers = [(0, 1, 0, 1), (1, 2, 0, 1), (3, 4, 0, 1), (0, 1, 1, 2), (1, 4, 0, 2), (0, 2, 1, 2)]
    if ns.heads < 4:
        readers = [r for r in readers if r[1] <= ns.heads or ns.kv_layout == "latent"]
    for rank in readers:
        sl = _core.rank_slice(ns, *rank)
        want = _slice_of(ns, full, rank)
        want = want[:, :n] if ns.kv_layout == "latent" else want[:, :, :n]
        for via in ("part", "whole"):
            plan = _core.GetPlan(ns, [tokens], None, "numpy", _core.Meta(key_version=kvmesh.KEY_VERSION), sl=sl)
            for j, k in enumerate(plan.keys):
                whole = bytes(node.blocks[k])
                if via == "whole":
                    plan.land(j, whole)
                else:
                    p, i = plan.where[j]
                    plan.dests[p].put_part(i, block.extract_part(ns, whole, B, sl.part))
                    plan.found[p].add(i)
            got, kv = plan.results()[0]
            assert got == n and kv.shape == want.shape and np.array_equal(kv, want), (rank, via)


def test_put_runs_are_views_where_the_order_allows():
    """One head per rank and the latent layout put straight from the tensor; several heads per
    rank take one copy per block, in the stored order."""
    ns = kvmesh.Namespace("m", "float16", 2, 2, 4, 4)
    full = np.arange(np.prod(ns.block_shape(4)), dtype=np.float16).reshape(ns.block_shape(4))
    one = _slice_of(ns, full, (1, 4, 0, 1))
    sl = _core.rank_slice(ns, 1, 4)
    runs = _tensors.put_runs(sl, _tensors.host_u8(one, sl)[0], 1)
    assert len(runs) == 2 * 2 and all(np.shares_memory(r, one) for r in runs)
    two = _slice_of(ns, full, (1, 2, 0, 1))
    sl = _core.rank_slice(ns, 1, 2)
    runs = _tensors.put_runs(sl, _tensors.host_u8(two, sl)[0], 1)
    assert len(runs) == 1 and not np.shares_memory(runs[0], two)
    whole = full.view(np.uint8).reshape(2, 2, 4, 4, 8)[:, :, 2:4].transpose(0, 3, 1, 2, 4)  # [L][H][K|V][B][D]
    assert runs[0].tobytes() == np.ascontiguousarray(whole[:, 2:4]).tobytes()


def test_scales_follow_the_part():
    """Per-head scales are [layer][kv_head][K|V]: a rank gives and gets its heads' and layers'."""
    ns = kvmesh.Namespace("m", "int8", 2, 4, 4, 4, scales="head")
    assert ns.scales_shape() == (4, 4, 2)
    sl = _core.rank_slice(ns, 1, 2, 1, 2)
    assert sl.scales_shape == (2, 2, 2)
    n = 4
    rng = np.random.default_rng(1)
    full = rng.integers(-100, 100, ns.block_shape(n), dtype=np.int8)
    fsc = rng.random((n // 2,) + ns.scales_shape(), dtype=np.float32)
    node = _Node(ns)
    for r in range(2):
        for q in range(2):
            p = kvmesh.rank_part(ns, r, 2, q, 2)
            sc = np.ascontiguousarray(fsc[:, p.l0:p.l1, p.h0:p.h1])
            node.put(_plan_put(ns, list(range(n)), _slice_of(ns, full, (r, 2, q, 2)), (r, 2, q, 2), sc))
    plan = _core.GetPlan(ns, [list(range(n))], None, "numpy", _core.Meta(key_version=kvmesh.KEY_VERSION),
                         sl=_core.rank_slice(ns, 0, 4, 1, 2))
    for j, k in enumerate(plan.keys):
        plan.land(j, bytes(node.blocks[k]))
    got, kv, sc = plan.results()[0]
    assert got == n and np.array_equal(sc, fsc[:, 2:4, 0:1]) and np.array_equal(kv, full[2:4, :, :, 0:1])
    with pytest.raises(ValueError, match=r"scales: shape \[2, 4, 4, 2\] float32, want float32 \[2, 2, 2, 2\]"):
        _plan_put(ns, list(range(n)), _slice_of(ns, full, (0, 2, 0, 2)), (0, 2, 0, 2), fsc)


def test_shape_errors_name_the_rank():
    ns = kvmesh.Namespace("m", "float16", 4, 4, 8, 8)
    with pytest.raises(ValueError, match=r"kv: shape \[4, 2, 8, 8, 8\], want \[2, 2, 8, 2, 8\] \(layers of this "
                       r"rank, K\|V, tokens, kv_heads of this rank, head_dim\) \(tp_rank 1 of 4, pp_rank 0 of 2"):
        _plan_put(ns, list(range(8)), np.zeros((4, 2, 8, 8, 8), np.float16), (1, 4, 0, 2))


def golden_records():
    """block/testdata/golden_v4.json, written by the Go tests (go test ./block -update-parts)."""
    import json
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[3] / "block" / "testdata" / "golden_v4.json"
    return json.loads(path.read_text())["records"]


@needs_xxhash
def test_golden_v4_records():
    """Go's block format 4 records, whole blocks and every rank's part, reproduced byte for byte:
    the rank's part range, the part extracted from the whole payload, the encoded record; and
    decoded back."""
    recs = golden_records()
    assert len(recs) >= 10 and {r["name"] for r in recs} >= {"split", "int8-per-head", "latent"}
    assert any(r["tp_size"] > r["kv_heads"] > 0 for r in recs) and any(r["pp_size"] > 1 for r in recs)
    for r in recs:
        ns = kvmesh.Namespace(r["model"], r["dtype"], r["block_tokens"], r["layers"], r["kv_heads"], r["head_dim"],
                              kv_layout=r["kv_layout"], latent_dim=r["latent_dim"], scales=r["scales"])
        name = f"{r['name']} tp {r['tp_rank']}/{r['tp_size']} pp {r['pp_rank']}/{r['pp_size']}"
        p = kvmesh.rank_part(ns, r["tp_rank"], r["tp_size"], r["pp_rank"], r["pp_size"])
        assert list(p) == r["part"], name
        whole = bytes.fromhex(r["whole_payload"])
        assert len(whole) == ns.block_bytes, name
        part = block.extract_part(ns, whole, ns.block_tokens, p)
        rec, link = block.encode_record(ns, ns.root_link(), r["tokens"], part, r["tenant"], part=p)
        assert rec.hex() == r["encoded"], name
        h, pl = block.decode_record(ns, bytes.fromhex(r["encoded"]))
        assert h.part == p and bytes(pl) == part and h.tenant == r["tenant"] and h.whole() == block.is_whole(ns, p)
