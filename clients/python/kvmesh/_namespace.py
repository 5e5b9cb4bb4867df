"""Namespaces and block keys, bit-identical to Go's prefixhash.

Key format 3 (prefixhash.KeyVersion 3):

    encoding = str("kvmesh/ns/v3") ‖ str(model) ‖ u8 dtype ‖ u32 block_tokens ‖
               u32 layers ‖ u32 kv_heads ‖ u32 head_dim ‖ str(tenant_salt)
               (little-endian; str = u32 byte length ‖ UTF-8 bytes)

A key names the whole model's KV of its tokens (every layer, every KV head):
the parallel layout (tensor- and pipeline-parallel rank and size) is not part
of it but of each put and get (block.rank_part). Key format 2 had the layer
range and the TP rank and size in the encoding; its keys simply miss.
    k_0    = SHA-256(encoding)[:16]
    k_i    = SHA-256(k_{i-1} ‖ tokens of block i as little-endian uint32)[:16]
    digest = uint64 little-endian of SHA-256(encoding)[:8]

Optional fields follow the tenant salt, each only when set, in this order:
u8 1 ‖ u8 kv_layout ‖ u32 latent_dim; u8 2 ‖ str(lora); u8 3 ‖ u8 scales;
u8 4 ‖ u8 key_scheme ‖ str(hash_seed). A block with extra keys appends
u32 count ‖ (u32 len ‖ bytes)* to its message. Under key_scheme "vllm" keys
are vLLM's block hashes (SHA-256 over canonical CBOR, rooted in its
PYTHONHASHSEED; prefixhash/vllm.go), truncated to 16 bytes.

prefixhash/testdata/golden.json pins them; the tests check every vector.
Key format 1 (two seeded xxhash64 digests, forgeable) is not spoken: a client
asks its node once which format it keys by and refuses to work with another.
"""
import array
import hashlib
import struct
import sys


KEY_VERSION = 3
KEY_SIZE = 16

DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8")
DTYPE_IDS = {name: i + 1 for i, name in enumerate(DTYPES)}
DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
_ALIASES = {"float": "float32", "half": "float16", "float8_e4m3fn": "fp8_e4m3", "float8_e4m3": "fp8_e4m3",
            "float8_e5m2": "fp8_e5m2", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

MAX_MODEL_LEN = 256
MAX_SALT_LEN = 256
MAX_BLOCK_TOKENS = 1 << 16
MAX_LORA_LEN = 256
MAX_SEED_LEN = 256
MAX_EXTRA_KEYS = 64
MAX_EXTRA_BYTES = 4096
MAX_EXTRA_ROOM = MAX_EXTRA_BYTES + 4 * MAX_EXTRA_KEYS
MAX_LAYERS = 1 << 20

KV_LAYOUTS = ("split", "latent")
SCALES = ("none", "block", "head")
KEY_SCHEMES = ("kvmesh", "vllm")


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

    A namespace describes the whole model's KV: ``layers`` is the model's
    number of attention layers (all of them), ``kv_heads`` its number of KV
    heads (all of them). Which part of a block a tensor- or pipeline-parallel
    rank holds is not the namespace's business: put and get take
    ``tp_rank``, ``tp_size``, ``pp_rank``, ``pp_size`` per call, so ranks of
    any parallel layout share the same blocks. ``tenant_salt`` separates
    tenants; a client of a node with tenants gets its tenant's salt applied
    for it.

    ``kv_layout`` is "split" (a K and a V per KV head: kv_heads, head_dim) or
    "latent" (multi-head latent attention: one vector of ``latent_dim`` per
    token and layer, 576 for DeepSeek-V3/Kimi; kv_heads and head_dim 0).
    ``scales`` ("none", "block", "head") says whether fp8/int8 payloads end
    with float32 scales. ``lora`` names a LoRA adapter. ``key_scheme`` "vllm"
    keys blocks by vLLM's block hash, rooted in ``hash_seed`` (vLLM's
    PYTHONHASHSEED). ``extra_key_bytes`` is the header room every block reserves for its extra
    keys (4 bytes plus each key's length); 0 means blocks carry none.
    """

    __slots__ = ("model", "dtype", "block_tokens", "layers", "kv_heads", "head_dim", "tenant_salt", "kv_layout",
                 "latent_dim", "scales", "lora", "key_scheme", "hash_seed", "extra_key_bytes", "_enc")

    def __init__(self, model, dtype, block_tokens, layers, kv_heads=0, head_dim=0, tenant_salt=b"", *,
                 kv_layout="split", latent_dim=0, scales="none", lora="", key_scheme="kvmesh", hash_seed="",
                 extra_key_bytes=0, **moved):
        for k in moved:
            if k in ("tp_rank", "tp_size"):
                raise TypeError(f"Namespace: {k} is no longer part of the namespace (key format 3): pass tp_rank, "
                                "tp_size, pp_rank, pp_size to put/get (the namespace names the whole model's KV)")
            raise TypeError(f"Namespace: unexpected keyword argument {k!r}")
        if isinstance(layers, (tuple, list)):
            raise ValueError(f"namespace layers: {tuple(layers)!r} is a layer range; since key format 3 layers is "
                             "the model's layer count (an int) and a pipeline stage passes pp_rank, pp_size to "
                             "put/get")
        if isinstance(tenant_salt, (bytes, bytearray)):
            try:
                tenant_salt = bytes(tenant_salt).decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("tenant_salt: must be UTF-8") from None
        self.model = model
        self.dtype = dtype_name(dtype)
        self.block_tokens = block_tokens
        self.layers = layers
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.tenant_salt = tenant_salt
        self.kv_layout, self.latent_dim, self.scales = kv_layout, latent_dim, scales
        self.lora, self.key_scheme, self.hash_seed = lora, key_scheme, hash_seed
        self.extra_key_bytes = extra_key_bytes
        self._validate()
        self._enc = {}

    def _validate(self):
        def bad(field, msg):
            raise ValueError(f"namespace {field}: {msg}")
        for f in ("block_tokens", "layers", "kv_heads", "head_dim", "latent_dim", "extra_key_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(f, f"{v!r} is not an int")
        if not isinstance(self.model, str) or not self.model:
            bad("model", "must be a non-empty string")
        if len(self.model.encode()) > MAX_MODEL_LEN:
            bad("model", f"longer than {MAX_MODEL_LEN} bytes")
        if not 1 <= self.block_tokens <= MAX_BLOCK_TOKENS:
            bad("block_tokens", f"{self.block_tokens} is outside 1..{MAX_BLOCK_TOKENS}")
        if not 1 <= self.layers <= MAX_LAYERS:
            bad("layers", f"{self.layers} is outside 1..{MAX_LAYERS} (the model's number of layers)")
        if self.kv_layout not in KV_LAYOUTS:
            bad("kv_layout", f"{self.kv_layout!r}: want one of {', '.join(KV_LAYOUTS)}")
        if self.kv_layout == "split":
            if not 1 <= self.kv_heads <= 1 << 20:
                bad("kv_heads", f"{self.kv_heads} must be at least 1 (the model's KV heads)")
            if not 1 <= self.head_dim <= 1 << 20:
                bad("head_dim", f"{self.head_dim} must be at least 1")
            if self.latent_dim != 0:
                bad("latent_dim", f"{self.latent_dim} set with the split layout")
        else:
            if not 1 <= self.latent_dim <= 1 << 20:
                bad("latent_dim", f"{self.latent_dim} must be at least 1 with the latent layout")
            if self.kv_heads or self.head_dim:
                bad("kv_heads", "kv_heads and head_dim must be 0 with the latent layout")
        if self.scales not in SCALES:
            bad("scales", f"{self.scales!r}: want one of {', '.join(SCALES)}")
        if self.scales != "none" and DTYPE_SIZES[self.dtype] != 1:
            bad("scales", f"{self.dtype} payloads carry no scales (only fp8 and int8 do)")
        if self.scales == "head" and self.kv_layout == "latent":
            bad("scales", "per-head scales with the latent layout, which has no heads")
        if not isinstance(self.lora, str) or len(self.lora.encode()) > MAX_LORA_LEN:
            bad("lora", f"must be a string of at most {MAX_LORA_LEN} bytes")
        if self.key_scheme not in KEY_SCHEMES:
            bad("key_scheme", f"{self.key_scheme!r}: want one of {', '.join(KEY_SCHEMES)}")
        if not isinstance(self.hash_seed, str) or len(self.hash_seed.encode()) > MAX_SEED_LEN:
            bad("hash_seed", f"must be a string of at most {MAX_SEED_LEN} bytes")
        if self.key_scheme == "vllm" and not self.hash_seed:
            bad("hash_seed", "the vllm key scheme needs vLLM's PYTHONHASHSEED")
        if self.key_scheme != "vllm" and self.hash_seed:
            bad("hash_seed", f"set with the {self.key_scheme} key scheme, which has no seed")
        if not 0 <= self.extra_key_bytes <= MAX_EXTRA_ROOM:
            bad("extra_key_bytes", f"{self.extra_key_bytes} is outside 0..{MAX_EXTRA_ROOM}")
        if not isinstance(self.tenant_salt, str) or len(self.tenant_salt.encode()) > MAX_SALT_LEN:
            bad("tenant_salt", f"must be a string of at most {MAX_SALT_LEN} bytes")

    @property
    def dtype_size(self):
        return DTYPE_SIZES[self.dtype]

    @property
    def heads(self):
        """The head cells of a block: kv_heads, or 1 for the latent layout (one latent per layer)."""
        return 1 if self.kv_layout == "latent" else self.kv_heads

    @property
    def kv_bytes(self):
        """KV bytes of one whole block: layers x kv_heads x 2 x block_tokens x head_dim x dtype size
        (split), layers x block_tokens x latent_dim x dtype size (latent)."""
        if self.kv_layout == "latent":
            return self.layers * self.block_tokens * self.latent_dim * self.dtype_size
        return self.layers * 2 * self.block_tokens * self.kv_heads * self.head_dim * self.dtype_size

    @property
    def scale_count(self):
        """float32 scales after a whole block's KV bytes: [layer][K|V] per block ([layer] latent),
        [layer][kv_head][K|V] per head, none without."""
        parts = 1 if self.kv_layout == "latent" else 2
        return {"none": 0, "block": self.layers * parts, "head": self.layers * parts * self.kv_heads}[self.scales]

    @property
    def block_bytes(self):
        """Payload bytes of one whole block: its KV bytes, then 4 per scale."""
        return self.kv_bytes + 4 * self.scale_count

    def scales_shape(self, layers=None, heads=None):
        """The shape of a block's scales (of a part of `layers` layers and `heads` KV heads; default
        the whole block's): (layers, 2) per block, (layers,) latent per block, (layers, kv_heads, 2)
        per head -- the order they follow the KV bytes in; None without scales."""
        if self.scales == "none":
            return None
        L = self.layers if layers is None else layers
        if self.kv_layout == "latent":
            return (L,)
        return (L, 2) if self.scales == "block" else (L, self.kv_heads if heads is None else heads, 2)

    def block_shape(self, n_tokens=None, layers=None, heads=None):
        """[layers, 2, n_tokens, kv_heads, head_dim], or [layers, n_tokens, latent_dim] for the
        latent layout (n_tokens defaults to block_tokens; layers and heads to the whole model's,
        a rank's slice passes its own)."""
        n = self.block_tokens if n_tokens is None else n_tokens
        L = self.layers if layers is None else layers
        if self.kv_layout == "latent":
            return (L, n, self.latent_dim)
        return (L, 2, n, self.kv_heads if heads is None else heads, self.head_dim)

    def _fields(self):
        return (self.model, self.dtype, self.block_tokens, self.layers, self.kv_heads, self.head_dim,
                self.tenant_salt, self.kv_layout, self.latent_dim, self.scales, self.lora, self.key_scheme,
                self.hash_seed, self.extra_key_bytes)

    def __eq__(self, other):
        return isinstance(other, Namespace) and self._fields() == other._fields()

    def __hash__(self):
        return hash(self._fields())

    def __repr__(self):
        return (f"Namespace({self.model!r}, {self.dtype!r}, {self.block_tokens}, layers={self.layers}, "
                f"kv_heads={self.kv_heads}, head_dim={self.head_dim}{', salted' if self.tenant_salt else ''}"
                + (f", kv_layout='latent', latent_dim={self.latent_dim}" if self.kv_layout == "latent" else "")
                + (f", scales={self.scales!r}" if self.scales != "none" else "")
                + (f", lora={self.lora!r}" if self.lora else "")
                + (f", key_scheme={self.key_scheme!r}" if self.key_scheme != "kvmesh" else "")
                + (f", extra_key_bytes={self.extra_key_bytes}" if self.extra_key_bytes else "") + ")")

    def salted(self, tenant_salt):
        """This namespace as a node with tenants keys it for a tenant whose salt is tenant_salt
        (auth.SaltedWith: salt + ":" + own salt, unless own already starts with it)."""
        own = self.tenant_salt
        if not tenant_salt or own.startswith(tenant_salt + ":"):
            return self
        return Namespace(self.model, self.dtype, self.block_tokens, self.layers, self.kv_heads, self.head_dim,
                         tenant_salt + ":" + own, kv_layout=self.kv_layout, latent_dim=self.latent_dim,
                         scales=self.scales, lora=self.lora, key_scheme=self.key_scheme, hash_seed=self.hash_seed,
                         extra_key_bytes=self.extra_key_bytes)

    def encoding(self, key_version=KEY_VERSION):
        """The canonical encoding that roots every key chain."""
        e = self._enc.get(key_version)
        if e is None:
            def s(x):
                b = x.encode("utf-8")
                return struct.pack("<I", len(b)) + b
            e = (s(f"kvmesh/ns/v{key_version}") + s(self.model) + bytes([DTYPE_IDS[self.dtype]]) +
                 struct.pack("<4I", self.block_tokens, self.layers, self.kv_heads, self.head_dim) +
                 s(self.tenant_salt))
            if self.kv_layout != "split" or self.latent_dim:
                e += bytes([1, KV_LAYOUTS.index(self.kv_layout)]) + struct.pack("<I", self.latent_dim)
            if self.lora:
                e += b"\x02" + s(self.lora)
            if self.scales != "none":
                e += bytes([3, SCALES.index(self.scales)])
            if self.key_scheme != "kvmesh" or self.hash_seed:
                e += bytes([4, KEY_SCHEMES.index(self.key_scheme)]) + s(self.hash_seed)
            if self.extra_key_bytes:
                e += b"\x05" + struct.pack("<I", self.extra_key_bytes)
            self._enc[key_version] = e
        return e

    def root(self, key_version=KEY_VERSION):
        """k_0 as 16 bytes."""
        return self.root_link(key_version)[:KEY_SIZE]

    def root_link(self, key_version=KEY_VERSION):
        """What block 0 is chained from: k_0 (16 bytes), or under the vllm scheme vLLM's
        NONE_HASH = SHA-256(CBOR(hash_seed)) (32 bytes)."""
        r = self._enc.get(("root", key_version))
        if r is None:
            if self.key_scheme == "vllm":
                r = hashlib.sha256(cbor_text(self.hash_seed)).digest()
            else:
                r = _ALGOS[key_version].root(self.encoding(key_version))
            self._enc[("root", key_version)] = r
        return r

    def extension_room(self):
        """The header extension every block of this namespace carries (its length
        field excluded): the vllm parent link, the key count, the room for extra keys."""
        n = 4 + self.extra_key_bytes
        if self.key_scheme == "vllm":
            n += 32
            if self.lora:
                n += 4 + len(cbor_text(self.lora))
            if self.tenant_salt:
                n += 4 + len(cbor_text(self.tenant_salt))
        return n

    def block_extra(self, first, extra):
        """The extra keys a block's key covers: the caller's; under the vllm scheme in vLLM's
        order: CBOR text(lora), the caller's non-byte-string items, CBOR text(tenant_salt) in
        block 0, then the caller's byte strings."""
        extra = list(extra or ())
        if self.key_scheme != "vllm":
            return extra
        head = [cbor_text(self.lora)] if self.lora else []
        i = 0
        while i < len(extra) and (not extra[i] or extra[i][0] >> 5 != 2):
            i += 1
        salt = [cbor_text(self.tenant_salt)] if first and self.tenant_salt else []
        return head + extra[:i] + salt + extra[i:]

    def digest(self, key_version=KEY_VERSION):
        """The 64-bit namespace digest that block headers carry."""
        d = self._enc.get(("digest", key_version))
        if d is None:
            d = self._enc[("digest", key_version)] = _ALGOS[key_version].digest(self.encoding(key_version))
        return d

    def to_proto(self):
        from .v1 import types_pb2
        return types_pb2.Namespace(model=self.model, dtype=DTYPE_IDS[self.dtype], block_tokens=self.block_tokens,
                                   layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim,
                                   tenant_salt=self.tenant_salt, kv_layout=KV_LAYOUTS.index(self.kv_layout),
                                   latent_dim=self.latent_dim, scales=SCALES.index(self.scales), lora=self.lora,
                                   key_scheme=KEY_SCHEMES.index(self.key_scheme), hash_seed=self.hash_seed,
                                   extra_key_bytes=self.extra_key_bytes)


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


_ALGOS = {KEY_VERSION: _SHA256}  # key format 3 chains as format 2 did; only the encoding changed


def _cbor_head(major, v):
    if v < 24:
        return bytes([major << 5 | v])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if v < 1 << (8 * size):
            return bytes([major << 5 | info]) + v.to_bytes(size, "big")
    raise ValueError(f"{v} does not fit a CBOR head")


def cbor_text(s):
    """s as a canonical CBOR text string: a vllm-scheme extra key such as a LoRA name."""
    b = s.encode("utf-8")
    return _cbor_head(3, len(b)) + b


def cbor_bytes(b):
    """b as a CBOR byte string: a vllm-scheme extra key such as a prompt-embeddings hash."""
    return _cbor_head(2, len(b)) + bytes(b)


def vllm_mm_key(identifier, offset):
    """vLLM's extra key of a multimodal input in a block: CBOR [identifier, offset], offset
    relative to the block's first token (negative when the input began in an earlier block)."""
    off = _cbor_head(0, offset) if offset >= 0 else _cbor_head(1, -1 - offset)
    return _cbor_head(4, 2) + cbor_text(identifier) + off


def _check_extra(ns, per_block, n_blocks):
    if len(per_block) > n_blocks:
        raise ValueError(f"extra_keys: {len(per_block)} blocks have extra keys, the prompt has {n_blocks} full blocks")
    for i, e in enumerate(per_block):
        e = e or ()
        if len(e) > MAX_EXTRA_KEYS or sum(len(k) for k in e) > MAX_EXTRA_BYTES:
            raise ValueError(f"extra_keys: block {i}: at most {MAX_EXTRA_KEYS} keys and {MAX_EXTRA_BYTES} bytes")
        if not all(isinstance(k, (bytes, bytearray)) for k in e):
            raise ValueError(f"extra_keys: block {i}: extra keys are bytes")
        room = sum(4 + len(k) for k in e)
        if room > ns.extra_key_bytes:
            raise ValueError(f"extra_keys: block {i}: {room} bytes with their lengths; the namespace reserves "
                             f"{ns.extra_key_bytes} (extra_key_bytes)")


def _vllm_hash(parent, tb, extra):
    n = len(tb) // 4
    m = bytearray(b"\x83") + _cbor_head(2, 32) + parent + _cbor_head(4, n)
    for t in struct.unpack(f"<{n}I", tb):
        m += _cbor_head(0, t)
    if extra:
        m += _cbor_head(4, len(extra)) + b"".join(extra)
    else:
        m += b"\xf6"
    return hashlib.sha256(m).digest()


def block_link(ns, parent, tb, extra):
    """The link of one block (tb: its token bytes) chained from parent under ns's scheme, whose
    key covers extra (as Namespace.block_extra returns them): 16 bytes (the key) or, under the
    vllm scheme, vLLM's 32-byte hash whose first 16 bytes are the key."""
    if ns.key_scheme == "vllm":
        return _vllm_hash(parent, tb, extra)
    msg = parent[:KEY_SIZE] + tb
    if extra:
        msg += struct.pack("<I", len(extra)) + b"".join(struct.pack("<I", len(k)) + bytes(k) for k in extra)
    return hashlib.sha256(msg).digest()[:KEY_SIZE]


def key_links(ns, tokens, extra_keys=None, key_version=KEY_VERSION):
    """The links of every full block (see block_link): keys under the kvmesh scheme."""
    tb = token_bytes(tokens)
    step = 4 * ns.block_tokens
    n_blocks = len(tb) // step
    extra_keys = list(extra_keys or ())
    _check_extra(ns, extra_keys, n_blocks)
    parent = ns.root_link(key_version)
    if ns.key_scheme == "kvmesh" and not any(extra_keys):
        return _ALGOS[key_version].chain(parent, tb, step)
    out = []
    for i in range(n_blocks):
        e = ns.block_extra(i == 0, extra_keys[i] if i < len(extra_keys) else ())
        parent = block_link(ns, parent, tb[i * step:(i + 1) * step], e)
        out.append(parent)
    return out


def key_bytes(ns, tokens, key_version=KEY_VERSION, parent=None, extra_keys=None):
    """The keys (16 bytes each) of every full block of tokens under ns, chained from
    parent (default: the namespace root; kvmesh scheme only), whose blocks carry
    extra_keys[i] (a list of bytes per block, default none)."""
    if parent is not None:
        if ns.key_scheme != "kvmesh" or extra_keys:
            raise ValueError("key_bytes: parent only with the kvmesh scheme and no extra keys")
        return _ALGOS[key_version].chain(parent, token_bytes(tokens), 4 * ns.block_tokens)
    return [l[:KEY_SIZE] for l in key_links(ns, tokens, extra_keys, key_version)]


def keys(ns, tokens, extra_keys=None):
    """The chained block keys of every full block of tokens, as the 32-hex-digit strings
    that `kvmesh inspect lookup` prints (a tail shorter than a block has none).
    extra_keys[i] are block i's extra keys (bytes each; e.g. a multimodal input's hash
    and offset): equal tokens with different extra keys never share a key."""
    if not isinstance(ns, Namespace):
        raise TypeError(f"ns: want a kvmesh.Namespace, got {type(ns).__name__}")
    if isinstance(tokens, (bytes, bytearray, str)):
        raise ValueError("tokens: want a sequence of int token ids (not bytes or str)")
    return [k.hex() for k in key_bytes(ns, tokens, extra_keys=extra_keys)]


assert sys.byteorder in ("little", "big")
