"""Encoded blocks and their parts (block/block.go, block format 4), for the data planes.

All integers little-endian; the header is padded to a multiple of 64 bytes::

      0  4  magic "KVMB"              60  4  layers (the model's)
      4  2  format version (4)        64  4  KV heads (the model's; 0 latent)
      6  1  key format version (3)    68  4  head dim (0 latent)
      7  1  KV layout (0 split, 1 latent, 2 state)  72  4  latent dim (0 split; state: state_bytes)
      8  4  header length             76  1  group kind + 1 (0: no group)
                                      77  1  anchor group + 1 (sliding, state records; else 0)
                                      78  2  window in blocks (sliding records; else 0)
     12  4  token count n             80  8  payload length (of this record)
     16  8  namespace digest          88  8  xxhash64 of the payload (of this record)
     24 16  key                       96  8  tenant tag (0: none)
     40 16  parent key               104 16  part: l0, l1, h0, h1 (u32 each)
     56  1  dtype                    120  8  xxhash64 of [0,120), the tokens and the extension
     57  1  key scheme (0 kvmesh, 1 vllm)
     58  1  scales (0 none, 1 per block, 2 per head)
     59  1  group + 1 (0: a namespace without groups)
    128 4n  token ids, then u32 extension length X (the namespace's extension_room) and
            X bytes: the parent's 32-byte vLLM hash (vllm scheme only), u32 extra key
            count m, m x (u32 len ‖ bytes), zeros to X

Payload of a whole block: split ``[layer][kv_head][K|V][token][head_dim]``,
latent ``[layer][token][latent_dim]``, then the float32 scales: per block
``[layer][K|V]`` (latent ``[layer]``), per head ``[layer][kv_head][K|V]``.
So a tensor-parallel rank's heads of one layer are one contiguous run.

A *part* is a record whose range ``[l0,l1) x [h0,h1)`` is not the whole
block (heads are the KV heads, or the one latent for the latent layout). Its
payload is, for each layer of [l0,l1), that layer's heads [h0,h1), then the
scales of those layers (and heads). rank_part maps a parallel rank to its
part exactly as Go's block.RankPart does.

A namespace with groups stores one record per group of each block: its key field
holds group_key(k_i, g), its layout fields the group's (layers: the group's count,
in its order), and a state record's payload is [layer][head][state_bytes]
(record_view describes a group's records for the part helpers).
"""
import struct
from collections import namedtuple

from . import _xxhash
from ._namespace import (DTYPE_IDS, DTYPE_SIZES, GROUP_KINDS, GROUP_LAYOUTS, KEY_SCHEMES, KEY_SIZE,
                         MAX_GROUPS, MAX_EXTRA_KEYS, SCALES, KEY_VERSION, block_link, group_key, token_bytes)
from .errors import BadPart

MAGIC = b"KVMB"
BLOCK_VERSION = 4
FIXED_HEADER_LEN = 128
HEADER_SUM_OFF = 120
HEADER_ALIGN = 64

_FIXED = struct.Struct("<4sHBBII Q16s16s BBBB IIII BBH QQQ IIII")
assert _FIXED.size == HEADER_SUM_OFF


class _StateView:
    """A state group's records as the part helpers see them: layers x heads cells of
    state_bytes each."""
    kv_layout, scales, head_dim, latent_dim = "state", "none", 0, 0

    def __init__(self, ns, gr):
        self.layers, self.kv_heads, self.heads = len(gr.layers), gr.kv_heads, gr.kv_heads
        self.state_bytes, self.dtype, self.block_tokens = gr.state_bytes, gr.dtype, ns.block_tokens
        self.dtype_size = DTYPE_SIZES[gr.dtype]


def record_view(ns, group=None):
    """What a record of ns holds, for the part helpers: ns itself without groups, else group
    `group`'s view (Group.view; for a state group its cells of state_bytes)."""
    if not ns.groups:
        if group is not None:
            raise ValueError(f"group {group}: namespace has no groups")
        return ns
    if group is None or not 0 <= group < len(ns.groups):
        raise ValueError(f"group {group!r}: the namespace has {len(ns.groups)} groups (0..{len(ns.groups) - 1})")
    gr = ns.groups[group]
    if gr.kv_layout == "state":
        return _StateView(ns, gr)
    return gr.view(ns.block_tokens, ns.model)


class CorruptBlock(ValueError):
    """Bytes that are not a block this client may use."""


class Part(namedtuple("Part", "l0 l1 h0 h1")):
    """A range of a block: layers [l0, l1) x heads [h0, h1) (latent layout: h0=0, h1=1)."""
    __slots__ = ()

    def __str__(self):
        return f"layers [{self.l0},{self.l1}) heads [{self.h0},{self.h1})"


def whole_part(ns):
    """The part that is the whole block of ns."""
    return Part(0, ns.layers, 0, ns.heads)


def is_whole(ns, p):
    return tuple(p) == tuple(whole_part(ns))


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _head_slices(heads):
    """The valid head ranges of heads KV heads, as Go's block.headSlices names them."""
    ws = []
    for w in range(heads, 0, -1):
        if heads % w != 0:
            pass
        elif w == heads:
            ws.append(f"width {w}: [0,{w})")
        elif 2 * w == heads:
            ws.append(f"width {w}: [0,{w}), [{w},{heads})")
        else:
            ws.append(f"width {w}: [0,{w}), [{w},{2 * w}), …")
        if len(ws) == 6:
            ws.append("…")
            break
    return "; ".join(ws)


def _bad(msg):
    return BadPart(f"block: invalid part: {msg}")


def check_part(ns, p):
    """Raises BadPart (an InvalidArgument) unless p is a valid part range of ns's blocks, naming
    the valid ranges (block.Layout.CheckPart): any layer range 0 <= l0 < l1 <= layers; split
    heads an aligned slice (h1-h0 divides kv_heads, h0 a multiple of it); latent heads [0,1);
    per-block scales with the split layout only the whole head range."""
    l0, l1, h0, h1 = p
    L, H = ns.layers, ns.heads
    if l0 < 0 or l1 <= l0 or l1 > L:
        raise _bad(f"layers [{l0},{l1}): want a non-empty range inside [0,{L})")
    w = h1 - h0
    if ns.kv_layout == "latent":
        if (h0, h1) != (0, 1):
            raise _bad(f"heads [{h0},{h1}) of a latent block: the latent has no heads to split, every rank holds "
                       "it whole (heads [0,1))")
    elif h0 < 0 or w < 1 or h1 > H or H % w or h0 % w:
        raise _bad(f"heads [{h0},{h1}) of {H}: a head range is one of the equal slices of the {H} KV heads "
                   f"({_head_slices(H)})")
    elif ns.scales == "block" and w != H:
        raise _bad(f"heads [{h0},{h1}) of {H} with per-block scales: a layer's scale covers every head, so its "
                   "heads are not split (use per-head scales)")


def rank_part(ns, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
    """The part of ns's blocks that a rank holds (block.RankPart):

    - tp: the split layout's H KV heads: heads [r*H/tp, (r+1)*H/tp) when tp divides H; when H
      divides tp (more ranks than heads: vLLM replicates heads) the one head r // (tp/H); else
      BadPart naming the valid tp sizes. Latent: every rank holds the latent, heads [0,1).
    - pp: vLLM's partition: every stage gets layers // pp_size layers, and the layers % pp_size
      extra layers go one each to the stages just before the last; stage r covers the layers
      after those of stages < r.
    """
    for name, v in (("tp_rank", tp_rank), ("tp_size", tp_size), ("pp_rank", pp_rank), ("pp_size", pp_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _bad(f"{name} {v!r} is not an int")
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise _bad(f"tensor-parallel rank {tp_rank} of size {tp_size}: want 0 <= rank < size")
    if pp_size < 1 or not 0 <= pp_rank < pp_size:
        raise _bad(f"pipeline rank {pp_rank} of size {pp_size}: want 0 <= rank < size")
    if ns.groups:
        raise _bad("the namespace has groups: a rank's part is per group (rank_group_part)")
    l0, l1 = _stage_layers(ns.layers, pp_rank, pp_size)
    return _rank_part(ns, tp_rank, tp_size, l0, l1)


def _stage_layers(L, pp_rank, pp_size):
    if pp_size > L:
        raise _bad(f"{pp_size} pipeline stages for {L} layers: a stage holds at least one layer")
    base, extra = divmod(L, pp_size)
    sizes = [base + (1 if pp_size - 1 - extra <= s < pp_size - 1 else 0) for s in range(pp_size)]
    l0 = sum(sizes[:pp_rank])
    return l0, l0 + sizes[pp_rank]


def rank_group_part(ns, group, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
    """rank_part for group `group` of a namespace with groups (block.RankGroupPart): the stage's
    model layers (split as rank_part splits them) that are the group's, as a range of the
    group's layers, and the rank's heads of the group; a stage with none of the group's layers
    holds the empty Part(l, l, 0, 0)."""
    for name, v in (("tp_rank", tp_rank), ("tp_size", tp_size), ("pp_rank", pp_rank), ("pp_size", pp_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _bad(f"{name} {v!r} is not an int")
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise _bad(f"tensor-parallel rank {tp_rank} of size {tp_size}: want 0 <= rank < size")
    if pp_size < 1 or not 0 <= pp_rank < pp_size:
        raise _bad(f"pipeline rank {pp_rank} of size {pp_size}: want 0 <= rank < size")
    try:
        view = record_view(ns, group)
    except ValueError as e:
        raise _bad(str(e)) from None
    m0, m1 = _stage_layers(ns.layers, pp_rank, pp_size)
    layers = ns.groups[group].layers
    l0, l1 = sum(1 for x in layers if x < m0), sum(1 for x in layers if x < m1)
    if l0 == l1:
        return Part(l0, l1, 0, 0)
    return _rank_part(view, tp_rank, tp_size, l0, l1)


def _rank_part(ns, tp_rank, tp_size, l0, l1):
    """The part of a record shaped as ns that tensor-parallel rank tp_rank of tp_size holds in
    layers [l0, l1)."""
    if ns.kv_layout == "latent":
        h0, h1 = 0, 1
    else:
        H = ns.kv_heads
        if H % tp_size == 0:
            w = H // tp_size
            h0, h1 = tp_rank * w, (tp_rank + 1) * w
        elif tp_size % H == 0:
            h0 = tp_rank // (tp_size // H)
            h1 = h0 + 1
        else:
            raise _bad(f"tensor-parallel size {tp_size} for {H} KV heads: it must divide the heads or be a multiple "
                       f"of them (valid: {', '.join(map(str, _divisors(H)))}, or a multiple of {H})")
    p = Part(l0, l1, h0, h1)
    check_part(ns, p)
    return p


def replicated(ns, tp_size):
    """Whether several tensor-parallel ranks of tp_size hold the same part (the latent layout, or
    more ranks than KV heads): then a put asks the node first and sends only what it lacks."""
    return tp_size > 1 and (ns.kv_layout == "latent" or tp_size > ns.kv_heads)


def _cell(ns, tokens):
    """Bytes of one (layer, head) cell of KV: split 2 x tokens x head_dim, latent tokens x latent_dim,
    state state_bytes."""
    if ns.kv_layout == "state":
        return ns.state_bytes
    if ns.kv_layout == "latent":
        return tokens * ns.latent_dim * ns.dtype_size
    return 2 * tokens * ns.head_dim * ns.dtype_size


def _cell_scales(ns):
    """float32 scales per (layer, head) cell (per head: K and V), or per layer (per block)."""
    return {"none": 0, "block": 1 if ns.kv_layout == "latent" else 2, "head": 2}[ns.scales]


def part_len(ns, tokens, p):
    """Payload bytes of part p of a block of `tokens` tokens."""
    L, H = p.l1 - p.l0, p.h1 - p.h0
    n = L * H * _cell(ns, tokens)
    if ns.scales == "head":
        n += 4 * L * H * 2
    elif ns.scales == "block":
        n += 4 * L * _cell_scales(ns)
    return n


def extract_part(ns, payload, tokens, p):
    """Part p's payload taken from a whole block payload (bytes-like), as bytes."""
    mv = memoryview(payload).cast("B")
    H, c = ns.heads, _cell(ns, tokens)
    out = bytearray()
    for layer in range(p.l0, p.l1):
        off = (layer * H + p.h0) * c
        out += mv[off:off + (p.h1 - p.h0) * c]
    kv = ns.layers * H * c
    if ns.scales == "head":
        for layer in range(p.l0, p.l1):
            off = kv + 4 * 2 * (layer * H + p.h0)
            out += mv[off:off + 4 * 2 * (p.h1 - p.h0)]
    elif ns.scales == "block":
        k = _cell_scales(ns)
        out += mv[kv + 4 * k * p.l0:kv + 4 * k * p.l1]
    return bytes(out)


def place_part(ns, payload, part, tokens, p):
    """Copies part p's payload (bytes-like) into its place in a whole block payload (a writable
    buffer): the inverse of extract_part."""
    dst = memoryview(payload).cast("B")
    src = memoryview(part).cast("B")
    if src.nbytes != part_len(ns, tokens, p):
        raise ValueError(f"part {p}: {src.nbytes} bytes, want {part_len(ns, tokens, p)}")
    H, c = ns.heads, _cell(ns, tokens)
    w = (p.h1 - p.h0) * c
    i = 0
    for layer in range(p.l0, p.l1):
        off = (layer * H + p.h0) * c
        dst[off:off + w] = src[i:i + w]
        i += w
    kv = ns.layers * H * c
    if ns.scales == "head":
        w = 4 * 2 * (p.h1 - p.h0)
        for layer in range(p.l0, p.l1):
            off = kv + 4 * 2 * (layer * H + p.h0)
            dst[off:off + w] = src[i:i + w]
            i += w
    elif ns.scales == "block":
        k = _cell_scales(ns)
        dst[kv + 4 * k * p.l0:kv + 4 * k * p.l1] = src[i:]


def header_len(n_tokens, ext):
    """The header length of a block of n_tokens whose extension is ext bytes (its length field
    excluded)."""
    n = FIXED_HEADER_LEN + 4 * n_tokens + 4 + ext
    return (n + HEADER_ALIGN - 1) // HEADER_ALIGN * HEADER_ALIGN


def _extension(ns, parent, extra):
    """The extension, zero-padded to the namespace's room: every block of a namespace has
    one encoded size."""
    e = bytearray(parent if ns.key_scheme == "vllm" else b"")
    e += struct.pack("<I", len(extra))
    for k in extra:
        e += struct.pack("<I", len(k)) + bytes(k)
    room = ns.extension_room()
    if len(e) > room:
        raise ValueError(f"extra_keys: {len(e)} bytes of extension, the namespace reserves {room}")
    return bytes(e) + bytes(room - len(e))


def namespace_header_len(ns):
    """The header length of every block (and part) of ns."""
    return header_len(ns.block_tokens, ns.extension_room())


def group_fields(ns, group):
    """(group + 1, kind + 1, anchor + 1, window blocks) as a record of group `group` of ns carries
    them in bytes 59 and 76-79; zeros without groups."""
    if not ns.groups:
        return 0, 0, 0, 0
    gr = ns.groups[group]
    anchor = -1 if gr.every_block else ns.anchor
    return group + 1, GROUP_KINDS.index(gr.kind) + 1, anchor + 1, gr.window_blocks(ns.block_tokens)


def encode_header(ns, parent, tokens, payload_checksum, tenant_tag=0, key_version=KEY_VERSION, extra=None, part=None,
                  group=None):
    """The header of the record of ns holding tokens (exactly ns.block_tokens), chained from
    parent (its link: the parent key, or under the vllm scheme the parent's 32-byte hash),
    whose key covers extra (the caller's extra keys; the namespace adds its own). part (default
    the whole block) is the range the record holds; payload_checksum is the xxhash64 of its
    payload (of part_len bytes). In a namespace with groups, group names the group whose record
    it is (keyed group_key(k, group)). Returns (header bytes, link); link[:16] is the block's
    chain key, which the next block chains from."""
    tb = token_bytes(tokens)
    n = len(tb) // 4
    if n != ns.block_tokens:
        raise ValueError(f"block has {n} tokens, namespace blocks hold {ns.block_tokens}")
    view = record_view(ns, group)
    p = whole_part(view) if part is None else Part(*part)
    check_part(view, p)
    extra = ns.block_extra(ns.key_scheme == "vllm" and parent == ns.root_link(key_version), extra)
    if len(extra) > MAX_EXTRA_KEYS + 2:
        raise ValueError(f"extra_keys: {len(extra)} keys, the limit is {MAX_EXTRA_KEYS}")
    link = block_link(ns, parent, tb, extra)
    key = link[:KEY_SIZE]
    gfields = group_fields(ns, group)
    if gfields[0]:
        key = group_key(key, group)
    ext = _extension(ns, parent, extra)
    hl = header_len(n, len(ext))
    fixed = _FIXED.pack(MAGIC, BLOCK_VERSION, key_version, GROUP_LAYOUTS.index(view.kv_layout), hl, n,
                        ns.digest(key_version), key, parent[:KEY_SIZE], DTYPE_IDS[view.dtype],
                        KEY_SCHEMES.index(ns.key_scheme), SCALES.index(view.scales), gfields[0], view.layers,
                        view.kv_heads, view.head_dim, view.latent_dim or getattr(view, "state_bytes", 0),
                        *gfields[1:], part_len(view, n, p), payload_checksum, tenant_tag, *p)
    tail = tb + struct.pack("<I", len(ext)) + ext
    hsum = _xxhash.xxh64(fixed + tail)
    h = bytearray(hl)
    h[:HEADER_SUM_OFF] = fixed
    struct.pack_into("<Q", h, HEADER_SUM_OFF, hsum)
    h[FIXED_HEADER_LEN:FIXED_HEADER_LEN + len(tail)] = tail
    return bytes(h), link


class _Scheme:
    """What block_link reads of a namespace: its key scheme."""
    __slots__ = ("key_scheme",)

    def __init__(self, key_scheme):
        self.key_scheme = key_scheme


_SCHEMES = {k: _Scheme(k) for k in KEY_SCHEMES}


class Header:
    __slots__ = ("key_version", "digest", "key", "parent", "dtype", "layers", "kv_heads", "head_dim", "payload_len",
                 "checksum", "tenant", "tokens", "header_len", "kv_layout", "key_scheme", "scales", "latent_dim",
                 "parent_link", "extra", "part", "chain", "group", "group_kind", "anchor", "window_blocks",
                 "state_bytes")

    def whole(self):
        """Whether the record is a whole block, not a part."""
        heads = 1 if self.kv_layout == "latent" else self.kv_heads
        return tuple(self.part) == (0, self.layers, 0, heads)


def decode_header(b, key_version=KEY_VERSION):
    """Parses and verifies the header at the start of b (bytes-like): magic, versions,
    lengths, header checksum, and key = H(parent ‖ tokens ‖ extra keys). Raises CorruptBlock."""
    mv = memoryview(b)
    if len(mv) < FIXED_HEADER_LEN:
        raise CorruptBlock(f"{len(mv)} bytes, shorter than a block header")
    (magic, version, kv, layout, hl, n, digest, key, parent, dtype, scheme, scales, grp, layers, heads, hd, latent,
     kind, anchor, window, plen, csum, tenant, l0, l1, h0, h1) = _FIXED.unpack_from(mv)
    if magic != MAGIC:
        raise CorruptBlock(f"bad magic {magic!r}")
    if version != BLOCK_VERSION or kv != key_version:
        raise CorruptBlock(f"block format {version}, key format {kv}: not this client's ({BLOCK_VERSION}, "
                           f"{key_version})")
    if n == 0 or len(mv) < hl or hl < header_len(n, 4):
        raise CorruptBlock(f"header length {hl} for {n} tokens")
    tb = bytes(mv[FIXED_HEADER_LEN:FIXED_HEADER_LEN + 4 * n])
    (x,) = struct.unpack_from("<I", mv, FIXED_HEADER_LEN + 4 * n)
    if x < 4 or header_len(n, x) != hl:
        raise CorruptBlock(f"extension of {x} bytes in a header of {hl}")
    ext = bytes(mv[FIXED_HEADER_LEN + 4 * n:FIXED_HEADER_LEN + 4 * n + 4 + x])
    (hsum,) = struct.unpack_from("<Q", mv, HEADER_SUM_OFF)
    if _xxhash.xxh64(bytes(mv[:HEADER_SUM_OFF]) + tb + ext) != hsum:
        raise CorruptBlock("header checksum mismatch")
    if any(mv[FIXED_HEADER_LEN + 4 * n + 4 + x:hl]):
        raise CorruptBlock("header padding is not zero")
    h = Header()
    h.key_version, h.digest, h.key, h.parent = key_version, digest, key, parent
    h.dtype, h.layers, h.kv_heads, h.head_dim, h.latent_dim = dtype, layers, heads, hd, latent
    h.state_bytes = 0
    h.payload_len, h.checksum, h.tenant, h.header_len = plen, csum, tenant, hl
    h.tokens = tb
    h.part = Part(l0, l1, h0, h1)
    try:
        h.kv_layout, h.key_scheme, h.scales = GROUP_LAYOUTS[layout], KEY_SCHEMES[scheme], SCALES[scales]
    except IndexError:
        raise CorruptBlock("unknown layout, key scheme or scales") from None
    if h.kv_layout == "state":
        h.state_bytes, h.latent_dim = latent, 0
    _decode_group(h, grp, kind, anchor, window)
    h.parent_link, h.extra = parent, []
    e = ext[4:]
    if h.key_scheme == "vllm":
        if len(e) < 32 or e[:KEY_SIZE] != parent:
            raise CorruptBlock("parent link does not name the parent")
        h.parent_link, e = e[:32], e[32:]
    if len(e) < 4:
        raise CorruptBlock("extension has no extra key count")
    (m,) = struct.unpack_from("<I", e)
    e = e[4:]
    if m > MAX_EXTRA_KEYS + 2:  # the caller's, and the namespace's LoRA id and salt
        raise CorruptBlock(f"{m} extra keys")
    for _ in range(m):
        if len(e) < 4 or struct.unpack_from("<I", e)[0] > len(e) - 4:
            raise CorruptBlock("extra key overruns the extension")
        k = struct.unpack_from("<I", e)[0]
        h.extra.append(e[4:4 + k])
        e = e[4 + k:]
    if any(e):
        raise CorruptBlock("extension padding is not zero")
    h.chain = block_link(_SCHEMES[h.key_scheme], h.parent_link, tb, h.extra)[:KEY_SIZE]
    if (group_key(h.chain, h.group) if h.group is not None else h.chain) != key:
        raise CorruptBlock("key is not H(parent ‖ tokens ‖ extra keys)")
    return h


def _decode_group(h, grp, kind, anchor, window):
    """The group fields (block.Header.decodeGroup): all zero without a group."""
    h.group, h.group_kind, h.anchor, h.window_blocks = None, None, None, 0
    if grp == 0:
        if kind or anchor or window:
            raise CorruptBlock("group fields set in a record of no group")
        if h.kv_layout == "state":
            raise CorruptBlock("a state layout outside a state group")
        return
    if grp > MAX_GROUPS or anchor > MAX_GROUPS or not 1 <= kind <= len(GROUP_KINDS):
        raise CorruptBlock(f"group {grp - 1}, kind {kind - 1}, anchor {anchor - 1}")
    k = GROUP_KINDS[kind - 1]
    if (k == "state") != (h.kv_layout == "state") or (k == "sliding") != (window > 0) or \
            (k in ("full", "indexer") and anchor):
        raise CorruptBlock(f"a {k} group's record with layout {h.kv_layout}, window {window}, anchor {anchor - 1}")
    h.group, h.group_kind, h.anchor, h.window_blocks = grp - 1, k, anchor - 1, window


def check_namespace(h, ns, part=None, group=None):
    """Raises CorruptBlock unless header h was produced under ns (as group `group`'s record, in a
    namespace with groups) and holds part (default the whole record), with the payload length
    that part has."""
    try:
        v = record_view(ns, group)
    except ValueError as e:
        raise CorruptBlock(str(e)) from None
    p = whole_part(v) if part is None else Part(*part)
    if (h.digest != ns.digest(h.key_version) or h.dtype != DTYPE_IDS[v.dtype] or
            (h.layers, h.kv_heads, h.head_dim) != (v.layers, v.kv_heads, v.head_dim)
            or (h.kv_layout, h.latent_dim, h.scales, h.key_scheme) != (v.kv_layout, v.latent_dim, v.scales, ns.key_scheme)
            or h.state_bytes != getattr(v, "state_bytes", 0)
            or (h.group, h.group_kind, h.anchor, h.window_blocks) != _header_group(ns, group)
            or len(h.tokens) != 4 * ns.block_tokens):
        raise CorruptBlock("block of another namespace, group or layout")
    if tuple(h.part) != tuple(p) or h.payload_len != part_len(v, ns.block_tokens, p):
        raise CorruptBlock(f"record of {h.part} ({h.payload_len} bytes), want {p}")


def _header_group(ns, group):
    g, kind, anchor, window = group_fields(ns, group)
    if not g:
        return None, None, None, 0
    return g - 1, GROUP_KINDS[kind - 1], anchor - 1, window


def decode_record(ns, record, key_version=KEY_VERSION, group=None):
    """Verifies a whole encoded record (a block or a part; of group `group` in a namespace with
    groups) of ns: header, namespace, its part range, payload length and checksum. Returns
    (Header, payload memoryview)."""
    h = decode_header(record, key_version)
    try:
        check_part(record_view(ns, group), h.part)
    except (BadPart, ValueError) as e:
        raise CorruptBlock(str(e)) from None
    check_namespace(h, ns, h.part, group)
    payload = memoryview(record)[h.header_len:]
    if payload.nbytes != h.payload_len:
        raise CorruptBlock(f"payload of {payload.nbytes} bytes, header says {h.payload_len}")
    if _xxhash.available and _xxhash.xxh64(bytes(payload)) != h.checksum:
        raise CorruptBlock("payload checksum mismatch")
    return h, payload


def encode_record(ns, parent, tokens, payload, tenant_tag=0, key_version=KEY_VERSION, extra=None, part=None,
                  group=None):
    """A whole encoded record: encode_header for payload (bytes-like, the part's bytes), then
    the payload. Returns (record bytes, link)."""
    pl = bytes(memoryview(payload).cast("B"))
    v = record_view(ns, group)
    p = whole_part(v) if part is None else Part(*part)
    if len(pl) != part_len(v, ns.block_tokens, p):
        what = f"groups[{group}].state_bytes: a state" if getattr(v, "kv_layout", "") == "state" else "payload"
        raise ValueError(f"{what} of {len(pl)} bytes, part {p} holds {part_len(v, ns.block_tokens, p)}")
    h, link = encode_header(ns, parent, tokens, _xxhash.xxh64(pl), tenant_tag, key_version, extra, p, group)
    return h + pl, link


# ---- objects (block/object.go) ----
#
# An object record is the block format with the KV layout byte (7) 0xFF and no tokens; the object's
# fields lie where a block keeps its layout and part::
#
#      7  1  0xFF                      60  4  piece j            80  8  payload length (this piece's)
#      8  4  header length: 128 + name 64  4  piece count m      88  8  xxhash64 of the payload
#            length, rounded up to 64  68  4  lease TTL in ms    96  8  tenant tag
#     24 16  key (piece j's)           72  4  name length       104  8  the object's whole size
#     40 16  the namespace's root key  76  4  zero              112  8  generation (the writer's nonce)
#     57  1  the namespace's key scheme                         120  8  xxhash64 of [0,120) and the name
#     58  1  pin (0 none, 1 soft, 2 hard)                       128  n  the name (UTF-8), zeros to 64
#
# object key o = sha256(root || b"object" || name)[:16]; piece j >= 1: sha256(o || b"piece" || u32le j)[:16].

OBJECT_KIND = 0xFF
MAX_OBJECT_NAME = 1024
MAX_PIECES = 1 << 20
PINS = ("none", "soft", "hard")
_OBJ = struct.Struct("<4sHBBII Q16s16s BBBB IIII4x QQQ QQ")
assert _OBJ.size == HEADER_SUM_OFF


def check_object_name(name):
    """The name as UTF-8 bytes; ValueError when it cannot name an object (empty, over
    MAX_OBJECT_NAME bytes, not valid UTF-8)."""
    if isinstance(name, (bytes, bytearray, memoryview)):
        try:
            b = bytes(name)
            b.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("object name is not valid UTF-8") from None
    elif isinstance(name, str):
        try:
            b = name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("object name is not valid UTF-8 (lone surrogates)") from None
    else:
        raise TypeError(f"object name: want str, got {type(name).__name__}")
    if not b:
        raise ValueError("object name is empty")
    if len(b) > MAX_OBJECT_NAME:
        raise ValueError(f"object name of {len(b)} bytes, the limit is {MAX_OBJECT_NAME}")
    return b


def object_key(root, name):
    """The key of the object name (str or UTF-8 bytes) in the namespace whose root is root."""
    import hashlib
    b = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    return hashlib.sha256(bytes(root[:KEY_SIZE]) + b"object" + b).digest()[:KEY_SIZE]


def piece_key(obj_key, j):
    """The key of piece j of the object whose key is obj_key (itself for piece 0)."""
    import hashlib
    if j == 0:
        return obj_key
    return hashlib.sha256(obj_key + b"piece" + struct.pack("<I", j)).digest()[:KEY_SIZE]


def object_header_len(name_len):
    return (FIXED_HEADER_LEN + name_len + HEADER_ALIGN - 1) // HEADER_ALIGN * HEADER_ALIGN


def encode_object_header(ns, name, piece, pieces, size, generation, payload_len, payload_checksum, tenant_tag=0,
                         pin=0, ttl_ms=0, key_version=KEY_VERSION):
    """The header of piece `piece` of `pieces` of the object name (UTF-8 bytes, checked) of ns,
    whose whole value is size bytes. Returns (header bytes, key)."""
    if not (1 <= pieces <= MAX_PIECES and 0 <= piece < pieces) or payload_len > size:
        raise ValueError(f"object piece {piece} of {pieces}, {payload_len} of {size} bytes")
    if pin not in (0, 1, 2) or not 0 <= ttl_ms < 1 << 32:
        raise ValueError(f"pin {pin}, TTL {ttl_ms} ms")
    root = ns.root(key_version)
    key = piece_key(object_key(root, name), piece)
    hl = object_header_len(len(name))
    fixed = _OBJ.pack(MAGIC, BLOCK_VERSION, key_version, OBJECT_KIND, hl, 0, ns.digest(key_version), key, root,
                      0, KEY_SCHEMES.index(ns.key_scheme), pin, 0, piece, pieces, ttl_ms, len(name),
                      payload_len, payload_checksum, tenant_tag, size, generation)
    h = bytearray(hl)
    h[:HEADER_SUM_OFF] = fixed
    struct.pack_into("<Q", h, HEADER_SUM_OFF, _xxhash.xxh64(fixed + name))
    h[FIXED_HEADER_LEN:FIXED_HEADER_LEN + len(name)] = name
    return bytes(h), key


def decode_object_header_at(addr, n, key_version=KEY_VERSION, expect=None):
    """decode_object_header of the n-byte record at address addr of process memory (a mapping
    of the node's shared memory): reads the header's bytes alone."""
    import ctypes
    if n < FIXED_HEADER_LEN:
        raise CorruptBlock(f"{n} bytes, shorter than a header")
    (nlen,) = struct.unpack_from("<I", ctypes.string_at(addr + 72, 4))
    hl = object_header_len(min(nlen, MAX_OBJECT_NAME))
    if hl > n:
        raise CorruptBlock(f"object header of {hl} bytes in a record of {n}")
    return decode_object_header(ctypes.string_at(addr, hl), key_version, expect)


class ObjectHeader:
    __slots__ = ("key", "root", "digest", "name", "piece", "pieces", "size", "generation", "pin", "ttl_ms",
                 "payload_len", "checksum", "tenant", "header_len")


def decode_object_header(b, key_version=KEY_VERSION, expect=None):
    """Parses and verifies the object record header at the start of b (bytes-like): magic,
    versions, lengths, header checksum, padding, and key = the piece's key under its name.
    expect, (key, root, name) of a reader that computed key from root and name itself, spares
    hashing the key again: the header must name exactly those. Raises CorruptBlock."""
    mv = memoryview(b)
    if len(mv) < FIXED_HEADER_LEN:
        raise CorruptBlock(f"{len(mv)} bytes, shorter than a header")
    (magic, version, kv, kind, hl, n, digest, key, root, z56, _scheme, pin, z59, piece, pieces, ttl, nlen,
     plen, csum, tenant, size, gen) = _OBJ.unpack_from(mv)
    if magic != MAGIC or version != BLOCK_VERSION or kv != key_version:
        raise CorruptBlock(f"magic {magic!r}, format {version}, key format {kv}")
    if kind != OBJECT_KIND or n or z56 or z59 or mv[76:80] != b"\0\0\0\0":
        raise CorruptBlock("not an object record")
    if not 1 <= nlen <= MAX_OBJECT_NAME or hl != object_header_len(nlen) or len(mv) < hl:
        raise CorruptBlock(f"object header length {hl} for a name of {nlen} bytes")
    name = bytes(mv[FIXED_HEADER_LEN:FIXED_HEADER_LEN + nlen])
    (hsum,) = struct.unpack_from("<Q", mv, HEADER_SUM_OFF)
    if _xxhash.xxh64(bytes(mv[:HEADER_SUM_OFF]) + name) != hsum:
        raise CorruptBlock("header checksum mismatch")
    if bytes(mv[FIXED_HEADER_LEN + nlen:hl]).strip(b"\0"):
        raise CorruptBlock("header padding is not zero")
    if pin > 2 or not (1 <= pieces <= MAX_PIECES and piece < pieces) or plen > size:
        raise CorruptBlock(f"pin {pin}, piece {piece} of {pieces}, {plen} of {size} bytes")
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptBlock("object name is not valid UTF-8") from None
    if expect is not None:
        if (key, root, name) != expect:
            raise CorruptBlock("not the object asked for")
    elif piece_key(object_key(root, name), piece) != key:
        raise CorruptBlock("key is not the key of the piece under its name")
    h = ObjectHeader()
    h.key, h.root, h.digest, h.name, h.piece, h.pieces, h.size, h.generation = key, root, digest, name, piece, pieces, size, gen
    h.pin, h.ttl_ms, h.payload_len, h.checksum, h.tenant, h.header_len = pin, ttl, plen, csum, tenant, hl
    return h
