"""Namespaces and block keys, bit-identical to Go's prefixhash.

Key format 2 (prefixhash.KeyVersion 2):

    encoding = str("kvmesh/ns/v2") ‖ str(model) ‖ u8 dtype ‖ u32 block_tokens ‖
               u32 layer_start ‖ u32 layer_end ‖ u32 kv_heads ‖ u32 head_dim ‖
               u32 tp_rank ‖ u32 max(tp_size, 1) ‖ str(tenant_salt)
               (little-endian; str = u32 byte length ‖ UTF-8 bytes)
    k_0    = SHA-256(encoding)[:16]
    k_i    = SHA-256(k_{i-1} ‖ tokens of block i as little-endian uint32)[:16]
    digest = uint64 little-endian of SHA-256(encoding)[:8]

prefixhash/testdata/golden.json pins them; the tests check every vector.
Key format 1 (two seeded xxhash64 digests, forgeable) is not spoken: a client
asks its node once which format it keys by and refuses to work with another.
"""
import array
import hashlib
import struct
import sys


KEY_VERSION = 2
KEY_SIZE = 16

DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8")
DTYPE_IDS = {name: i + 1 for i, name in enumerate(DTYPES)}
DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
_ALIASES = {"float": "float32", "half": "float16", "float8_e4m3fn": "fp8_e4m3", "float8_e4m3": "fp8_e4m3",
            "float8_e5m2": "fp8_e5m2", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

MAX_MODEL_LEN = 256
MAX_SALT_LEN = 256
MAX_BLOCK_TOKENS = 1 << 16


def dtype_name(dtype):
    """The canonical kvmesh name of a dtype given as a string, torch or numpy dtype."""
    if isinstance(dtype, str):
        s = dtype.lower()
    else:
        s = str(dtype)
        if s.startswith("torch."):
            s = s[len("torch."):]
        else:
            try:
                import numpy as np
                s = np.dtype(dtype).name
            except Exception:
                pass
    s = _ALIASES.get(s, s)
    if s not in DTYPE_IDS:
        raise ValueError(f"dtype {dtype!r}: want one of {', '.join(DTYPES)} (or the torch/numpy dtype)")
    return s


class Namespace:
    """The producer of KV blocks: blocks are interchangeable only within one.

    ``layers`` is the half-open range (start, end) of layers a block holds, or
    an int n for (0, n). ``tenant_salt`` separates tenants; a client of a node
    with tenants gets its tenant's salt applied for it.
    """

    __slots__ = ("model", "dtype", "block_tokens", "layer_start", "layer_end", "kv_heads", "head_dim",
                 "tp_rank", "tp_size", "tenant_salt", "_enc")

    def __init__(self, model, dtype, block_tokens, layers, kv_heads, head_dim, tp_rank=0, tp_size=1,
                 tenant_salt=b""):
        if isinstance(layers, int):
            layers = (0, layers)
        try:
            start, end = layers
        except (TypeError, ValueError):
            raise ValueError(f"layers {layers!r}: want (start, end) or a layer count") from None
        if isinstance(tenant_salt, (bytes, bytearray)):
            try:
                tenant_salt = bytes(tenant_salt).decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("tenant_salt: must be UTF-8") from None
        self.model = model
        self.dtype = dtype_name(dtype)
        self.block_tokens = block_tokens
        self.layer_start, self.layer_end = start, end
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.tenant_salt = tenant_salt
        self._validate()
        self._enc = {}

    def _validate(self):
        def bad(field, msg):
            raise ValueError(f"namespace {field}: {msg}")
        for f in ("block_tokens", "layer_start", "layer_end", "kv_heads", "head_dim", "tp_rank", "tp_size"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(f, f"{v!r} is not an int")
        if not isinstance(self.model, str) or not self.model:
            bad("model", "must be a non-empty string")
        if len(self.model.encode()) > MAX_MODEL_LEN:
            bad("model", f"longer than {MAX_MODEL_LEN} bytes")
        if not 1 <= self.block_tokens <= MAX_BLOCK_TOKENS:
            bad("block_tokens", f"{self.block_tokens} is outside 1..{MAX_BLOCK_TOKENS}")
        if self.layer_start < 0 or self.layer_end <= self.layer_start or self.layer_end >= 1 << 32:
            bad("layers", f"range [{self.layer_start},{self.layer_end}) is empty or negative")
        if not 1 <= self.kv_heads < 1 << 32:
            bad("kv_heads", f"{self.kv_heads} must be at least 1")
        if not 1 <= self.head_dim < 1 << 32:
            bad("head_dim", f"{self.head_dim} must be at least 1")
        if self.tp_size < 0 or self.tp_rank < 0 or self.tp_rank >= max(self.tp_size, 1) or self.tp_size >= 1 << 32:
            bad("tp", f"rank {self.tp_rank} of size {self.tp_size}")
        if not isinstance(self.tenant_salt, str) or len(self.tenant_salt.encode()) > MAX_SALT_LEN:
            bad("tenant_salt", f"must be a string of at most {MAX_SALT_LEN} bytes")

    @property
    def layers(self):
        return self.layer_end - self.layer_start

    @property
    def dtype_size(self):
        return DTYPE_SIZES[self.dtype]

    @property
    def block_bytes(self):
        """Payload bytes of one block: layers x 2 x block_tokens x kv_heads x head_dim x dtype size."""
        return self.layers * 2 * self.block_tokens * self.kv_heads * self.head_dim * self.dtype_size

    def block_shape(self, n_tokens=None):
        """[layers, 2, n_tokens, kv_heads, head_dim] (n_tokens defaults to block_tokens)."""
        return (self.layers, 2, self.block_tokens if n_tokens is None else n_tokens, self.kv_heads, self.head_dim)

    def _fields(self):
        return (self.model, self.dtype, self.block_tokens, self.layer_start, self.layer_end, self.kv_heads,
                self.head_dim, self.tp_rank, max(self.tp_size, 1), self.tenant_salt)

    def __eq__(self, other):
        return isinstance(other, Namespace) and self._fields() == other._fields()

    def __hash__(self):
        return hash(self._fields())

    def __repr__(self):
        return (f"Namespace({self.model!r}, {self.dtype!r}, {self.block_tokens}, layers=({self.layer_start}, "
                f"{self.layer_end}), kv_heads={self.kv_heads}, head_dim={self.head_dim}, tp_rank={self.tp_rank}, "
                f"tp_size={self.tp_size}{', salted' if self.tenant_salt else ''})")

    def salted(self, tenant_salt):
        """This namespace as a node with tenants keys it for a tenant whose salt is tenant_salt
        (auth.SaltedWith: salt + ":" + own salt, unless own already starts with it)."""
        own = self.tenant_salt
        if not tenant_salt or own.startswith(tenant_salt + ":"):
            return self
        return Namespace(self.model, self.dtype, self.block_tokens, (self.layer_start, self.layer_end),
                         self.kv_heads, self.head_dim, self.tp_rank, self.tp_size, tenant_salt + ":" + own)

    def encoding(self, key_version=KEY_VERSION):
        """The canonical encoding that roots every key chain."""
        e = self._enc.get(key_version)
        if e is None:
            def s(x):
                b = x.encode("utf-8")
                return struct.pack("<I", len(b)) + b
            e = (s(f"kvmesh/ns/v{key_version}") + s(self.model) + bytes([DTYPE_IDS[self.dtype]]) +
                 struct.pack("<7I", self.block_tokens, self.layer_start, self.layer_end, self.kv_heads,
                             self.head_dim, self.tp_rank, max(self.tp_size, 1)) + s(self.tenant_salt))
            self._enc[key_version] = e
        return e

    def root(self, key_version=KEY_VERSION):
        """k_0 as 16 bytes."""
        r = self._enc.get(("root", key_version))
        if r is None:
            r = self._enc[("root", key_version)] = _ALGOS[key_version].root(self.encoding(key_version))
        return r

    def digest(self, key_version=KEY_VERSION):
        """The 64-bit namespace digest that block headers carry."""
        d = self._enc.get(("digest", key_version))
        if d is None:
            d = self._enc[("digest", key_version)] = _ALGOS[key_version].digest(self.encoding(key_version))
        return d

    def to_proto(self):
        from .v1 import types_pb2
        return types_pb2.Namespace(model=self.model, dtype=DTYPE_IDS[self.dtype], block_tokens=self.block_tokens,
                                   layer_start=self.layer_start, layer_end=self.layer_end, kv_heads=self.kv_heads,
                                   head_dim=self.head_dim, tp_rank=self.tp_rank, tp_size=self.tp_size,
                                   tenant_salt=self.tenant_salt)


def token_bytes(tokens):
    """tokens (a sequence of ints, numpy array or torch tensor) as little-endian uint32 bytes.
    bytes pass through: they are taken to be that encoding already."""
    if isinstance(tokens, bytes):
        if len(tokens) % 4:
            raise ValueError("tokens: encoded token bytes must be a multiple of 4 long")
        return tokens
    if isinstance(tokens, (list, tuple)) and sys.byteorder == "little" and array.array("I").itemsize == 4:
        # The common case, a list of ints: array.array packs it in a fraction of
        # numpy's time and refuses what is not a uint32 (negative, too big, not an int).
        try:
            return array.array("I", tokens).tobytes()
        except (OverflowError, TypeError):
            raise ValueError("tokens: ids must be ints in 0..2^32-1") from None
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        if hasattr(tokens, "detach"):  # torch
            tokens = tokens.detach().cpu().numpy()
        a = np.asarray(tokens)
        if a.ndim != 1:
            raise ValueError(f"tokens: want a 1-d sequence of token ids, got shape {a.shape}")
        if a.size == 0:
            return b""
        if a.dtype.kind not in "iu":
            if a.dtype == object:
                a = np.array([int(t) for t in a], dtype=np.int64) if a.size else a
            else:
                raise ValueError(f"tokens: want integer token ids, got {a.dtype}")
        if a.dtype != np.dtype("<u4"):
            if a.min() < 0 or a.max() > 0xFFFFFFFF:
                raise ValueError("tokens: ids must be in 0..2^32-1")
            a = a.astype("<u4")
        return a.tobytes()
    try:
        return struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error:
        raise ValueError("tokens: ids must be ints in 0..2^32-1") from None


class _SHA256:
    @staticmethod
    def root(enc):
        return hashlib.sha256(enc).digest()[:KEY_SIZE]

    @staticmethod
    def digest(enc):
        return int.from_bytes(hashlib.sha256(enc).digest()[:8], "little")

    @staticmethod
    def chain(parent, tb, step):
        # The chain is sequential; what costs here is Python's per-block
        # overhead (about 0.5 us), not SHA-256 (80 bytes per block).
        out = []
        sha = hashlib.sha256
        app = out.append
        for off in range(0, len(tb) - step + 1, step):
            parent = sha(parent + tb[off:off + step]).digest()[:KEY_SIZE]
            app(parent)
        return out


_ALGOS = {2: _SHA256}


def key_bytes(ns, tokens, key_version=KEY_VERSION, parent=None):
    """The keys (16 bytes each) of every full block of tokens under ns, chained from
    parent (default: the namespace root)."""
    tb = token_bytes(tokens)
    if parent is None:
        parent = ns.root(key_version)
    return _ALGOS[key_version].chain(parent, tb, 4 * ns.block_tokens)


def keys(ns, tokens):
    """The chained block keys of every full block of tokens, as the 32-hex-digit strings
    that `kvmesh inspect lookup` prints (a tail shorter than a block has none)."""
    if not isinstance(ns, Namespace):
        raise TypeError(f"ns: want a kvmesh.Namespace, got {type(ns).__name__}")
    if isinstance(tokens, (bytes, bytearray, str)):
        raise ValueError("tokens: want a sequence of int token ids (not bytes or str)")
    return [k.hex() for k in key_bytes(ns, tokens)]


assert sys.byteorder in ("little", "big")
