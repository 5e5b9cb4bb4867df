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
u8 4 ‖ u8 key_scheme ‖ str(hash_seed); u8 5 ‖ u32 extra_key_bytes; u8 6 ‖ u8 group count ‖
per group (Group.encoding). A block with extra keys appends
u32 count ‖ (u32 len ‖ bytes)* to its message. Under key_scheme "vllm" keys
are vLLM's block hashes (SHA-256 over canonical CBOR, rooted in its
PYTHONHASHSEED; prefixhash/vllm.go), truncated to 16 bytes.

A namespace with groups (a hybrid model's cache: full attention, sliding window,
recurrent state, indexer; Group) keeps one chain per prompt; group g's record of
block i is stored under group_key(k_i, g) = k_i XOR M_g (M_0 zero, M_g the first 16
bytes of SHA-256("kvmesh/group/v1" ‖ u32 g)).

prefixhash/testdata/golden.json and groups.json pin them; the tests check every vector.
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
GROUP_LAYOUTS = ("split", "latent", "state")  # "state": a state group's, never a namespace's
GROUP_KINDS = ("full", "sliding", "state", "indexer")
MAX_GROUPS = 32
MAX_WINDOW_BLOCKS = (1 << 16) - 1
MAX_STATE_BYTES = 1 << 30
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


def _group_mask(g):
    if g == 0:
        return bytes(KEY_SIZE)
    return hashlib.sha256(b"kvmesh/group/v1" + struct.pack("<I", g)).digest()[:KEY_SIZE]


_GROUP_MASKS = [_group_mask(g) for g in range(MAX_GROUPS)]


def group_key(key, g):
    """The key group g's record of the block whose chain key is key (16 bytes) is stored under:
    key XOR M_g (group 0's: the chain key itself)."""
    if not 0 <= g < MAX_GROUPS:
        raise ValueError(f"group {g}: at most {MAX_GROUPS} groups")
    m = _GROUP_MASKS[g]
    return (int.from_bytes(key[:KEY_SIZE], "little") ^ int.from_bytes(m, "little")).to_bytes(KEY_SIZE, "little")


class Group:
    """One group of a hybrid model's cache (prefixhash.Group): its kind ("full", "sliding" with a
    window of tokens, "state": a fixed-size recurrent state per block boundary, "indexer": a
    per-token side cache every prefix needs), the model's layers it holds (ascending), and its
    layout: "split" (kv_heads, head_dim), "latent" (latent_dim) or, for a state, state_bytes per
    layer and head (kv_heads: the heads a state splits into, default 1). dtype defaults to the
    namespace's."""

    __slots__ = ("kind", "layers", "window", "kv_layout", "dtype", "kv_heads", "head_dim", "latent_dim",
                 "state_bytes", "scales")

    def __init__(self, kind, layers, *, window=0, kv_layout=None, dtype=None, kv_heads=0, head_dim=0, latent_dim=0,
                 state_bytes=0, scales="none"):
        self.kind = kind
        self.layers = tuple(layers)
        self.window = window
        self.kv_layout = kv_layout or ("state" if kind == "state" else "split")
        self.dtype = None if dtype is None else dtype_name(dtype)
        self.kv_heads = 1 if kind == "state" and not kv_heads else kv_heads
        self.head_dim, self.latent_dim, self.state_bytes, self.scales = head_dim, latent_dim, state_bytes, scales

    def _fields(self):
        return (self.kind, self.layers, self.window, self.kv_layout, self.dtype, self.kv_heads, self.head_dim,
                self.latent_dim, self.state_bytes, self.scales)

    def __eq__(self, other):
        return isinstance(other, Group) and self._fields() == other._fields()

    def __hash__(self):
        return hash(self._fields())

    def __repr__(self):
        extra = {"split": f"kv_heads={self.kv_heads}, head_dim={self.head_dim}", "latent": f"latent_dim={self.latent_dim}",
                 "state": f"kv_heads={self.kv_heads}, state_bytes={self.state_bytes}"}.get(self.kv_layout, "")
        w = f", window={self.window}" if self.kind == "sliding" else ""
        return f"Group({self.kind!r}, {list(self.layers)}{w}, kv_layout={self.kv_layout!r}, dtype={self.dtype!r}, {extra})"

    @property
    def every_block(self):
        """Whether a prefix needs every block of the group (full attention, indexers)."""
        return self.kind in ("full", "indexer")

    def window_blocks(self, block_tokens):
        """The blocks a sliding group's window covers: ceil(window / block_tokens); 0 otherwise."""
        return -(-self.window // block_tokens) if self.kind == "sliding" else 0

    def record_bytes(self, block_tokens):
        """Payload bytes of one whole record of the group."""
        if self.kv_layout == "state":
            return len(self.layers) * self.kv_heads * self.state_bytes
        return self.view(block_tokens).block_bytes

    def view(self, block_tokens, model="group"):
        """The group's records as a namespace without groups would describe them (its layers,
        shape and dtype), for the tensor and part helpers; not for a state group."""
        if self.kv_layout == "state":
            raise ValueError("a state group's records are not KV blocks")
        return Namespace(model, self.dtype, block_tokens, len(self.layers), self.kv_heads, self.head_dim,
                         kv_layout=self.kv_layout, latent_dim=self.latent_dim, scales=self.scales)

    def encoding(self):
        """u8 kind ‖ u32 window ‖ u8 layout ‖ u8 dtype ‖ u8 scales ‖ u32 kv_heads ‖ u32 head_dim ‖
        u32 latent_dim ‖ u32 state_bytes ‖ u32 layer count ‖ u32 per layer."""
        return (struct.pack("<BIBBB", GROUP_KINDS.index(self.kind), self.window, GROUP_LAYOUTS.index(self.kv_layout),
                            DTYPE_IDS[self.dtype], SCALES.index(self.scales)) +
                struct.pack(f"<{5 + len(self.layers)}I", self.kv_heads, self.head_dim, self.latent_dim,
                            self.state_bytes, len(self.layers), *self.layers))

    def to_proto(self):
        from .v1 import types_pb2
        return types_pb2.Group(kind=GROUP_KINDS.index(self.kind), window=self.window, layers=list(self.layers),
                               kv_layout=GROUP_LAYOUTS.index(self.kv_layout), dtype=DTYPE_IDS[self.dtype],
                               kv_heads=self.kv_heads, head_dim=self.head_dim, latent_dim=self.latent_dim,
                               state_bytes=self.state_bytes, scales=SCALES.index(self.scales))


def _validate_groups(ns):
    def bad(field, msg):
        raise ValueError(f"namespace {field}: {msg}")
    if not isinstance(ns.groups, tuple) or not all(isinstance(g, Group) for g in ns.groups):
        bad("groups", "want a list of kvmesh.Group")
    if len(ns.groups) > MAX_GROUPS:
        bad("groups", f"{len(ns.groups)} groups, the limit is {MAX_GROUPS}")
    if ns.kv_heads or ns.head_dim or ns.latent_dim or ns.kv_layout != "split":
        bad("kv_heads", "the namespace's own KV shape must be unset with groups: each group has its own")
    if ns.scales != "none":
        bad("scales", "set on a namespace with groups: each group has its own")
    owner, idx = {}, {}
    for i, g in enumerate(ns.groups):
        def f(name, i=i):
            return f"groups[{i}].{name}"
        if g.kind not in GROUP_KINDS:
            bad(f("kind"), f"{g.kind!r}: want one of {', '.join(GROUP_KINDS)}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in
                   (g.window, g.kv_heads, g.head_dim, g.latent_dim, g.state_bytes) + g.layers):
            bad(f("layers"), "layers and sizes are ints")
        if g.kind == "sliding" and g.window < 1:
            bad(f("window"), f"{g.window}: a sliding group's window is at least 1 token")
        if g.kind == "sliding" and g.window_blocks(ns.block_tokens) > MAX_WINDOW_BLOCKS:
            bad(f("window"), f"{g.window} tokens is more than {MAX_WINDOW_BLOCKS} blocks")
        if g.kind != "sliding" and g.window:
            bad(f("window"), f"{g.window} set on a {g.kind} group (only sliding groups have a window)")
        if not g.layers:
            bad(f("layers"), "a group holds at least one layer")
        if g.kv_layout not in GROUP_LAYOUTS:
            bad(f("kv_layout"), f"{g.kv_layout!r}: want one of {', '.join(GROUP_LAYOUTS)}")
        if (g.kind == "state") != (g.kv_layout == "state"):
            bad(f("kv_layout"), "a state group's layout is state, and only a state group's")
        for j, l in enumerate(g.layers):
            if not 0 <= l < ns.layers:
                bad(f("layers"), f"layer {l} is outside the model's [0,{ns.layers})")
            if j and l <= g.layers[j - 1]:
                bad(f("layers"), f"layers must ascend without repeats ({l} after {g.layers[j - 1]})")
            mine, other = (idx, owner) if g.kind == "indexer" else (owner, idx)
            if l in mine:
                bad(f("layers"), f"layer {l} is already in groups[{mine[l]}]: groups' layers must not overlap")
            mine[l] = i
            if l in other and ns.groups[other[l]].kind != "full" and g.kind != "full":
                bad(f("layers"), f"layer {l} is already in groups[{other[l]}]: only an indexer and a full group may share layers")
        if g.kv_layout == "state":
            if not 1 <= g.kv_heads <= 1 << 20:
                bad(f("kv_heads"), f"{g.kv_heads}: a state is split into 1..{1 << 20} heads")
            if not 1 <= g.state_bytes <= MAX_STATE_BYTES:
                bad(f("state_bytes"), f"{g.state_bytes} is outside 1..{MAX_STATE_BYTES}")
            if g.state_bytes % DTYPE_SIZES[g.dtype]:
                bad(f("state_bytes"), f"{g.state_bytes} is not a whole number of {g.dtype} elements")
            if g.head_dim or g.latent_dim or g.scales != "none":
                bad(f("head_dim"), "head_dim, latent_dim and scales are unset in a state group")
            continue
        if g.state_bytes:
            bad(f("state_bytes"), f"{g.state_bytes} set on a {g.kind} group (only state groups have it)")
        try:
            g.view(ns.block_tokens)
        except ValueError as e:
            bad(f(str(e).split(": ", 1)[0].removeprefix("namespace ")), str(e).split(": ", 2)[-1])


def resume(groups, block_tokens, n, held):
    """The hit rule (prefixhash.Resume) over a chain of n blocks whose records held(g, i) says are
    cached: (P, per_group). P is the longest prefix, in blocks, such that every full and indexer
    group holds blocks [0,P), every sliding group blocks [P - window_blocks, P), every state group
    block P-1 (P = 0 always qualifies); per_group[g] is a full/indexer group's leading blocks held,
    or for sliding/state the largest P' no longer than those at which that group alone resumes."""
    per = [0] * len(groups)
    full = n
    for g, gr in enumerate(groups):
        if gr.every_block:
            while per[g] < n and held(g, per[g]):
                per[g] += 1
            full = min(full, per[g])

    def allows(g, p):
        gr = groups[g]
        if gr.kind == "state":
            return p == 0 or held(g, p - 1)
        return all(held(g, i) for i in range(max(0, p - gr.window_blocks(block_tokens)), p))
    for g, gr in enumerate(groups):
        if not gr.every_block:
            per[g] = next(p for p in range(full, -1, -1) if allows(g, p))
    p = next(p for p in range(full, -1, -1) if all(allows(g, p) for g, gr in enumerate(groups) if not gr.every_block))
    return p, per


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

    ``groups`` (a list of kvmesh.Group) describes a hybrid model's cache instead of kv_heads and
    head_dim: full-attention, sliding-window, recurrent-state and indexer groups, each with its
    layers and shape; put and get then take a group's tensors. List the full-attention group
    first (its records are then under the chain keys).
    """

    __slots__ = ("model", "dtype", "block_tokens", "layers", "kv_heads", "head_dim", "tenant_salt", "kv_layout",
                 "latent_dim", "scales", "lora", "key_scheme", "hash_seed", "extra_key_bytes", "groups", "_enc")

    def __init__(self, model, dtype, block_tokens, layers, kv_heads=0, head_dim=0, tenant_salt=b"", *,
                 kv_layout="split", latent_dim=0, scales="none", lora="", key_scheme="kvmesh", hash_seed="",
                 extra_key_bytes=0, groups=None, **moved):
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
        self.groups = ()
        if groups:
            gs = []
            for g in groups:
                if isinstance(g, Group) and g.dtype is None:  # the namespace's dtype
                    g = Group(g.kind, g.layers, window=g.window, kv_layout=g.kv_layout, dtype=self.dtype,
                              kv_heads=g.kv_heads, head_dim=g.head_dim, latent_dim=g.latent_dim,
                              state_bytes=g.state_bytes, scales=g.scales)
                gs.append(g)
            self.groups = tuple(gs)
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
        if self.groups:
            _validate_groups(self)
        elif self.kv_layout not in KV_LAYOUTS:
            bad("kv_layout", f"{self.kv_layout!r}: want one of {', '.join(KV_LAYOUTS)}")
        if self.groups:
            pass
        elif self.kv_layout == "split":
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
        if self.groups:
            pass
        elif self.scales not in SCALES:
            bad("scales", f"{self.scales!r}: want one of {', '.join(SCALES)}")
        elif self.scales != "none" and DTYPE_SIZES[self.dtype] != 1:
            bad("scales", f"{self.dtype} payloads carry no scales (only fp8 and int8 do)")
        elif self.scales == "head" and self.kv_layout == "latent":
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
                self.hash_seed, self.extra_key_bytes, self.groups)

    @property
    def anchor(self):
        """The group whose records the others' hang from in a store (the first full group, else
        the first indexer; -1 without)."""
        for kind in ("full", "indexer"):
            for g, gr in enumerate(self.groups):
                if gr.kind == kind:
                    return g
        return -1

    def group_bytes(self, g):
        """Payload bytes of group g's record of one block."""
        return self.groups[g].record_bytes(self.block_tokens)

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
                + (f", extra_key_bytes={self.extra_key_bytes}" if self.extra_key_bytes else "")
                + (f", groups={list(self.groups)!r}" if self.groups else "") + ")")

    def salted(self, tenant_salt):
        """This namespace as a node with tenants keys it for a tenant whose salt is tenant_salt
        (auth.SaltedWith: salt + ":" + own salt, unless own already starts with it)."""
        own = self.tenant_salt
        if not tenant_salt or own.startswith(tenant_salt + ":"):
            return self
        return Namespace(self.model, self.dtype, self.block_tokens, self.layers, self.kv_heads, self.head_dim,
                         tenant_salt + ":" + own, kv_layout=self.kv_layout, latent_dim=self.latent_dim,
                         scales=self.scales, lora=self.lora, key_scheme=self.key_scheme, hash_seed=self.hash_seed,
                         extra_key_bytes=self.extra_key_bytes, groups=self.groups)

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
            if self.groups:
                e += bytes([6, len(self.groups)]) + b"".join(g.encoding() for g in self.groups)
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
                                   extra_key_bytes=self.extra_key_bytes, groups=[g.to_proto() for g in self.groups])


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
