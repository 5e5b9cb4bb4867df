"""The node's same-host shared-memory data plane (transfer/shm_linux.go, frame.go).

A unix socket carries frames; the node answers the hello (bearer token) with
an shmHello frame and, by SCM_RIGHTS, the descriptor of a memfd region that
this process maps read-only (the node seals it against writes), and, for a
node-wide principal allowed to write (never a tenant or a read-only token:
any descriptor of a memfd can be reopened writable through /proc, and the
arena holds every tenant's blocks), the descriptor of the node's DRAM arena,
which this client maps read-only too: it puts inline. A get is
answered with (status, length, offset) per key: a block found in DRAM lies in
the arena itself (offset bit 63 set), read in place under a lease, and any
other (an NVMe hit, a part cut from a block, a tenant's read) was copied into
the region; either stays put until the request id is released. A put travels
inline: the frame's payload is each encoded block (header, then payload)
padded to 64 bytes, sent with one sendmsg from the caller's memory.

One request is in flight per connection (a lock serialises callers), so the
answer that comes back is always the caller's.
"""
import mmap
import os
import socket
import ssl
import struct
import threading

from . import _xxhash

MAGIC = 0x4654564B  # "KVTF"
WIRE_VERSION = 3
HEADER_LEN = 64
ALIGN = 64

GET_REQ, GET_RESP, PUT_REQ, PUT_RESP, SHM_GET_RESP, SHM_RELEASE, SHM_HELLO, ERROR, LOOKUP_REQ, \
    LOOKUP_RESP, HELLO, HELLO_ACK, PUBLISH_REQ = range(1, 14)
# Parts of blocks (multi-GPU instances): a get of part records of the asked ranges, answered as
# a get; a claim of ranges, answered with a ClaimStatus per item.
GET_PART_REQ, CLAIM_REQ, CLAIM_RESP = 16, 17, 18
_ENTRY = {GET_REQ: 16, GET_RESP: 8, PUT_REQ: 24, PUT_RESP: 8, SHM_GET_RESP: 16, SHM_RELEASE: 8, SHM_HELLO: 32,
          ERROR: 0, LOOKUP_REQ: 24, LOOKUP_RESP: 8, HELLO: 1, HELLO_ACK: 0, PUBLISH_REQ: 40, GET_PART_REQ: 32,
          CLAIM_REQ: 32, CLAIM_RESP: 8}

# Item statuses; STATUS_CONFLICT answers a put of a part that overlaps stored cells with other bytes.
STATUS_MISS, STATUS_OK, STATUS_ERROR, STATUS_RETRY, STATUS_CONFLICT = 0, 1, 2, 3, 4

# What a claim of a part range answers (store.ClaimStatus): send it (the caller now holds a claim on
# it), the block is complete, stored parts cover the range, another writer holds an open claim.
CLAIM_WRITE, CLAIM_COMPLETE, CLAIM_COVERED, CLAIM_CLAIMED = 0, 1, 2, 3
_CLAIM_ENTRY = struct.Struct("<B3xI")

_HDR = struct.Struct("<IBBBBQIIQIIQQ")  # up to the header checksum at 56
FLAG_ARENA = 2  # hello flag: map the node's DRAM arena too, if this principal may (a node-wide writer)
ARENA_SHARED = 1  # hello arena flag: the arena's descriptor follows the region's
IN_ARENA = 1 << 63  # shmGetResp offset bit: the value lies in the arena, not the region
_ITEM = struct.Struct("<B3xIQ")  # shmGetResp entry: status, value length, region offset
assert _HDR.size == 56


class ShmError(Exception):
    """The shared-memory path failed; the caller falls back to gRPC."""


class ShmAuthError(ShmError):
    """The node refused the token."""


def _align(n):
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def frame_header(typ, rid, count, table, payload=0, timeout_ms=0, flags=0):
    h = _HDR.pack(MAGIC, WIRE_VERSION, typ, flags, 0, rid, count, timeout_ms, payload, 0, 0, 0, _xxhash.xxh64(table))
    return h + struct.pack("<Q", _xxhash.xxh64(h))


def _recv_exact(sock, n):
    buf = bytearray(n)
    mv = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(mv[got:])
        if k == 0:
            raise ShmError("node closed the shared-memory connection")
        got += k
    return buf


def _parse_header(b):
    (magic, ver, typ, flags, cls, rid, count, timeout, payload, _mb, _mv, _tag, tsum) = _HDR.unpack_from(b)
    if magic != MAGIC or ver != WIRE_VERSION:
        raise ShmError(f"bad frame (magic {magic:#x}, version {ver})")
    if _xxhash.xxh64(bytes(b[:56])) != struct.unpack_from("<Q", b, 56)[0]:
        raise ShmError("frame header checksum mismatch")
    if typ not in _ENTRY:
        raise ShmError(f"unknown frame type {typ}")
    return typ, rid, count, payload, tsum, cls


def get_table(keys, idx, parts):
    """The item table of a get of keys[i] for i in idx: keys alone (getReq), or with parts (a
    block.Part per key, or None for all whole) key ‖ u32 l0 ‖ u32 l1 ‖ u32 h0 ‖ u32 h1 (getPartReq)."""
    if parts is None:
        return GET_REQ, b"".join(keys[i] for i in idx)
    return GET_PART_REQ, b"".join(keys[i] + struct.pack("<4I", *parts[i]) for i in idx)


class Publisher:
    """put_publish and claim for a connection with _sock, _lock, _id(), _read_frame(), _sendmsg(),
    _fail(), _timeout, max_items and max_batch: the unix socket's and the TCP data plane's."""

    def put_publish(self, keys, chunk_keys, heads, payloads):
        """Stores blocks (heads[i] then the buffers of payloads[i], a list of bytes-like runs)
        under keys and has the node publish them to the owners of chunk_keys: one sendmsg
        gathers them from where they lie. Returns each item's status."""
        out = []
        with self._lock:
            try:
                plen = [sum(memoryview(r).nbytes for r in runs) for runs in payloads]
                lo = 0
                while lo < len(keys):
                    hi, size = lo, 0
                    while hi < len(keys) and hi - lo < self.max_items:
                        n = _align(len(heads[hi]) + plen[hi])
                        if hi > lo and size + n > self.max_batch:
                            break
                        size += n
                        hi += 1
                    rid = self._id()
                    table = bytearray(40 * (hi - lo))
                    bufs = []
                    for j, i in enumerate(range(lo, hi)):
                        vlen = len(heads[i]) + plen[i]
                        struct.pack_into("<16sI4x16s", table, 40 * j, keys[i], vlen, chunk_keys[i])
                        bufs.append(heads[i])
                        bufs.extend(payloads[i])
                        pad = _align(vlen) - vlen
                        if pad:
                            bufs.append(bytes(pad))
                    table = bytes(table)
                    hdr = _HDR.pack(MAGIC, WIRE_VERSION, PUBLISH_REQ, 0, 0, rid, hi - lo, int(self._timeout * 1000) + 1,
                                    size, 0, 0, 0, _xxhash.xxh64(table))
                    self._sendmsg([hdr + struct.pack("<Q", _xxhash.xxh64(hdr)) + table] + bufs)
                    typ, got, count, rtable = self._read_frame()[:4]
                    if typ != PUT_RESP or got != rid or count != hi - lo:
                        raise ShmError(f"got frame type {typ} id {got} for put {rid}")
                    out.extend(rtable[8 * j] for j in range(count))
                    lo = hi
            except (OSError, ShmError):
                self._fail()
                raise
        return out

    def claim(self, keys, parts):
        """Claims part ranges of blocks (parts[i] of keys[i]) before sending them: per item the
        node's ClaimStatus (CLAIM_WRITE: send it, this client now holds the claim; CLAIM_COMPLETE,
        CLAIM_COVERED: nothing to send; CLAIM_CLAIMED: another writer is sending it)."""
        out = []
        with self._lock:
            try:
                for lo in range(0, len(keys), self.max_items):
                    idx = range(lo, min(len(keys), lo + self.max_items))
                    rid = self._id()
                    _typ, table = get_table(keys, idx, parts)
                    hdr = _HDR.pack(MAGIC, WIRE_VERSION, CLAIM_REQ, 0, 0, rid, len(idx), int(self._timeout * 1000) + 1,
                                    0, 0, 0, 0, _xxhash.xxh64(table))
                    self._sendmsg([hdr + struct.pack("<Q", _xxhash.xxh64(hdr)) + table])
                    typ, got, count, rtable = self._read_frame()[:4]
                    if typ != CLAIM_RESP or got != rid or count != len(idx):
                        raise ShmError(f"got frame type {typ} id {got} of {count} items for claim {rid} of {len(idx)}")
                    for j, (st, z) in enumerate(_CLAIM_ENTRY.iter_unpack(rtable)):
                        if st > CLAIM_CLAIMED or z or rtable[8 * j + 1:8 * j + 4] != b"\0\0\0":
                            raise ShmError(f"bad claim answer item {j}")
                        out.append(st)
            except (OSError, ShmError):
                self._fail()
                raise
        return out


    def _sendmsg(self, bufs):
        views = [memoryview(b).cast("B") for b in bufs]
        if isinstance(self._sock, ssl.SSLSocket):
            for v in views:  # TLS has no sendmsg
                self._sock.sendall(v)
            return
        while views:
            n = self._sock.sendmsg(views[:512])
            while views and n >= views[0].nbytes:
                n -= views[0].nbytes
                views.pop(0)
            if n and views:
                views[0] = views[0][n:]


class ShmConn(Publisher):
    """One connection to a node's shared-memory socket."""

    def __init__(self, path, token=None, timeout=10.0):
        if not _xxhash.available:
            raise ShmError("libxxhash is missing")
        self._lock = threading.Lock()
        self._timeout = timeout
        self._next = 0
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(path)
            tok = (token or "").encode()
            s.sendall(frame_header(HELLO, 0, len(tok), tok, flags=FLAG_ARENA) + tok)
            msg, fds, _flags, _addr = socket.recv_fds(s, HEADER_LEN + 32, 4)
            self.arena = self.arena_np = None
            try:
                if len(msg) == 0:
                    raise ShmError("node closed the connection (over its client limit?)")
                buf = bytearray(msg)
                if len(buf) < HEADER_LEN:
                    buf += _recv_exact(s, HEADER_LEN - len(buf))
                typ, _rid, count, payload, tsum, cls = _parse_header(buf)
                if typ == ERROR:
                    rest = bytes(buf[HEADER_LEN:])
                    if len(rest) < payload:
                        rest += bytes(_recv_exact(s, payload - len(rest)))
                    text = rest[:payload].decode("utf-8", "replace")
                    raise (ShmAuthError if cls == 1 else ShmError)(f"node refused the connection: {text}")
                if typ != SHM_HELLO or count != 1 or len(fds) not in (1, 2):
                    raise ShmError(f"expected a hello with the region, got frame type {typ} with {len(fds)} descriptors")
                if len(buf) < HEADER_LEN + 32:
                    buf += _recv_exact(s, HEADER_LEN + 32 - len(buf))
                table = bytes(buf[HEADER_LEN:HEADER_LEN + 32])
                if _xxhash.xxh64(table) != tsum:
                    raise ShmError("hello table checksum mismatch")
                size, pending, self.max_items, self.max_value, arena, self.max_batch = struct.unpack("<QIIIIQ", table)
                if size == 0 or size % ALIGN or os.fstat(fds[0]).st_size != size:
                    raise ShmError(f"region of {size} bytes does not match its descriptor")
                if len(fds) != 1 + (arena & ARENA_SHARED):
                    raise ShmError(f"hello with {len(fds)} descriptors and arena flags {arena:#x}")
                self.region = mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
                self.region_view = memoryview(self.region)
                import numpy as np
                self.region_np = np.frombuffer(self.region, np.uint8)  # read-only, for copies out
                if len(fds) == 2:
                    self.arena = _map_arena(fds[1])
                    self.arena_np = np.frombuffer(self.arena, np.uint8)
            finally:
                for fd in fds:
                    os.close(fd)
        except BaseException:
            s.close()
            raise
        self._sock = s
        self.closed = False

    def close(self):
        if self.closed:
            return
        self.closed = True
        self._sock.close()
        # The region stays mapped until every view of it is gone; releasing
        # our reference is enough.
        try:
            self.region_np = self.arena_np = None
            self.region_view.release()
            self.region.close()
            if self.arena is not None:
                self.arena.close()
        except (BufferError, ValueError):
            pass  # a caller still holds a view: the mapping goes with the last one

    def _id(self):
        self._next += 1
        return self._next

    def _read_frame(self):
        hdr = _recv_exact(self._sock, HEADER_LEN)
        typ, rid, count, payload, tsum, cls = _parse_header(hdr)
        tlen = count * _ENTRY[typ]
        table = bytes(_recv_exact(self._sock, tlen)) if tlen else b""
        if _xxhash.xxh64(table) != tsum:
            raise ShmError("item table checksum mismatch")
        if typ == ERROR:
            text = bytes(_recv_exact(self._sock, payload)).decode("utf-8", "replace") if payload else ""
            raise (ShmAuthError if cls == 1 else ShmError)(f"node: {text}")
        if payload:
            raise ShmError(f"unexpected payload on frame type {typ}")
        return typ, rid, count, table

    def _fail(self):
        self.close()

    def get(self, keys, consume, parts=None):
        """Reads keys (16 bytes each), or with parts (a block.Part per key) those part ranges of
        them. consume(i, mem, mem_np, off, n) is called for every key the node holds: the encoded
        block (or part record) is the n bytes at offset off of mem, an mmap (mem_np, a numpy
        view of it): the node's arena itself for a block read in place, else the region. They
        are valid only during the call (the node may reuse them once it is told of the release
        that follows); keys it lacks are not passed. Returns the set of indexes found."""
        found = set()
        todo = list(range(len(keys)))
        with self._lock:
            try:
                while todo:
                    idx = todo[:self.max_items]
                    todo = todo[self.max_items:]
                    rid = self._id()
                    typ, table = get_table(keys, idx, parts)
                    hdr = _HDR.pack(MAGIC, WIRE_VERSION, typ, 0, 0, rid, len(idx), int(self._timeout * 1000) + 1,
                                    0, self.max_batch, self.max_value, 0, _xxhash.xxh64(table))
                    self._sock.sendall(hdr + struct.pack("<Q", _xxhash.xxh64(hdr)) + table)
                    typ, got, count, rtable = self._read_frame()
                    if typ != SHM_GET_RESP or got != rid or count != len(idx):
                        raise ShmError(f"got frame type {typ} id {got} of {count} items for get {rid} of {len(idx)}")
                    retry = []
                    try:
                        for j, (st, n, off) in enumerate(_ITEM.iter_unpack(rtable)):
                            i = idx[j]
                            if st == STATUS_OK:
                                mem, mem_np, what = self.region, self.region_np, "region"
                                if off & IN_ARENA:
                                    if self.arena is None:
                                        raise ShmError(f"item {j} lies in an arena this connection was not given")
                                    off &= ~IN_ARENA
                                    mem, mem_np, what = self.arena, self.arena_np, "arena"
                                if off % ALIGN or off + n > len(mem):
                                    raise ShmError(f"item {j} at [{off}, +{n}) lies outside the {what}")
                                consume(i, mem, mem_np, off, n)
                                found.add(i)
                            elif st == STATUS_RETRY:
                                retry.append(i)
                            elif st not in (STATUS_MISS, STATUS_ERROR):
                                raise ShmError(f"item status {st}")
                    finally:
                        self._release(rid)
                    if retry and len(retry) == len(idx):
                        raise ShmError("node sent none of the values and asked for all again")
                    todo = retry + todo
            except (OSError, ShmError):
                self._fail()
                raise
        return found

    @property
    def in_place(self):
        """Whether blocks found in the node's DRAM are read in place (the arena is mapped)."""
        return self.arena is not None

    def _release(self, rid):
        table = struct.pack("<Q", rid)
        self._sock.sendall(frame_header(SHM_RELEASE, 0, 1, table) + table)


def _map_arena(fd):
    """Maps the node's DRAM arena read-only from its descriptor, once it is known to be sealed
    against shrinking (a shrink under the mapping would fault this process)."""
    import fcntl
    size = os.fstat(fd).st_size
    seals = fcntl.fcntl(fd, getattr(fcntl, "F_GET_SEALS", 1034))
    if size <= 0 or size % ALIGN:
        raise ShmError(f"arena of {size} bytes")
    if not seals & getattr(fcntl, "F_SEAL_SHRINK", 2):
        raise ShmError("arena is not sealed against shrinking")
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
