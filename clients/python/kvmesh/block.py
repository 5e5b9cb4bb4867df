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
[layer][K|V][token][kv_head][head_dim].
"""
import struct

from . import _xxhash
from ._namespace import _ALGOS, DTYPE_IDS, KEY_VERSION, token_bytes

MAGIC = b"KVMB"
BLOCK_VERSION = 2
FIXED_HEADER_LEN = 112
HEADER_SUM_OFF = 104
HEADER_ALIGN = 64

_FIXED = struct.Struct("<4sHBxII Q16s16s B3xIIII4x QQQ")
assert _FIXED.size == HEADER_SUM_OFF


class CorruptBlock(ValueError):
    """Bytes that are not a block this client may use."""


def header_len(n_tokens):
    return (FIXED_HEADER_LEN + 4 * n_tokens + HEADER_ALIGN - 1) // HEADER_ALIGN * HEADER_ALIGN


def encode_header(ns, parent, tokens, payload_checksum, tenant_tag=0, key_version=KEY_VERSION):
    """The header of the block of ns holding tokens (exactly ns.block_tokens), chained from
    parent, whose payload has xxhash64 payload_checksum. Returns (header bytes, key)."""
    tb = token_bytes(tokens)
    n = len(tb) // 4
    if n != ns.block_tokens:
        raise ValueError(f"block has {n} tokens, namespace blocks hold {ns.block_tokens}")
    key = _ALGOS[key_version].chain(parent, tb, len(tb))[0]
    hl = header_len(n)
    kv_byte = key_version
    fixed = _FIXED.pack(MAGIC, BLOCK_VERSION, kv_byte, hl, n, ns.digest(key_version), key, parent,
                        DTYPE_IDS[ns.dtype], ns.layer_start, ns.layer_end, ns.kv_heads, ns.head_dim,
                        ns.block_bytes, payload_checksum, tenant_tag)
    hsum = _xxhash.xxh64(fixed + tb)
    h = bytearray(hl)
    h[:HEADER_SUM_OFF] = fixed
    struct.pack_into("<Q", h, HEADER_SUM_OFF, hsum)
    h[FIXED_HEADER_LEN:FIXED_HEADER_LEN + len(tb)] = tb
    return bytes(h), key


class Header:
    __slots__ = ("key_version", "digest", "key", "parent", "dtype", "layer_start", "layer_end", "kv_heads",
                 "head_dim", "payload_len", "checksum", "tenant", "tokens", "header_len")


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
    if version != BLOCK_VERSION or kv != want_kv:
        raise CorruptBlock(f"block format {version}, key format {kv}: not this client's ({BLOCK_VERSION}, {want_kv})")
    if n == 0 or hl != header_len(n) or len(mv) < hl:
        raise CorruptBlock(f"header length {hl} for {n} tokens")
    tb = bytes(mv[FIXED_HEADER_LEN:FIXED_HEADER_LEN + 4 * n])
    (hsum,) = struct.unpack_from("<Q", mv, HEADER_SUM_OFF)
    if _xxhash.xxh64(bytes(mv[:HEADER_SUM_OFF]) + tb) != hsum:
        raise CorruptBlock("header checksum mismatch")
    h = Header()
    h.key_version, h.digest, h.key, h.parent = key_version, digest, key, parent
    h.dtype, h.layer_start, h.layer_end, h.kv_heads, h.head_dim = dtype, ls, le, heads, hd
    h.payload_len, h.checksum, h.tenant, h.header_len = plen, csum, tenant, hl
    h.tokens = tb
    if _ALGOS[key_version].chain(parent, tb, len(tb))[0] != key:
        raise CorruptBlock("key is not H(parent ‖ tokens)")
    return h


def check_namespace(h, ns):
    """Raises CorruptBlock unless header h was produced under ns."""
    if (h.digest != ns.digest(h.key_version) or h.dtype != DTYPE_IDS[ns.dtype] or
            (h.layer_start, h.layer_end, h.kv_heads, h.head_dim) != (ns.layer_start, ns.layer_end, ns.kv_heads, ns.head_dim)
            or len(h.tokens) != 4 * ns.block_tokens or h.payload_len != ns.block_bytes):
        raise CorruptBlock("block of another namespace or layout")
