"""Objects by name (issue 33): the I/O of kvmesh.Client's object methods and of
kvmesh.mooncake.MooncakeDistributedStore.

An object is stored as object records (block.encode_object_header), one per
piece of at most piece_bytes, keyed from its name. Records move as blocks do:
through the node's shared memory when it runs on this host (puts inline from
the caller's memory in one sendmsg, gets read in place from the node's DRAM
arena), else its TCP data plane, and through the node's ObjectService for what
the data plane lacks (the rest of the cluster) or when it fails. A put writes
an object's pieces after the first, then the first (its commit); a reader that
finds the first piece but not the others (evicted since) reports a miss and
removes the remains. Pieces carry the writer's random generation: a reader
never joins pieces of two puts.

Values are given and taken as "runs": lists of buffers (bytes-like objects,
numpy arrays, ctypes arrays over raw memory) that are read or filled where
they lie: no intermediate Python bytes on the data planes.
"""
import concurrent.futures
import contextlib
import ctypes
import os
import threading

import numpy as np

from . import _shm, _xxhash, block
from .errors import KVMeshError, from_rpc
from .v1 import cache_pb2, object_pb2, object_pb2_grpc

DEFAULT_PIECE_BYTES = 4 << 20
_CHUNK = 1 << 20  # bytes per gRPC message


class Miss:
    """A key the node (and the cluster) does not hold."""


def as_u8(buf):
    """A flat uint8 numpy view of a buffer (no copy)."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, np.uint8)


def raw(ptr, size):
    """A writable uint8 numpy view of size bytes of process memory at address ptr."""
    if size == 0:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))


def runs_len(runs):
    return sum(r.nbytes for r in runs)


def slice_runs(runs, lo, hi):
    """The bytes [lo, hi) of the concatenation of runs, as views."""
    out, off = [], 0
    for r in runs:
        a, b = max(lo, off), min(hi, off + r.nbytes)
        if a < b:
            out.append(r[a - off:b - off])
        off += r.nbytes
    return out


def checksum(runs):
    if len(runs) == 1 and runs[0].nbytes:
        return _xxhash.xxh64_ptr(runs[0].ctypes.data, runs[0].nbytes)
    return _xxhash.xxh64_parts([(r.ctypes.data, r.nbytes) for r in runs if r.nbytes])


class Span:
    """n bytes of process memory at address addr; keep holds what owns them."""
    __slots__ = ("addr", "n", "keep")

    def __init__(self, addr, n, keep=None):
        self.addr, self.n, self.keep = addr, n, keep

    def copy(self):
        """A Span over a private copy of the bytes (which outlives the memory they were in)."""
        b = np.empty(self.n, np.uint8)
        if self.n:
            ctypes.memmove(b.ctypes.data, self.addr, self.n)
        return Span(b.ctypes.data, self.n, b)

    def tobytes(self):
        return ctypes.string_at(self.addr, self.n)


# Copies may be split over a few threads (ctypes.memmove releases the GIL): KVMESH_COPY_THREADS,
# default 1. On the shared, loaded 2-core hosts kvmesh is built on, a second thread did not
# raise batch_get_into's rate (its wake-ups cost about what it copies; issue 33's note has the
# figures). Hosts with idle cores may do better with 2-4.
_PARALLEL = max(1, min(8, int(os.environ.get("KVMESH_COPY_THREADS", "1") or 1)))
_SPLIT = 512 << 10  # copies of at least this many bytes are split
_pool = None
_pool_lock = threading.Lock()


def _copy_pool():
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = concurrent.futures.ThreadPoolExecutor(_PARALLEL - 1, thread_name_prefix="kvmesh-copy")
    return _pool


def _memmove(dst, src, n):
    """memmove of n bytes, split over _PARALLEL threads when large."""
    if n < _SPLIT or _PARALLEL == 1:
        ctypes.memmove(dst, src, n)
        return
    pool = _copy_pool()
    k = min(_PARALLEL, n // (_SPLIT // 2))
    step = (n // k + 63) & ~63
    futs = [pool.submit(ctypes.memmove, dst + a, src + a, min(step, n - a)) for a in range(step, n, step)]
    ctypes.memmove(dst, src, min(step, n))
    for f in futs:
        f.result()


# A batch read's copies (many values of a MiB, say) are gathered while its records are read and
# run together before the node's memory they come from is released (split into _PARALLEL runs
# of about equal bytes, one thread each, when KVMESH_COPY_THREADS asks for more than one). With
# threads, splitting each value on its own cost a handoff per value (about 100 us on a loaded
# 2-core host, as much as the copy of a MiB); gathered, two per batch.
_tl = threading.local()


@contextlib.contextmanager
def deferred_copies():
    """Within it (on this thread), scatter queues its copies; flush_copies runs them. ObjectIO.get
    flushes before it releases each batch of records, and the context flushes what is left."""
    prev = getattr(_tl, "copies", None)
    _tl.copies = []
    try:
        yield
        flush_copies()
    finally:
        _tl.copies = prev


def flush_copies():
    """Runs the copies deferred_copies queued on this thread, split over threads."""
    tasks = getattr(_tl, "copies", None)
    if not tasks:
        return
    _tl.copies = []
    total = sum(t[2] for t in tasks)
    if _PARALLEL == 1 or total < _SPLIT:
        for d, src, n, _keep in tasks:
            ctypes.memmove(d, src, n)
        return
    per = (total // _PARALLEL + 63) & ~63
    groups, cur, room = [], [], per
    for d, src, n, _keep in tasks:
        while n:
            m = n if len(groups) == _PARALLEL - 1 else min(n, room)
            cur.append((d, src, m))
            d, src, n, room = d + m, src + m, n - m, room - m
            if room <= 0 and len(groups) < _PARALLEL - 1:
                groups.append(cur)
                cur, room = [], per
    groups.append(cur)
    futs = [_copy_pool().submit(_copy_run, g) for g in groups[1:] if g]
    _copy_run(groups[0])
    for f in futs:
        f.result()


def _copy_run(tasks):
    for d, src, n in tasks:
        ctypes.memmove(d, src, n)


def scatter(spans, dst):
    """Copies the bytes of spans, in order, into dst, a list of (address, size) of writable
    memory, as far as dst reaches; returns the bytes copied. Within deferred_copies the copies
    are queued (with the spans, which keep their memory alive) until flush_copies."""
    tasks = getattr(_tl, "copies", None)
    k, at, done = 0, 0, 0  # dst run k, bytes of it filled
    for sp in spans:
        src, left = sp.addr, sp.n
        while left and k < len(dst):
            d, size = dst[k]
            n = min(left, size - at)
            if n and tasks is not None:
                tasks.append((d + at, src, n, sp))
            elif n:
                _memmove(d + at, src, n)
            src, left, at, done = src + n, left - n, at + n, done + n
            if at == size:
                k, at = k + 1, 0
        if left:
            break
    return done


class Record:
    """One piece to put: its key, encoded header and payload runs; obj is the index of its object."""
    __slots__ = ("obj", "key", "head", "runs")

    def __init__(self, obj, key, head, runs):
        self.obj, self.key, self.head, self.runs = obj, key, head, runs


class ObjectIO:
    """Object puts and gets through a kvmesh.Client's connections."""

    def __init__(self, client):
        self.c = client
        self._stub = object_pb2_grpc.ObjectServiceStub(client._channel)

    # ---- helpers ----

    def _ns(self, ns):
        m = self.c.meta()
        return ns.salted(m.salt), m

    def _call(self, fn, req):
        return self.c._call(fn, req)

    def _conn(self, m):
        conn = self.c._shm_conn(m)
        if conn is not None:
            return conn, "shm"
        conn = self.c._tcp_conn(m)
        return (conn, "tcp") if conn is not None else (None, "")

    # ---- put ----

    def plan(self, ns, items, piece_bytes=DEFAULT_PIECE_BYTES, pin=0, ttl_ms=0):
        """Records of items, (name, runs) each: returns (first pieces, other pieces, errors), errors[i]
        an exception for an item that cannot be stored (a bad name), else None."""
        kns, m = self._ns(ns)
        errors = [None] * len(items)
        first, rest = [], []
        for i, (name, runs) in enumerate(items):
            try:
                nb = block.check_object_name(name)
            except (ValueError, TypeError) as e:
                errors[i] = e
                continue
            size = runs_len(runs)
            pieces = max(1, -(-size // piece_bytes))
            if pieces > block.MAX_PIECES:
                errors[i] = ValueError(f"object of {size} bytes: more than {block.MAX_PIECES} pieces")
                continue
            gen = int.from_bytes(os.urandom(8), "little")
            for j in range(pieces):
                pr = slice_runs(runs, j * piece_bytes, min(size, (j + 1) * piece_bytes))
                plen = runs_len(pr)
                head, key = block.encode_object_header(kns, nb, j, pieces, size, gen, plen, checksum(pr), m.tag, pin, ttl_ms)
                (first if j == 0 else rest).append(Record(i, key, head, pr))
        return first, rest, errors

    def put(self, recs, errors):
        """Stores recs over the data plane, then what it did not take over ObjectService.Put; sets
        errors[rec.obj] to the exception of a record refused."""
        if not recs:
            return
        m = self.c.meta()
        conn, path = self._conn(m)
        left = recs
        if conn is not None:
            try:
                keys = [r.key for r in recs]
                st = conn.put_publish(keys, keys, [r.head for r in recs], [r.runs for r in recs])
                left = [r for r, s in zip(recs, st) if s != _shm.STATUS_OK]
                self.c.counters[path + "_put"] += len(recs) - len(left)
            except (OSError, _shm.ShmError):
                left = recs
        if not left:
            return
        for lo in range(0, len(left), 256):
            batch = left[lo:lo + 256]
            try:
                resp = self._stub.Put(self._put_stream(batch), timeout=self.c.timeout, metadata=self.c._md)
            except Exception as e:  # grpc.RpcError
                raise from_rpc(e) from None
            if len(resp.results) != len(batch):
                raise KVMeshError(f"put objects: {len(resp.results)} results for {len(batch)} records")
            for r, res in zip(batch, resp.results):
                if res.status != object_pb2.ITEM_STATUS_OK and errors[r.obj] is None:
                    errors[r.obj] = item_error(res)
            self.c.counters["grpc_put"] += sum(res.status == object_pb2.ITEM_STATUS_OK for res in resp.results)

    @staticmethod
    def _put_stream(recs):
        for i, r in enumerate(recs):
            n = len(r.head) + runs_len(r.runs)
            yield object_pb2.ObjectServicePutRequest(index=i, record_len=n, offset=0, data=r.head)
            off = len(r.head)
            for run in r.runs:
                for a in range(0, run.nbytes, _CHUNK):
                    part = run[a:a + _CHUNK]
                    yield object_pb2.ObjectServicePutRequest(index=i, offset=off, data=part.tobytes())
                    off += part.nbytes

    # ---- get ----

    def get(self, keys, consume, verify=False, expect=None):
        """Reads records by key. consume(i, header, payload) is called for every record found and
        verified, payload a Span (address, length) of memory valid during the call only (it may
        lie in the node's shared memory); keys not found are not passed. expect[i], (key, root,
        name) when the caller computed keys[i] from them, spares rehashing the key
        (block.decode_object_header). Returns the set of indexes found."""
        m = self.c.meta()
        found = set()

        def deliver(i, addr, n, full, keep=None):
            try:
                h = block.decode_object_header_at(addr, n, expect=None if expect is None else expect[i])
            except block.CorruptBlock:
                return
            if h.key != keys[i] or n != h.header_len + h.payload_len:
                return
            payload = Span(addr + h.header_len, h.payload_len, keep)
            if (full or verify) and _xxhash.available and _xxhash.xxh64_ptr(payload.addr, payload.n) != h.checksum:
                return
            consume(i, h, payload)
            found.add(i)

        conn, path = self._conn(m)
        if path == "shm":
            try:
                conn.get(keys, lambda i, mem, mem_np, off, n: deliver(i, conn.addr[id(mem_np)] + off, n, False, mem_np),
                         before_release=flush_copies)
            except (OSError, _shm.ShmError):
                pass
            self.c.counters["shm_get"] += len(found)
        elif path == "tcp":
            scratch = {}

            def bufs(i, n):
                b = scratch[i] = np.empty(n, np.uint8)
                return [memoryview(b)]

            def landed(i):
                b = scratch.pop(i)
                deliver(i, b.ctypes.data, b.nbytes, True, b)
            try:
                conn.get(keys, bufs, landed)
            except (OSError, _shm.ShmError):
                pass
            flush_copies()  # before scratch, which holds the values, goes
            self.c.counters["tcp_get"] += len(found)
        missing = [i for i in range(len(keys)) if i not in found]
        if missing:
            before = len(found)
            req = object_pb2.ObjectServiceGetRequest(keys=[keys[i] for i in missing])
            cur, rec = -1, None
            try:
                for f in self._stub.Get(req, timeout=self.c.timeout, metadata=self.c._md):
                    if not f.found:
                        continue
                    if f.index != cur:
                        cur, rec = f.index, bytearray()
                    rec += f.data
                    if f.last:
                        b = np.frombuffer(rec, np.uint8)
                        deliver(missing[cur], b.ctypes.data, b.nbytes, True, b)
                        flush_copies()  # before rec, which holds the value, is replaced
            except Exception as e:  # grpc.RpcError
                raise from_rpc(e) from None
            self.c.counters["grpc_get"] += len(found) - before
        return found

    def read(self, ns, names, sink, verify=False):
        """Reads objects by name. sink(i, header, payloads) is called once per object found whole:
        payloads the Spans of its pieces in order (valid during the call only). Returns the indexes
        not found (broken objects are removed)."""
        kns, _m = self._ns(ns)
        root = kns.root()
        nbs = [block.check_object_name(n) for n in names]
        keys = [block.object_key(root, nb) for nb in nbs]
        multi = {}
        done = set()

        def first(i, h, payload):
            if h.pieces == 1:
                if h.payload_len == h.size:
                    sink(i, h, [payload])
                    done.add(i)
            else:
                multi[i] = (h, payload.copy())  # held across the next round
        self.get(keys, first, verify, [(k, root, nb) for k, nb in zip(keys, nbs)])
        broken = []
        if multi:
            pkeys, owner = [], []
            for i, (h, _p) in multi.items():
                for j in range(1, h.pieces):
                    pkeys.append(block.piece_key(keys[i], j))
                    owner.append((i, j))
            parts = {i: [p] for i, (_h, p) in multi.items()}

            def rest(k, h, payload):
                i, j = owner[k]
                h0 = multi[i][0]
                if (h.name, h.piece, h.pieces, h.size, h.generation) == (h0.name, j, h0.pieces, h0.size, h0.generation) \
                        and len(parts[i]) == j:
                    parts[i].append(payload.copy())
            self.get(pkeys, rest, verify)
            for i, (h, _p) in multi.items():
                if len(parts[i]) == h.pieces and sum(p.n for p in parts[i]) == h.size:
                    sink(i, h, parts[i])
                    done.add(i)
                else:
                    broken.append(names[i])
            flush_copies()  # before parts, which holds the pieces, goes
        if broken:
            self.remove(ns, broken)
        return [i for i in range(len(names)) if i not in done]

    def headers(self, ns, names):
        """The first piece's header of each object, or None when not found."""
        out = [None] * len(names)
        kns, _m = self._ns(ns)
        root = kns.root()
        keys = [block.object_key(root, block.check_object_name(n)) for n in names]

        def keep(i, h, _payload):
            out[i] = h
        self.get(keys, keep)
        return out

    def exists(self, ns, names):
        """Whether each object's first piece is stored anywhere in the cluster."""
        kns, _m = self._ns(ns)
        root = kns.root()
        keys = [block.object_key(root, block.check_object_name(n)) for n in names]
        resp = self._call(self.c._cache.Exists, cache_pb2.ExistsRequest(keys=keys, chunk_keys=keys))
        return list(resp.present)

    # ---- remove and retain ----

    def _all_keys(self, ns, names):
        """Every piece key of names (the first piece says how many), and per key its name's index."""
        kns, _m = self._ns(ns)
        root = kns.root()
        keys = [block.object_key(root, block.check_object_name(n)) for n in names]
        owner = list(range(len(names)))
        for i, h in enumerate(self.headers(ns, names)):
            if h is not None:
                for j in range(1, h.pieces):
                    keys.append(block.piece_key(keys[i], j))
                    owner.append(i)
        return keys, owner

    def remove(self, ns, names):
        """Removes names (every piece) from every node; per name whether a node held it."""
        if not names:
            return []
        keys, _owner = self._all_keys(ns, names)
        found = []
        for lo in range(0, len(keys), 256):
            resp = self._call(self._stub.Remove, object_pb2.ObjectServiceRemoveRequest(keys=keys[lo:lo + 256]))
            found.extend(resp.found)
        return found[:len(names)]

    def retain(self, ns, names=(), chain=(), chain_chunks=None, pin=0, ttl_ms=0):
        """Sets the retention of objects (every piece) and of a prompt's blocks (their keys, chain,
        placed by chain_chunks); per item whether its owners applied it."""
        keys, owner = self._all_keys(ns, list(names)) if names else ([], [])
        chunks = list(keys)
        n = len(names)
        for i, k in enumerate(chain):
            keys.append(k)
            chunks.append(chain_chunks[i] if chain_chunks else b"")
            owner.append(n + i)
        applied = [True] * (n + len(chain))
        for lo in range(0, len(keys), 256):
            ck = chunks[lo:lo + 256]
            req = object_pb2.ObjectServiceRetainRequest(keys=keys[lo:lo + 256], chunk_keys=[] if any(not c for c in ck) else ck,
                                                        retention=object_pb2.Retention(pin=pin, ttl_ms=ttl_ms))
            resp = self._call(self._stub.Retain, req)
            for j, a in enumerate(resp.applied):
                applied[owner[lo + j]] = applied[owner[lo + j]] and a
        return applied


def item_error(res):
    """The exception for a record the node refused."""
    from .errors import InvalidArgument, PermissionDenied, ResourceExhausted
    cls = {object_pb2.ITEM_STATUS_NO_ROOM: ResourceExhausted,
           object_pb2.ITEM_STATUS_DENIED: PermissionDenied}.get(res.status, InvalidArgument)
    code = {ResourceExhausted: "RESOURCE_EXHAUSTED", PermissionDenied: "PERMISSION_DENIED"}.get(cls, "INVALID_ARGUMENT")
    return cls(res.message, code)

