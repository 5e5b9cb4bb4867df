"""The node's TCP data plane (transfer/frame.go, transfer/server.go).

The connection opens with a hello (bearer token) that the node answers with
helloAck; then each get request (keys) is answered with a getResp: per key a
status and value length, then the OK values in table order, each padded to 64
bytes. The values are read with recvmsg_into straight into buffers the caller
chooses per value (for a block: its header, then its payload's runs in the
destination tensor), so a block read over TCP is copied once, by the kernel.
Over TLS the runs are read one recv_into at a time. Puts are publish requests
as on the unix socket (Publisher), sent from the tensor's memory.
"""
import socket
import ssl
import struct
import threading

from . import _xxhash
from ._shm import (_HDR, ERROR, GET_RESP, HEADER_LEN, HELLO, HELLO_ACK, MAGIC, STATUS_ERROR, STATUS_MISS,
                   STATUS_OK, STATUS_RETRY, WIRE_VERSION, Publisher, ShmAuthError, ShmError, _align, _parse_header,
                   frame_header, get_table)

MAX_ITEMS = 4096          # transfer.DefaultMaxItems
MAX_BATCH = 64 << 20      # transfer.DefaultMaxBatchBytes: most value bytes per answer
IOV_MAX = 1024


class TcpConn(Publisher):
    def __init__(self, addr, token=None, tls=None, timeout=10.0):
        if not _xxhash.available or _xxhash._stream is None:
            raise ShmError("libxxhash is missing")
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        s = socket.create_connection((host, int(port)), timeout=timeout)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                s = tls.wrap_socket(s, server_hostname=host)
            self._sock = s
            self._plain = not isinstance(s, ssl.SSLSocket)
            tok = (token or "").encode()
            s.sendall(frame_header(HELLO, 0, len(tok), tok) + tok)
            typ, _rid, _count, _table, _payload = self._read_frame()
            if typ != HELLO_ACK:
                raise ShmError(f"node answered the hello with frame type {typ}")
        except BaseException:
            s.close()
            raise
        self._timeout = timeout
        self._lock = threading.Lock()
        self._next = 0
        self.closed = False
        self.max_items, self.max_batch = MAX_ITEMS, MAX_BATCH  # the node's defaults; over them it refuses

    def _id(self):
        self._next += 1
        return self._next

    def _fail(self):
        self.close()

    def close(self):
        if not self.closed:
            self.closed = True
            self._sock.close()

    def _recv_exact(self, n):
        buf = bytearray(n)
        self._recv_into([memoryview(buf)])
        return buf

    def _recv_into(self, bufs):
        """Fills every buffer of bufs (writable memoryviews, byte format) from the socket."""
        bufs = [b for b in bufs if b.nbytes]
        while bufs:
            if self._plain:
                n = self._sock.recvmsg_into(bufs[:IOV_MAX])[0]
            else:
                n = self._sock.recv_into(bufs[0])
            if n == 0:
                raise ShmError("node closed the data-plane connection")
            while bufs and n >= bufs[0].nbytes:
                n -= bufs[0].nbytes
                bufs.pop(0)
            if n:
                bufs[0] = bufs[0][n:]

    def _read_frame(self, payload_ok=False):
        hdr = self._recv_exact(HEADER_LEN)
        typ, rid, count, payload, tsum, cls = _parse_header(hdr)
        from ._shm import _ENTRY
        tlen = count * _ENTRY[typ]
        table = bytes(self._recv_exact(tlen)) if tlen else b""
        if _xxhash.xxh64(table) != tsum:
            raise ShmError("item table checksum mismatch")
        if typ == ERROR:
            text = bytes(self._recv_exact(payload)).decode("utf-8", "replace") if payload else ""
            raise (ShmAuthError if cls == 1 else ShmError)(f"node: {text}")
        if payload and not payload_ok:
            raise ShmError(f"unexpected payload on frame type {typ}")
        return typ, rid, count, table, payload

    def get(self, keys, buffers, landed, parts=None):
        """Reads keys (16 bytes each), or with parts (a block.Part per key) those part ranges of
        them (the node answers with part records). For each value the node sends, buffers(i, n) returns
        writable byte memoryviews adding up to n where it lands, and landed(i) is called once
        it is in. Keys the node lacks are skipped."""
        todo = list(range(len(keys)))
        with self._lock:
            try:
                while todo:
                    idx, todo = todo[:MAX_ITEMS], todo[MAX_ITEMS:]
                    self._next += 1
                    rid = self._next
                    typ, table = get_table(keys, idx, parts)
                    hdr = _HDR.pack(MAGIC, WIRE_VERSION, typ, 0, 0, rid, len(idx), int(self._timeout * 1000) + 1,
                                    0, MAX_BATCH, MAX_BATCH, 0, _xxhash.xxh64(table))
                    self._sock.sendall(hdr + struct.pack("<Q", _xxhash.xxh64(hdr)) + table)
                    typ, got, count, rtable, payload = self._read_frame(payload_ok=True)
                    if typ != GET_RESP or got != rid or count != len(idx):
                        raise ShmError(f"got frame type {typ} id {got} of {count} items for get {rid} of {len(idx)}")
                    items, total, retry = [], 0, []
                    for j, i in enumerate(idx):
                        st, z1, z2, z3, n = struct.unpack_from("<BBBBI", rtable, 8 * j)
                        if z1 | z2 | z3 or (n and st != STATUS_OK) or n > MAX_BATCH:
                            raise ShmError(f"bad get answer item {j}")
                        if st == STATUS_OK:
                            items.append((i, n))
                            total += _align(n)
                        elif st == STATUS_RETRY:
                            retry.append(i)
                        elif st not in (STATUS_MISS, STATUS_ERROR):
                            raise ShmError(f"item status {st}")
                    if total != payload:
                        raise ShmError(f"values add up to {total} bytes, payload is {payload}")
                    pad = bytearray(64)
                    for i, n in items:
                        bufs = buffers(i, n)
                        if _align(n) > n:
                            bufs = bufs + [memoryview(pad)[:_align(n) - n]]
                        self._recv_into(bufs)
                        landed(i)
                    if retry and len(retry) == len(idx):
                        raise ShmError("node sent none of the values and asked for all again")
                    todo = retry + todo
            except (OSError, ShmError):
                self.close()
                raise
