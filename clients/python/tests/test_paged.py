"""kvmesh.paged: load/save between the store and a vLLM-style paged KV cache."""
import itertools

import pytest

import kvmesh
from kvmesh import paged

torch = pytest.importorskip("torch")

NS = kvmesh.Namespace("py/paged", "bfloat16", 16, layers=3, kv_heads=2, head_dim=8)
_seq = itertools.count(1)


def engine(num_blocks, block_size, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((2, num_blocks, block_size, 2, 8), generator=g).to(torch.bfloat16) for _ in range(NS.layers)]


def tokens_at(token_pos, table, bs, caches):
    """K|V of the token at position t of a request with block table `table`, per layer."""
    b, s = table[token_pos // bs], token_pos % bs
    return torch.stack([c[:, b, s] for c in caches])


@pytest.mark.parametrize("bs", [8, 16, 32])
@pytest.mark.parametrize("transport", ["auto", "tcp", "grpc"])
def test_save_load_round_trip(node, bs, transport):
    base = next(_seq) * 100_000 + bs * 10
    toks = list(range(base, base + 72))  # 4 full namespace blocks and a tail
    nb = (72 + bs - 1) // bs
    src = engine(40, bs, seed=bs)
    src_table = torch.randperm(40)[:nb]  # scattered blocks, as an engine's allocator leaves them
    with kvmesh.Client(node.addr, transport=transport) as c:
        assert paged.save(c, NS, toks, src, src_table) == 64
        dst = engine(40, bs, seed=1000 + bs)
        keep = [t.clone() for t in dst]
        dst_table = torch.randperm(40)[:nb].tolist()
        assert paged.load(c, NS, toks, dst, dst_table) == 64
    for t in range(64):
        assert torch.equal(tokens_at(t, dst_table, bs, dst), tokens_at(t, src_table.tolist(), bs, src)), t
    # Slots past the loaded tokens, and blocks outside the table, are untouched.
    used = {dst_table[t // bs] * bs + t % bs for t in range(64)}
    for layer in range(NS.layers):
        a = dst[layer].view(2, -1, 2, 8)
        b = keep[layer].view(2, -1, 2, 8)
        rest = torch.tensor(sorted(set(range(a.shape[1])) - used))
        assert torch.equal(a[:, rest], b[:, rest])


def test_store_layout_matches_client(node):
    """What save stores is what Client.get returns for the prompt: the [layers, 2, tokens, ...] layout."""
    toks = list(range(555_000, 555_032))
    src = engine(8, 8, seed=3)
    table = [5, 1, 7, 2]
    with kvmesh.Client(node.addr) as c:
        assert paged.save(c, NS, toks, src, table) == 32
        n, kv = c.get(NS, toks)
    assert n == 32
    for t in range(32):
        assert torch.equal(kv[:, :, t], tokens_at(t, table, 8, src))


def test_load_partial_and_nothing(node):
    toks = list(range(777_000, 777_064))
    src = engine(8, 16, seed=4)
    with kvmesh.Client(node.addr) as c:
        assert paged.save(c, NS, toks[:32], src, [0, 1]) == 32
        dst = engine(8, 16, seed=5)
        assert paged.load(c, NS, toks, dst, [3, 4, 5, 6]) == 32
        assert paged.load(c, NS, list(range(1, 65)), dst, [3, 4, 5, 6]) == 0
        # A table shorter than the prompt bounds what is loaded.
        assert paged.load(c, NS, toks, dst, [7]) == 16


def test_whole_model_caches(node):
    """kv_caches of every layer of the model: each pipeline stage saves and loads its own layers."""
    ns = kvmesh.Namespace("py/paged-pp", "float32", 16, layers=4, kv_heads=2, head_dim=8)
    caches = [torch.randn((2, 4, 16, 2, 8)) for _ in range(4)]
    toks = list(range(888_000, 888_016))
    with kvmesh.Client(node.addr) as c:
        assert paged.save(c, ns, toks, caches, [1], pp_rank=1, pp_size=2) == 16
        assert c.lookup(ns, toks).cached_tokens == 0  # layers [0,2) missing: not a hit yet
        assert paged.save(c, ns, toks, caches[:2], [1], pp_rank=0, pp_size=2) == 16  # the stage's own layers
        n, kv = c.get(ns, toks, pp_rank=1, pp_size=2)
        assert n == 16 and torch.equal(kv[0], caches[2][:, 1]) and torch.equal(kv[1], caches[3][:, 1])
        dst = [torch.zeros((2, 4, 16, 2, 8)) for _ in range(4)]
        assert paged.load(c, ns, toks, dst, [3], pp_rank=0, pp_size=2) == 16
    assert all(torch.equal(dst[i][:, 3], caches[i][:, 1]) for i in range(2)) and not dst[2].any()


def test_tp_ranks(node):
    """Two tensor-parallel ranks save their heads; a rank of another TP size loads its own."""
    ns = kvmesh.Namespace("py/paged-tp", "bfloat16", 16, layers=3, kv_heads=4, head_dim=8)
    full = [torch.randn((2, 4, 16, 4, 8), dtype=torch.bfloat16) for _ in range(3)]
    toks = list(range(889_000, 889_032))
    with kvmesh.Client(node.addr) as c:
        for r in range(2):
            mine = [x[:, :, :, 2 * r:2 * r + 2].contiguous() for x in full]
            assert paged.save(c, ns, toks, mine, [0, 2], tp_rank=r, tp_size=2) == 32
        dst = [torch.zeros((2, 4, 16, 1, 8), dtype=torch.bfloat16) for _ in range(3)]
        assert paged.load(c, ns, toks, dst, [1, 3], tp_rank=3, tp_size=4) == 32
        with pytest.raises(kvmesh.BadPart, match="tensor-parallel size 3"):
            paged.load(c, ns, toks, dst, [1, 3], tp_rank=0, tp_size=3)
    for layer in range(3):
        assert torch.equal(dst[layer][:, 1], full[layer][:, 0, :, 3:4]) and torch.equal(dst[layer][:, 3], full[layer][:, 2, :, 3:4])


@pytest.mark.parametrize("case", ["layers", "shape", "dtype", "noncontig", "mixed"])
def test_bad_caches(node, case):
    caches = engine(4, 16, seed=6)
    if case == "layers":
        caches = caches[:2]
    elif case == "shape":
        caches[1] = torch.zeros((2, 4, 16, 3, 8), dtype=torch.bfloat16)
    elif case == "dtype":
        caches[0] = caches[0].float()
    elif case == "noncontig":
        caches[0] = torch.zeros((2, 16, 4, 2, 8), dtype=torch.bfloat16).transpose(1, 2)
    elif case == "mixed":
        caches[2] = torch.zeros((2, 4, 8, 2, 8), dtype=torch.bfloat16)
    with kvmesh.Client(node.addr) as c:
        c._call = lambda *a, **k: pytest.fail("a call went out")
        with pytest.raises(ValueError, match="kv_caches"):
            paged.save(c, NS, list(range(32)), caches, [0, 1])
        with pytest.raises(ValueError, match="kv_caches"):
            paged.load(c, NS, list(range(32)), caches, [0, 1])


def test_latent_namespace_refused(node):
    """A latent (MLA) namespace is refused with a clear error before any call."""
    ns = kvmesh.Namespace("py/paged-mla", "bfloat16", 16, layers=3, kv_layout="latent", latent_dim=40)
    with kvmesh.Client(node.addr) as c:
        with pytest.raises(ValueError, match="kv_layout='latent'"):
            paged.load(c, ns, list(range(32)), engine(4, 16, 1), [0, 1])
