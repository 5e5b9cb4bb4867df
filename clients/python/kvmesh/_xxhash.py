"""xxhash64 (seed 0 unless given), as Go's github.com/cespare/xxhash computes it.

The node checksums frames, block headers and payloads with xxhash64. Debian's
libxxhash (package libxxhash0, a dependency of much of the base system) does
it at memory speed through ctypes. Without it, ``available`` is False: keys
and the gRPC path still work (the payload checksum is optional there); the
shared-memory path, whose frames carry checksums, is then not used.
"""
import ctypes
import ctypes.util

def _load():
    for name in ("libxxhash.so.0", ctypes.util.find_library("xxhash")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            f = lib.XXH64
        except (OSError, AttributeError):
            continue
        f.restype = ctypes.c_uint64
        f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]
        return f
    return None


_lib = _load()

#: True when libxxhash was found.
available = _lib is not None


def xxh64_ptr(ptr, n, seed=0):
    """xxhash64 of n bytes at address ptr (libxxhash only)."""
    return _lib(ptr, n, seed)


def xxh64(data, seed=0):
    """xxhash64 of a bytes-like object (bytes, bytearray, memoryview, mmap slice)."""
    if _lib is None:
        raise RuntimeError("kvmesh: xxhash64 needs libxxhash.so.0 (Debian: apt-get install libxxhash0)")
    if isinstance(data, bytes):
        return _lib(data, len(data), seed)
    mv = memoryview(data).cast("B")
    n = mv.nbytes
    if n == 0:
        return _lib(None, 0, seed)
    if mv.readonly:
        # ctypes cannot take the address of read-only memory without a copy
        # unless numpy is there to find it.
        try:
            import numpy as np
            return _lib(np.frombuffer(mv, np.uint8).ctypes.data, n, seed)
        except ImportError:
            return _lib(bytes(mv), n, seed)
    buf = (ctypes.c_char * n).from_buffer(mv)
    return _lib(ctypes.addressof(buf), n, seed)


def _load_stream():
    if _lib is None:
        return None
    try:
        lib = ctypes.CDLL("libxxhash.so.0")
        fns = (lib.XXH64_createState, lib.XXH64_reset, lib.XXH64_update, lib.XXH64_digest, lib.XXH64_freeState)
    except (OSError, AttributeError):
        return None
    fns[0].restype = ctypes.c_void_p
    fns[0].argtypes = []
    fns[1].argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    fns[2].argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fns[3].restype = ctypes.c_uint64
    fns[3].argtypes = [ctypes.c_void_p]
    fns[4].argtypes = [ctypes.c_void_p]
    return fns


_stream = _load_stream()


def xxh64_parts(addrs_lens, seed=0):
    """xxhash64 of the concatenation of the memory ranges (address, length)."""
    create, reset, update, digest, free = _stream
    st = create()
    try:
        reset(st, seed)
        for a, n in addrs_lens:
            update(st, a, n)
        return digest(st)
    finally:
        free(st)
