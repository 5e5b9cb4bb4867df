"""KV tensors in and out: validation, byte views, allocation.

A KV tensor is shaped [layers, 2, n_tokens, kv_heads, head_dim] (the block
payload layout) and is a torch.Tensor (CPU or CUDA) or a numpy.ndarray.
Everything below works on a uint8 numpy view [layers, 2, n_tokens, row]
(row = kv_heads x head_dim x dtype size) of host memory, so that a block is
the slice [:, :, i*B:(i+1)*B] of it.

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


def check_kv(ns, kv, n_tokens=None, name="kv"):
    """Raises ValueError unless kv is a contiguous KV tensor of ns (with n_tokens tokens when given)."""
    want = f"[{ns.layers}, 2, {'n_tokens' if n_tokens is None else n_tokens}, {ns.kv_heads}, {ns.head_dim}]"
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
    if len(shape) != 5 or shape[0] != ns.layers or shape[1] != 2 or shape[3] != ns.kv_heads or shape[4] != ns.head_dim \
            or (n_tokens is not None and shape[2] != n_tokens):
        raise ValueError(f"{name}: shape {list(shape)}, want {want} (layers, K|V, tokens, kv_heads, head_dim)")
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
    return a.reshape(ns.layers, 2, -1, ns.kv_heads * ns.head_dim * ns.dtype_size), staged


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
        self.u8 = host_u8(self.host, ns)[0] if out.shape[2] else None
        self.B = ns.block_tokens
        self.shape = (ns.layers, 2, ns.block_tokens, -1)

    def segments(self, i):
        """Block i's place in the destination as the payload's runs, in payload order: one
        writable byte view per (layer, K|V), each block_tokens rows long."""
        u8 = self.u8
        L2, N, row = u8.shape[0] * u8.shape[1], u8.shape[2], u8.shape[3]
        flat = u8.reshape(-1)
        run = self.B * row
        return [memoryview(flat[s * N * row + i * run: s * N * row + (i + 1) * run]) for s in range(L2)]

    def copy_from(self, i, src):
        """Copies block i's payload from src, a uint8 numpy array of it (a view of the
        shared region): one strided numpy copy, which beats a memmove per run."""
        self.u8[:, :, i * self.B:(i + 1) * self.B, :] = src.reshape(self.shape)

    def put_block(self, i, payload):
        """Copies block i's payload (bytes-like) into place: the one copy of a get."""
        self.u8[:, :, i * self.B:(i + 1) * self.B, :] = np.frombuffer(payload, np.uint8).reshape(self.shape)

    def finish(self, n_tokens):
        if self.cuda and n_tokens:
            self.out[:, :, :n_tokens].copy_(self.host[:, :, :n_tokens])
        return self.out
