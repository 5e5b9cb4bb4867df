"""KV tensors in and out: validation, byte views, allocation.

A KV tensor is shaped [layers, 2, n_tokens, kv_heads, head_dim] (the block
payload layout; [layers, n_tokens, latent_dim] for the latent layout) and is
a torch.Tensor (CPU or CUDA) or a numpy.ndarray. Everything below works on a
uint8 numpy view [layers, parts, n_tokens, row] (parts 2, row = kv_heads x
head_dim x dtype size; latent: parts 1, row = latent_dim x dtype size) of
host memory, so that a block is the slice [:, :, i*B:(i+1)*B] of it.

A namespace with scales adds a float32 scales tensor per call, shaped
[n_blocks, *ns.scales_shape()]: block i's scales follow its KV bytes in
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


def row_bytes(ns):
    """Bytes of one token's part in one layer."""
    if ns.kv_layout == "latent":
        return ns.latent_dim * ns.dtype_size
    return ns.kv_heads * ns.head_dim * ns.dtype_size


def _shape_ok(ns, shape, n_tokens):
    if ns.kv_layout == "latent":
        return len(shape) == 3 and shape[0] == ns.layers and shape[2] == ns.latent_dim and \
            (n_tokens is None or shape[1] == n_tokens)
    return len(shape) == 5 and shape[0] == ns.layers and shape[1] == 2 and shape[3] == ns.kv_heads and \
        shape[4] == ns.head_dim and (n_tokens is None or shape[2] == n_tokens)


def tokens_of(ns, kv):
    """The tokens a KV tensor of ns holds."""
    return kv.shape[1] if ns.kv_layout == "latent" else kv.shape[2]


def check_scales(ns, scales, n_blocks, name="scales"):
    """A contiguous float32 numpy view [n_blocks, scale_count] of scales, or ValueError."""
    if ns.scales == "none":
        if scales is not None:
            raise ValueError(f"{name}: namespace {ns.model!r} has no scales (scales='none')")
        return None
    want = (n_blocks,) + ns.scales_shape()
    if scales is None:
        raise ValueError(f"{name}: namespace has {ns.scales} scales: give them, float32 shaped {list(want)}")
    if is_torch(scales):
        scales = scales.detach().cpu().numpy()
    a = np.asarray(scales)
    if tuple(a.shape) != want or a.dtype != np.float32:
        raise ValueError(f"{name}: shape {list(a.shape)} {a.dtype}, want float32 {list(want)}")
    return np.ascontiguousarray(a).astype("<f4", copy=False).reshape(n_blocks, ns.scale_count)


def check_kv(ns, kv, n_tokens=None, name="kv"):
    """Raises ValueError unless kv is a contiguous KV tensor of ns (with n_tokens tokens when given)."""
    nt = 'n_tokens' if n_tokens is None else n_tokens
    want = f"[{ns.layers}, 2, {nt}, {ns.kv_heads}, {ns.head_dim}]"
    what = "layers, K|V, tokens, kv_heads, head_dim"
    if ns.kv_layout == "latent":
        want, what = f"[{ns.layers}, {nt}, {ns.latent_dim}]", "layers, tokens, latent_dim"
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
    if not _shape_ok(ns, shape, n_tokens):
        raise ValueError(f"{name}: shape {list(shape)}, want {want} ({what})")
    if not ok_dt:
        raise ValueError(f"{name}: dtype {dt}, want {want_dt} for namespace dtype {ns.dtype}")
    if not contiguous:
        raise ValueError(f"{name}: must be contiguous (call .contiguous() / numpy.ascontiguousarray first)")


def host_u8(kv, ns):
    """A uint8 view [layers, 2, n, row] of kv's host memory, and for a CUDA tensor the pinned
    host copy it views (None otherwise)."""
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
    return a.reshape(ns.layers, parts(ns), -1, row_bytes(ns)), staged


def alloc(ns, n_tokens, array, device=None):
    """A new KV tensor of ns for n_tokens tokens: torch (on device) or numpy."""
    if array == "numpy":
        return np.empty(ns.block_shape(n_tokens), numpy_dtype(ns))
    torch = _torch()
    return torch.empty(ns.block_shape(n_tokens), dtype=torch_dtype(ns), device=device or "cpu")


class Dest:
    """Where a get lands: out (caller's or new) viewed as host bytes; a CUDA out is filled
    through a pinned host tensor and copied once at the end."""

    def __init__(self, ns, out):
        self.out = out
        self.cuda = is_torch(out) and out.device.type != "cpu"
        if self.cuda:
            torch = _torch()
            self.host = torch.empty(out.shape, dtype=out.dtype, pin_memory=torch.cuda.is_available())
        else:
            self.host = out
        self.u8 = host_u8(self.host, ns)[0] if tokens_of(ns, out) else None
        self.B = ns.block_tokens
        self.kv_bytes = ns.kv_bytes
        self.shape = (ns.layers, parts(ns), ns.block_tokens, -1)
        # Block i's scales land in scales[i] (float32 [n_blocks, scale_count]).
        nb = tokens_of(ns, out) // ns.block_tokens
        self.scales = np.zeros((nb, ns.scale_count), "<f4") if ns.scales != "none" else None

    def segments(self, i):
        """Block i's place in the destination as the payload's runs, in payload order: one
        writable byte view per (layer, K|V), each block_tokens rows long."""
        u8 = self.u8
        L2, N, row = u8.shape[0] * u8.shape[1], u8.shape[2], u8.shape[3]
        flat = u8.reshape(-1)
        run = self.B * row
        segs = [memoryview(flat[s * N * row + i * run: s * N * row + (i + 1) * run]) for s in range(L2)]
        if self.scales is not None:
            segs.append(memoryview(self.scales[i].view(np.uint8)))
        return segs

    def copy_from(self, i, src):
        """Copies block i's payload from src, a uint8 numpy array of it (a view of the
        shared region): one strided numpy copy, which beats a memmove per run."""
        self.u8[:, :, i * self.B:(i + 1) * self.B, :] = src[:self.kv_bytes].reshape(self.shape)
        if self.scales is not None:
            self.scales[i] = src[self.kv_bytes:].view("<f4")

    def put_block(self, i, payload):
        """Copies block i's payload (bytes-like) into place: the one copy of a get."""
        b = np.frombuffer(payload, np.uint8)
        self.u8[:, :, i * self.B:(i + 1) * self.B, :] = b[:self.kv_bytes].reshape(self.shape)
        if self.scales is not None:
            self.scales[i] = b[self.kv_bytes:].view("<f4")

    def finish(self, n_tokens):
        if self.cuda and n_tokens:
            if self.host.dim() == 3:
                self.out[:, :n_tokens].copy_(self.host[:, :n_tokens])
            else:
                self.out[:, :, :n_tokens].copy_(self.host[:, :, :n_tokens])
        return self.out
