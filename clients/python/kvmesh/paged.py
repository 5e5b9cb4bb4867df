"""Blocks between the store and an engine's paged KV cache (vLLM's layout).

kv_caches is one tensor per layer shaped [2, num_blocks, block_size,
num_kv_heads/tp_size, head_dim] (vLLM's per-layer K|V cache of one
tensor-parallel rank): either one per layer of the rank's pipeline stage, or
one per layer of the whole model (then the stage's layers are used). Each
rank calls load/save with its tp_rank, tp_size, pp_rank, pp_size, and moves
its own part of the blocks (block.rank_part). block_table lists the engine blocks
of the request in order: engine block j holds tokens [j*block_size,
(j+1)*block_size). The engine's block_size may be a divisor or a multiple of
the namespace's block_tokens; the copy is addressed per token (slot =
block_table[t // block_size] * block_size + t % block_size), so any ratio
works, with one index_copy_ (load) or index_select (save) per layer and no
Python loop over tokens.
"""
from . import _tensors


def _torch():
    import torch
    return torch


def _layers(ns, kv_caches, sl):
    if ns.kv_layout != "split" or ns.scales != "none":
        # vLLM's paged MLA cache is [num_blocks, block_size, latent]: not wired here yet.
        raise ValueError(f"paged: namespaces with kv_layout={ns.kv_layout!r}, scales={ns.scales!r} are not supported; "
                         "use Client.put/get with [layers, tokens, latent_dim] tensors")
    caches = list(kv_caches)
    p = sl.part
    if len(caches) == sl.layers:
        pass
    elif len(caches) == ns.layers:
        caches = caches[p.l0:p.l1]
    else:
        raise ValueError(f"kv_caches: {len(caches)} layers, want {sl.layers} (the rank's, layers [{p.l0},{p.l1})) "
                         f"or {ns.layers} (the model's)")
    torch = _torch()
    out = []
    want_dt = _tensors.torch_dtype(ns)
    bs = None
    for i, c in enumerate(caches):
        if not _tensors.is_torch(c):
            c = torch.from_numpy(c)
        if c.dim() != 5 or c.shape[0] != 2 or c.shape[3] != sl.heads or c.shape[4] != ns.head_dim:
            raise ValueError(f"kv_caches[{i}]: shape {list(c.shape)}, want [2, num_blocks, block_size, "
                             f"{sl.heads}, {ns.head_dim}]" + sl.describe())
        if not _tensors._torch_ok(ns, c.dtype):
            raise ValueError(f"kv_caches[{i}]: dtype {c.dtype}, want {want_dt}")
        if not c.is_contiguous():
            raise ValueError(f"kv_caches[{i}]: must be contiguous")
        if bs is not None and c.shape[1:3] != out[0].shape[1:3]:
            raise ValueError(f"kv_caches[{i}]: {list(c.shape)} differs from kv_caches[0]")
        bs = c.shape[2]
        out.append(c)
    return out, bs


def _slots(block_table, block_size, n_tokens, device):
    torch = _torch()
    bt = block_table if _tensors.is_torch(block_table) else torch.as_tensor(list(block_table), dtype=torch.long)
    bt = bt.to(device=device, dtype=torch.long)
    t = torch.arange(n_tokens, device=device)
    return bt[t // block_size] * block_size + t % block_size


def _capacity(ns, tokens, block_table, block_size):
    """Tokens in full namespace blocks that the block table has room for."""
    n = min(len(tokens), len(block_table) * block_size)
    return n - n % ns.block_tokens


def _rank(ns, tp_rank, tp_size, pp_rank, pp_size):
    from . import _core
    return _core.rank_slice(ns, tp_rank, tp_size, pp_rank, pp_size), \
        dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size)


def load(client, ns, tokens, kv_caches, block_table, *, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
    """Reads this rank's part of the cached prefix of tokens into the engine blocks of
    block_table; returns the number of tokens loaded (a multiple of ns.block_tokens)."""
    sl, rank = _rank(ns, tp_rank, tp_size, pp_rank, pp_size)
    caches, bs = _layers(ns, kv_caches, sl)
    n = _capacity(ns, tokens, block_table, bs)
    if n == 0:
        return 0
    torch = _torch()
    out = torch.empty(sl.shape(n), dtype=caches[0].dtype)
    cached, kv = client.get(ns, list(tokens)[:n], out, **rank)
    if cached == 0:
        return 0
    dev = caches[0].device
    idx = _slots(block_table, bs, cached, dev)
    kv = kv[:, :, :cached].to(dev, non_blocking=True)
    for layer, c in enumerate(caches):
        flat = c.view(2, -1, sl.heads, ns.head_dim)
        flat.index_copy_(1, idx, kv[layer])
    return cached


def save(client, ns, tokens, kv_caches, block_table, *, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
    """Stores this rank's part of the full namespace blocks of tokens held in the engine blocks
    of block_table; returns the number of tokens saved (a block serves gets once every rank's
    part of it is stored)."""
    sl, rank = _rank(ns, tp_rank, tp_size, pp_rank, pp_size)
    caches, bs = _layers(ns, kv_caches, sl)
    n = _capacity(ns, tokens, block_table, bs)
    if n == 0:
        return 0
    torch = _torch()
    idx = _slots(block_table, bs, n, caches[0].device)
    kv = torch.stack([c.view(2, -1, sl.heads, ns.head_dim).index_select(1, idx) for c in caches])
    stored = client.put(ns, list(tokens)[:n], kv.cpu() if kv.device.type != "cpu" else kv, **rank)
    return stored * ns.block_tokens
