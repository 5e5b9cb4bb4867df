"""KV tensors in and out: validation, byte views, allocation.

A KV tensor is a rank's slice (Slice) of the model's KV, shaped
[layers/pp, 2, n_tokens, kv_heads/tp, head_dim] ([layers/pp, n_tokens,
latent_dim] for the latent layout), a torch.Tensor (CPU or CUDA) or a
numpy.ndarray. Everything below works on a uint8 numpy view of its host
memory, so that a block is the slice [:, :, i*B:(i+1)*B] of it. Blocks are
stored [layer][kv_head][K|V][token][head_dim] (block.py): a put takes each
block's part in that order (views of the tensor when the rank holds one head
or the latent, else one copy per block) and a get copies each block once
into place.

A namespace with scales adds a float32 scales tensor per call, shaped
[n_blocks, *Slice.scales_shape]: block i's scales follow its KV bytes in
its payload.

numpy has no bfloat16 or fp8: for those namespaces a numpy array of the same
item size (uint16 for bfloat16, uint8 for fp8; or ml_dtypes' types) carries
the raw bits.
"""
import numpy as np

_NP = {"float32": ("float32",), "float16": ("float16",), "bfloat16": ("bfloat16", "uint16", "int16"),
       "fp8_e4m3": ("float8_e4m3fn", "uint8"), "fp8_e5m2": ("float8_e5m2", "uint8"), "int8": ("int8",)}


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def torch_dtype(ns):
    """The torch dtype of ns's elements; for fp8 on a torch without float8 types, uint8 (raw bits)."""
    torch = _torch()
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "fp8_e4m3": getattr(torch, "float8_e4m3fn", torch.uint8), "fp8_e5m2": getattr(torch, "float8_e5m2", torch.uint8),
            "int8": torch.int8}[ns.dtype]


def _torch_ok(ns, dt):
    torch = _torch()
    return dt == torch_dtype(ns) or (ns.dtype.startswith("fp8") and dt == torch.uint8)


def numpy_dtype(ns):
    name = _NP[ns.dtype][0]
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(_NP[ns.dtype][1])


def parts(ns):
    """Tensors cached per layer and token: 2 (K, V) or 1 (the latent)."""
    return 1 if ns.kv_layout == "latent" else 2


class Slice:
    """What one parallel rank holds of ns's blocks: part (a block.Part) and the shapes that go
    with it. A rank's tensor is [l1-l0, 2, n_tokens, h1-h0, head_dim] (split) or
    [l1-l0, n_tokens, latent_dim] (latent); its scales [n_blocks, *scales_shape]."""

    def __init__(self, ns, part, rank=None):
        from . import block
        self.ns, self.part = ns, block.Part(*part)
        self.layers = part[1] - part[0]
        self.heads = part[3] - part[2]
        self.whole = block.is_whole(ns, self.part)
        self.rank = rank  # (tp_rank, tp_size, pp_rank, pp_size), for messages
        self.part_bytes = block.part_len(ns, ns.block_tokens, self.part)
        self.scales_shape = ns.scales_shape(self.layers, self.heads)
        self.scale_count = 0 if self.scales_shape is None else int(np.prod(self.scales_shape))
        self.kv_bytes = self.part_bytes - 4 * self.scale_count

    def shape(self, n_tokens):
        return self.ns.block_shape(n_tokens, self.layers, self.heads)

    def row(self):
        """Bytes of one token of one head (split) or of the latent, in one layer."""
        ns = self.ns
        return (ns.latent_dim if ns.kv_layout == "latent" else ns.head_dim) * ns.dtype_size

    def u8_shape(self, n_tokens):
        if self.ns.kv_layout == "latent":
            return (self.layers, n_tokens, self.row())
        return (self.layers, 2, n_tokens, self.heads, self.row())

    def describe(self):
        if self.rank is None or self.whole:
            return ""
        tp, tps, pp, pps = self.rank
        return f" (tp_rank {tp} of {tps}, pp_rank {pp} of {pps}: {self.part})"


def whole(ns):
    from . import block
    return Slice(ns, block.whole_part(ns))


def tokens_of(ns, kv):
    """The tokens a KV tensor of ns holds."""
    return kv.shape[1] if ns.kv_layout == "latent" else kv.shape[2]


def check_scales(sl, scales, n_blocks, name="scales"):
    """A contiguous float32 numpy view [n_blocks, scale_count] of scales for slice sl, or ValueError."""
    ns = sl.ns
    if ns.scales == "none":
        if scales is not None:
            raise ValueError(f"{name}: namespace {ns.model!r} has no scales (scales='none')")
        return None
    want = (n_blocks,) + sl.scales_shape
    if scales is None:
        raise ValueError(f"{name}: namespace has {ns.scales} scales: give them, float32 shaped {list(want)}"
                         + sl.describe())
    if is_torch(scales):
        scales = scales.detach().cpu().numpy()
    a = np.asarray(scales)
    if tuple(a.shape) != want or a.dtype != np.float32:
        raise ValueError(f"{name}: shape {list(a.shape)} {a.dtype}, want float32 {list(want)}" + sl.describe())
    return np.ascontiguousarray(a).astype("<f4", copy=False).reshape(n_blocks, sl.scale_count)


def check_kv(sl, kv, n_tokens=None, name="kv"):
    """Raises ValueError unless kv is a contiguous KV tensor of slice sl (with n_tokens tokens
    when given)."""
    ns = sl.ns
    nt = "n_tokens" if n_tokens is None else n_tokens
    per = "" if sl.whole else " of this rank"
    want = f"[{sl.layers}, 2, {nt}, {sl.heads}, {ns.head_dim}]"
    what = f"layers{per}, K|V, tokens, kv_heads{per}, head_dim"
    if ns.kv_layout == "latent":
        want, what = f"[{sl.layers}, {nt}, {ns.latent_dim}]", f"layers{per}, tokens, latent_dim"
    if is_torch(kv):
        shape, dt = tuple(kv.shape), kv.dtype
        ok_dt = _torch_ok(ns, dt)
        contiguous = kv.is_contiguous()
        want_dt = str(torch_dtype(ns)) + (" or torch.uint8" if ns.dtype.startswith("fp8") else "")
    elif isinstance(kv, np.ndarray):
        shape, dt = kv.shape, kv.dtype
        ok_dt = dt.name in _NP[ns.dtype]
        contiguous = kv.flags.c_contiguous
        want_dt = " or ".join("numpy." + n for n in _NP[ns.dtype])
    else:
        raise ValueError(f"{name}: want a torch.Tensor or numpy.ndarray shaped {want}, got {type(kv).__name__}")
    dims = 3 if ns.kv_layout == "latent" else 5
    if len(shape) != dims or tuple(shape) != sl.shape(tokens_of(ns, kv)) or \
            (n_tokens is not None and tokens_of(ns, kv) != n_tokens):
        raise ValueError(f"{name}: shape {list(shape)}, want {want} ({what})" + sl.describe())
    if not ok_dt:
        raise ValueError(f"{name}: dtype {dt}, want {want_dt} for namespace dtype {ns.dtype}")
    if not contiguous:
        raise ValueError(f"{name}: must be contiguous (call .contiguous() / numpy.ascontiguousarray first)")


def host_u8(kv, sl):
    """A uint8 view of kv's host memory ([layers, 2, n, heads, head_dim bytes], latent
    [layers, n, latent bytes]), and for a CUDA tensor the pinned host copy it views (None
    otherwise)."""
    staged = None
    if is_torch(kv):
        torch = _torch()
        if kv.device.type != "cpu":
            staged = torch.empty(kv.shape, dtype=kv.dtype, pin_memory=torch.cuda.is_available())
            staged.copy_(kv)
            kv = staged
        a = kv.view(torch.uint8).numpy() if kv.numel() else np.empty((0,), np.uint8)
    else:
        a = kv.view(np.uint8)
    return a.reshape(sl.u8_shape(tokens_of(sl.ns, kv))), staged


def put_runs(sl, u8, i):
    """Block i's part payload KV bytes taken from u8 (host_u8 of a rank's tensor), in the stored
    order ([layer][head][K|V][token][head_dim]; latent [layer][token][latent]), as a list of
    byte runs: views of the tensor where the order lets them be (the latent layout, or one head
    per rank: one run per layer and K|V), else one copy of the block's slice."""
    B = sl.ns.block_tokens
    if sl.ns.kv_layout == "latent":
        return list(u8[:, i * B:(i + 1) * B].reshape(sl.layers, -1))
    v = u8[:, :, i * B:(i + 1) * B]
    if sl.heads == 1:
        return list(v.reshape(sl.layers * 2, -1))
    return [np.ascontiguousarray(v.transpose(0, 3, 1, 2, 4)).reshape(-1)]


def alloc(sl, n_tokens, array, device=None):
    """A new KV tensor of slice sl for n_tokens tokens: torch (on device) or numpy."""
    ns = sl.ns
    if array == "numpy":
        return np.empty(sl.shape(n_tokens), numpy_dtype(ns))
    torch = _torch()
    return torch.empty(sl.shape(n_tokens), dtype=torch_dtype(ns), device=device or "cpu")


class Dest:
    """Where a get lands: out (caller's or new, a rank's slice) viewed as host bytes; a CUDA out is
    filled through a pinned host tensor and copied once at the end. Every block is copied once
    into place, from a part record or a whole block."""

    def __init__(self, sl, out):
        ns = sl.ns
        self.sl, self.out = sl, out
        self.cuda = is_torch(out) and out.device.type != "cpu"
        if self.cuda:
            torch = _torch()
            self.host = torch.empty(out.shape, dtype=out.dtype, pin_memory=torch.cuda.is_available())
        else:
            self.host = out
        self.u8 = host_u8(self.host, sl)[0] if tokens_of(ns, out) else None
        self.B = ns.block_tokens
        # The stored order of a part's KV bytes, and the permutation that takes it to the
        # tensor's: [layer][head][K|V][token][dim] -> [layer][K|V][token][head][dim].
        if ns.kv_layout == "latent":
            self._order, self._perm = (sl.layers, self.B, -1), None
        else:
            self._order = (sl.layers, sl.heads, 2, self.B, -1)
            self._perm = (0, 2, 3, 1, 4) if sl.heads > 1 else None
        # Block i's scales land in scales[i] (float32 [n_blocks, scale_count]).
        nb = tokens_of(ns, out) // ns.block_tokens
        self.scales = np.zeros((nb, sl.scale_count), "<f4") if ns.scales != "none" else None

    def _block(self, i):
        B = self.B
        if self.sl.ns.kv_layout == "latent":
            return self.u8[:, i * B:(i + 1) * B]
        return self.u8[:, :, i * B:(i + 1) * B]

    def segments(self, i):
        """Block i's place in the destination as the part payload's runs, in payload order, when
        the order lets a read land there directly (the latent layout, or one head per rank): one
        writable byte view per layer (and K|V), then the scales. None otherwise."""
        sl = self.sl
        if sl.ns.kv_layout != "latent" and sl.heads != 1:
            return None
        v = self._block(i)
        rows = v.shape[0] * (1 if sl.ns.kv_layout == "latent" else 2)
        segs = [memoryview(r) for r in v.reshape(rows, -1)]  # views: each run is contiguous in out
        if self.scales is not None:
            segs.append(memoryview(self.scales[i].view(np.uint8)))
        return segs

    def put_part(self, i, payload):
        """Copies block i's part payload (bytes-like or a uint8 array: the rank's part, in the
        stored order) into place: the one copy of a get."""
        sl = self.sl
        b = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, np.uint8)
        kv = b[:sl.kv_bytes].reshape(self._order)
        if self._perm is None:  # the latent, or one head: the orders agree
            self._block(i)[...] = kv.reshape(self._block(i).shape)
        else:
            self._block(i)[...] = kv.transpose(self._perm)
        if self.scales is not None:
            self.scales[i] = b[sl.kv_bytes:sl.part_bytes].view("<f4")

    def put_whole(self, i, payload):
        """Copies this rank's part of block i from the whole block's payload into place."""
        sl, ns, p = self.sl, self.sl.ns, self.sl.part
        b = np.frombuffer(payload, np.uint8) if not isinstance(payload, np.ndarray) else payload
        kv = b[:ns.kv_bytes]
        if ns.kv_layout == "latent":
            self._block(i)[...] = kv.reshape(ns.layers, self.B, -1)[p.l0:p.l1]
        else:
            self._block(i)[...] = kv.reshape(ns.layers, ns.kv_heads, 2, self.B, -1)[p.l0:p.l1, p.h0:p.h1] \
                .transpose(0, 2, 3, 1, 4)
        if self.scales is not None:
            sc = b[ns.kv_bytes:ns.block_bytes].view("<f4")
            if ns.scales == "head":
                sc = sc.reshape(ns.layers, ns.kv_heads, 2)[p.l0:p.l1, p.h0:p.h1]
            else:
                sc = sc.reshape(ns.layers, -1)[p.l0:p.l1]
            self.scales[i] = sc.reshape(-1)

    def finish(self, n_tokens):
        if self.cuda and n_tokens:
            if self.host.dim() == 3:
                self.out[:, :n_tokens].copy_(self.host[:, :n_tokens])
            else:
                self.out[:, :, :n_tokens].copy_(self.host[:, :, :n_tokens])
        return self.out
