"""The encoded block header (block/block.go, block format 2), for the data planes.

All integers little-endian; the header is padded to a multiple of 64 bytes::

      0  4  magic "KVMB"           56  1  KV dtype        80  8  payload length
      4  2  format version (2)     60  4  layer start     88  8  xxhash64 of the payload
      6  1  key format version     64  4  layer end       96  8  tenant tag (0: none)
      8  4  header length          68  4  KV heads       104  8  xxhash64 of [0,104) and the tokens
     12  4  token count n          72  4  head dim       112 4n  token ids
     16  8  namespace digest
     24 16  key, 40 16 parent key

Byte 6 is the key format (prefixhash.KeyVersion). Payloads are
[layer][K|V][token][kv_head][head_dim] (split) or [layer][token][latent_dim]
(latent), then the float32 scales when the namespace has them.

Format 3 (store/block.go) is written for blocks that use a latent layout,
scales, the vllm key scheme or extra keys: byte 7 the KV layout, 57 the key
scheme, 58 the scales, 76 the latent dim, and after the tokens an extension
(u32 length X, then X bytes: the parent's 32-byte vLLM hash under the vllm
scheme, u32 count, (u32 length ‖ bytes) per extra key) that the header
checksum covers. A block with none of them is format 2, as before.
"""
import struct

from . import _xxhash
from ._namespace import (_ALGOS, DTYPE_IDS, KEY_SCHEMES, KEY_SIZE, KV_LAYOUTS, MAX_EXTRA_KEYS, SCALES, KEY_VERSION,
                         block_link, token_bytes)

MAGIC = b"KVMB"
BLOCK_VERSION = 2
FIXED_HEADER_LEN = 112
HEADER_SUM_OFF = 104
HEADER_ALIGN = 64

_FIXED = struct.Struct("<4sHBxII Q16s16s B3xIIII4x QQQ")
assert _FIXED.size == HEADER_SUM_OFF


class CorruptBlock(ValueError):
    """Bytes that are not a block this client may use."""


def header_len(n_tokens, ext=None):
    """The header length of a block of n_tokens: format 2, or format 3 with an extension of
    ext bytes (its length field excluded)."""
    n = FIXED_HEADER_LEN + 4 * n_tokens + (0 if ext is None else 4 + ext)
    return (n + HEADER_ALIGN - 1) // HEADER_ALIGN * HEADER_ALIGN


def _v3(ns):
    return ns.kv_layout != "split" or ns.scales != "none" or ns.key_scheme != "kvmesh" or ns.extra_key_bytes != 0


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
    """The header length of every block of ns."""
    return header_len(ns.block_tokens, ns.extension_room() if _v3(ns) else None)


def encode_header(ns, parent, tokens, payload_checksum, tenant_tag=0, key_version=KEY_VERSION, extra=None):
    """The header of the block of ns holding tokens (exactly ns.block_tokens), chained from
    parent (its link: the parent key, or under the vllm scheme the parent's 32-byte hash),
    whose payload has xxhash64 payload_checksum and whose key covers extra (the caller's extra
    keys; the namespace adds its own). Returns (header bytes, link); link[:16] is the key."""
    tb = token_bytes(tokens)
    n = len(tb) // 4
    if n != ns.block_tokens:
        raise ValueError(f"block has {n} tokens, namespace blocks hold {ns.block_tokens}")
    extra = ns.block_extra(ns.key_scheme == "vllm" and parent == ns.root_link(key_version), extra)
    if len(extra) > MAX_EXTRA_KEYS + 2:
        raise ValueError(f"extra_keys: {len(extra)} keys, the limit is {MAX_EXTRA_KEYS}")
    link = block_link(ns, parent, tb, extra)
    key = link[:KEY_SIZE]
    v3 = _v3(ns)
    ext = _extension(ns, parent, extra) if v3 else None
    hl = header_len(n, None if ext is None else len(ext))
    fixed = bytearray(_FIXED.pack(MAGIC, 3 if v3 else BLOCK_VERSION, key_version, hl, n, ns.digest(key_version), key,
                                  parent[:KEY_SIZE], DTYPE_IDS[ns.dtype], ns.layer_start, ns.layer_end, ns.kv_heads,
                                  ns.head_dim, ns.block_bytes, payload_checksum, tenant_tag))
    if v3:
        fixed[7] = KV_LAYOUTS.index(ns.kv_layout)
        fixed[57] = KEY_SCHEMES.index(ns.key_scheme)
        fixed[58] = SCALES.index(ns.scales)
        struct.pack_into("<I", fixed, 76, ns.latent_dim)
    tail = tb + (struct.pack("<I", len(ext)) + ext if v3 else b"")
    hsum = _xxhash.xxh64(bytes(fixed) + tail)
    h = bytearray(hl)
    h[:HEADER_SUM_OFF] = fixed
    struct.pack_into("<Q", h, HEADER_SUM_OFF, hsum)
    h[FIXED_HEADER_LEN:FIXED_HEADER_LEN + len(tail)] = tail
    return bytes(h), link


class Header:
    __slots__ = ("key_version", "digest", "key", "parent", "dtype", "layer_start", "layer_end", "kv_heads",
                 "head_dim", "payload_len", "checksum", "tenant", "tokens", "header_len", "kv_layout", "key_scheme",
                 "scales", "latent_dim", "parent_link", "extra")


def decode_header(b, key_version=KEY_VERSION):
    """Parses and verifies the header at the start of b (bytes-like): magic, versions,
    lengths, header checksum, and key = H(parent ‖ tokens). Raises CorruptBlock."""
    mv = memoryview(b)
    if len(mv) < FIXED_HEADER_LEN:
        raise CorruptBlock(f"{len(mv)} bytes, shorter than a block header")
    (magic, version, kv, hl, n, digest, key, parent, dtype, ls, le, heads, hd, plen, csum,
     tenant) = _FIXED.unpack_from(mv)
    if magic != MAGIC:
        raise CorruptBlock(f"bad magic {magic!r}")
    want_kv = key_version
    if version not in (2, 3) or kv != want_kv:
        raise CorruptBlock(f"block format {version}, key format {kv}: not this client's (2 or 3, {want_kv})")
    v3 = version == 3
    if n == 0 or len(mv) < hl or (not v3 and hl != header_len(n)) or (v3 and hl < header_len(n, 4)):
        raise CorruptBlock(f"header length {hl} for {n} tokens")
    tb = bytes(mv[FIXED_HEADER_LEN:FIXED_HEADER_LEN + 4 * n])
    ext = b""
    if v3:
        (x,) = struct.unpack_from("<I", mv, FIXED_HEADER_LEN + 4 * n)
        if x < 4 or header_len(n, x) != hl:
            raise CorruptBlock(f"extension of {x} bytes in a header of {hl}")
        ext = bytes(mv[FIXED_HEADER_LEN + 4 * n:FIXED_HEADER_LEN + 4 * n + 4 + x])
    (hsum,) = struct.unpack_from("<Q", mv, HEADER_SUM_OFF)
    if _xxhash.xxh64(bytes(mv[:HEADER_SUM_OFF]) + tb + ext) != hsum:
        raise CorruptBlock("header checksum mismatch")
    h = Header()
    h.key_version, h.digest, h.key, h.parent = key_version, digest, key, parent
    h.dtype, h.layer_start, h.layer_end, h.kv_heads, h.head_dim = dtype, ls, le, heads, hd
    h.payload_len, h.checksum, h.tenant, h.header_len = plen, csum, tenant, hl
    h.tokens = tb
    h.kv_layout, h.key_scheme, h.scales, h.latent_dim = "split", "kvmesh", "none", 0
    h.parent_link, h.extra = parent, []
    if not v3:
        if _ALGOS[key_version].chain(parent, tb, len(tb))[0] != key:
            raise CorruptBlock("key is not H(parent ‖ tokens)")
        return h
    try:
        h.kv_layout, h.key_scheme, h.scales = KV_LAYOUTS[mv[7]], KEY_SCHEMES[mv[57]], SCALES[mv[58]]
    except IndexError:
        raise CorruptBlock("unknown layout, key scheme or scales") from None
    (h.latent_dim,) = struct.unpack_from("<I", mv, 76)
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

    class _NS:  # what block_link reads of a namespace
        key_scheme = h.key_scheme
    if block_link(_NS, h.parent_link, tb, h.extra)[:KEY_SIZE] != key:
        raise CorruptBlock("key is not H(parent ‖ tokens ‖ extra keys)")
    return h


def check_namespace(h, ns):
    """Raises CorruptBlock unless header h was produced under ns."""
    if (h.digest != ns.digest(h.key_version) or h.dtype != DTYPE_IDS[ns.dtype] or
            (h.layer_start, h.layer_end, h.kv_heads, h.head_dim) != (ns.layer_start, ns.layer_end, ns.kv_heads, ns.head_dim)
            or (h.kv_layout, h.latent_dim, h.scales, h.key_scheme) != (ns.kv_layout, ns.latent_dim, ns.scales, ns.key_scheme)
            or len(h.tokens) != 4 * ns.block_tokens or h.payload_len != ns.block_bytes):
        raise CorruptBlock("block of another namespace or layout")
