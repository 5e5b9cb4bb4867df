"""The asyncio client: kvmesh.Client's methods as coroutines, over grpc.aio.

Safe for hundreds of concurrent calls on one client. The shared-memory path
runs its socket round trips in a worker thread (one connection, calls
serialised on it); everything else is asyncio.
"""
import asyncio

import grpc

from . import _core, _groups, _shm, _tcp, block
from .client import _check_outs, _check_put_items, channel_credentials, channel_options, check_transport, ssl_context
from .errors import KVMeshError, PermissionDenied, from_rpc
from .v1 import admin_pb2, admin_pb2_grpc, cache_pb2, cache_pb2_grpc


class Client:
    """``async with kvmesh.aio.Client(addr) as c: n, kv = await c.get(ns, tokens)``."""

    def __init__(self, addr, *, token=None, tls=None, timeout=10.0, transport="auto"):
        check_transport(transport)
        self.addr, self.timeout = addr, timeout
        creds = channel_credentials(tls)
        opts = channel_options(tls)
        self._channel = grpc.aio.secure_channel(addr, creds, opts) if creds else grpc.aio.insecure_channel(addr, opts)
        self._cache = cache_pb2_grpc.CacheServiceStub(self._channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._md = (("authorization", f"Bearer {token}"),) if token else None
        self._token = token
        self._use_shm = transport == "auto"
        self._use_tcp = transport in ("auto", "tcp")
        self._ssl = ssl_context(tls)
        self._tls = tls is not None and tls is not False
        self._tcp = None
        self._meta = None
        self._meta_lock = asyncio.Lock()
        self._conn_lock = asyncio.Lock()  # one data-plane connection of each kind, however many callers
        self._shm = None
        #: Blocks moved, by path: shm_get, grpc_get, shm_put, grpc_put.
        self.counters = dict.fromkeys(("shm_get", "tcp_get", "grpc_get", "shm_put", "tcp_put", "grpc_put"), 0)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        if self._tcp is not None:
            self._tcp.close()
            self._tcp = None
        await self._channel.close()

    async def _call(self, fn, req):
        try:
            return await fn(req, timeout=self.timeout, metadata=self._md)
        except grpc.aio.AioRpcError as e:
            raise from_rpc(e) from None

    async def meta(self, ns=None):
        async with self._meta_lock:
            m = self._meta
            if m is None:
                try:
                    who = await self._call(self._admin.WhoAmI, admin_pb2.WhoAmIRequest())
                except KVMeshError as e:
                    if e.code != "UNIMPLEMENTED":
                        raise
                    who = None
                members = await self._call(self._admin.Members, admin_pb2.MembersRequest(page_size=1))
                m = _core.meta_from(who, members)
            if not m.key_version and ns is not None:
                first = None
                try:
                    async for f in self._cache.BatchGet(_core.probe_request(ns), timeout=self.timeout, metadata=self._md):
                        first = f if first is None else first
                except grpc.aio.AioRpcError as e:
                    raise from_rpc(e) from None
                if first is None:
                    raise KVMeshError("the node answered the key probe with nothing")
                m.key_version = _core.key_version_from(ns, m.salt, first.key)
            self._meta = m
            return m

    async def _shm_conn(self, m):
        if not (self._use_shm and m.same_host and m.shm_socket):
            return None
        async with self._conn_lock:
            if self._shm is None or self._shm.closed:
                try:
                    self._shm = await asyncio.to_thread(_shm.ShmConn, m.shm_socket, self._token, self.timeout)
                except _shm.ShmAuthError as e:
                    raise PermissionDenied(str(e)) from None
                except (OSError, _shm.ShmError):
                    self._use_shm = False
                    return None
            return self._shm

    async def _tcp_conn(self, m):
        if not (self._use_tcp and m.data_addr) or (self._tls and self._ssl is None):
            return None
        async with self._conn_lock:
            if self._tcp is None or self._tcp.closed:
                try:
                    self._tcp = await asyncio.to_thread(_tcp.TcpConn, m.data_addr, self._token, self._ssl, self.timeout)
                except _shm.ShmAuthError as e:
                    raise PermissionDenied(str(e)) from None
                except (OSError, _shm.ShmError):
                    self._use_tcp = False
                    return None
            return self._tcp

    async def lookup(self, ns, tokens, *, extra_keys=None):
        _core.check_ns(ns)
        _core._token_bytes(tokens)
        m = await self.meta(ns)
        return _core.lookup_result(await self._call(self._cache.Lookup, _core.lookup_request(ns, tokens, m, extra_keys)))

    async def put(self, ns, tokens, kv, *, group=None, start=0, scales=None, extra_keys=None, tp_rank=0, tp_size=1,
                  pp_rank=0, pp_size=1):
        if getattr(ns, "groups", None) or group is not None or start:
            if scales is not None or (tp_size, pp_size) != (1, 1):
                raise ValueError("put of a group: whole records (tp_size 1, pp_size 1), no scales argument")
            return await self._put_group(ns, tokens, kv, group, start, extra_keys)
        return (await self.batch_put(ns, [(tokens, kv, scales, extra_keys)], tp_rank=tp_rank, tp_size=tp_size,
                                     pp_rank=pp_rank, pp_size=pp_size))[0]

    async def batch_put(self, ns, items, *, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
        items = list(items)
        sl = _core.rank_slice(ns, tp_rank, tp_size, pp_rank, pp_size)
        _check_put_items(ns, items, sl)
        m = await self.meta(ns)
        plan = _core.PutPlan(ns, items, m, sl)
        if not plan.blocks:
            return [0] * len(items)
        conn, path = await self._shm_conn(m), "shm_put"
        if conn is None:
            conn, path = await self._tcp_conn(m), "tcp_put"
        if conn is not None:
            try:
                if block.replicated(ns, tp_size):
                    # Ranks holding the same part: ask first, send only what the node lacks.
                    plan.on_claims(await asyncio.to_thread(conn.claim, *plan.claim_items()))
                if plan.rest:
                    keys, chunks, heads, payloads = plan.shm_items(plan.rest)
                    st = await asyncio.to_thread(conn.put_publish, keys, chunks, heads, payloads)
                    self.counters[path] += plan.on_put(keys, st)
            except (OSError, _shm.ShmError):
                pass
        if plan.rest and not sl.whole:
            raise plan.unsent(conn is not None and not conn.closed)
        if plan.rest:
            try:
                resp = await self._cache.BatchPut(plan.requests(plan.rest), timeout=self.timeout, metadata=self._md)
            except grpc.aio.AioRpcError as e:
                raise from_rpc(e) from None
            self.counters["grpc_put"] += plan.on_grpc(resp.keys)
        return plan.counts()

    async def _put_group(self, ns, tokens, kv, group, start, extra_keys):
        _core.check_ns(ns)
        if not ns.groups:
            raise ValueError(f"group: namespace {ns.model!r} has no groups")
        m = await self.meta(ns)
        plan = _groups.GroupPutPlan(ns, tokens, kv, group, start, m, extra_keys)
        if not plan.blocks:
            return 0
        conn, path = await self._shm_conn(m), "shm_put"
        if conn is None:
            conn, path = await self._tcp_conn(m), "tcp_put"
        if conn is not None:
            try:
                keys, chunks, heads, payloads = plan.shm_items(plan.rest)
                st = await asyncio.to_thread(conn.put_publish, keys, chunks, heads, payloads)
                self.counters[path] += plan.on_put(keys, st)
            except (OSError, _shm.ShmError):
                pass
        if plan.rest:
            try:
                resp = await self._cache.BatchPut(plan.requests(plan.rest), timeout=self.timeout, metadata=self._md)
            except grpc.aio.AioRpcError as e:
                raise from_rpc(e) from None
            self.counters["grpc_put"] += plan.on_grpc(resp.keys)
        return plan.count()

    async def exists(self, ns, tokens, *, extra_keys=None):
        _core.check_ns(ns)
        m = await self.meta(ns)
        if ns.groups:
            per, cks = _groups.record_keys(ns, m, tokens, extra_keys)
        else:
            per = [_core.key_bytes(ns.salted(m.salt), _core._token_bytes(tokens), m.key_version, extra_keys=extra_keys)]
            cks = _core.chunk_keys(per[0], ns, m.chunk_tokens)
        out = [list((await self._call(self._cache.Exists, cache_pb2.ExistsRequest(keys=ks, chunk_keys=cks))).present)
               for ks in per]
        return out if ns.groups else out[0]

    async def _read(self, plan, which, prefix):
        staging = {}
        try:
            async for f in self._cache.BatchGet(plan.request(which, prefix), timeout=self.timeout, metadata=self._md):
                plan.on_frame(which, f, staging)
        except grpc.aio.AioRpcError as e:
            raise from_rpc(e) from None

    async def get(self, ns, tokens, out=None, *, array=None, extra_keys=None, tp_rank=0, tp_size=1, pp_rank=0,
                  pp_size=1):
        if getattr(ns, "groups", None):
            _core.check_ns(ns)
            await self.meta(ns)
            rd = _groups.ResumeRead(ns, array)
            try:
                async for f in self._cache.BatchGet(_groups.resume_request(ns, tokens, extra_keys), timeout=self.timeout,
                                                    metadata=self._md):
                    rd.on_frame(f)
            except grpc.aio.AioRpcError as e:
                raise from_rpc(e) from None
            return rd.results()
        return (await self.batch_get(ns, [tokens], None if out is None else [out], array=array,
                                     extra_keys=None if extra_keys is None else [extra_keys], tp_rank=tp_rank,
                                     tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size))[0]

    async def batch_get(self, ns, prompts, outs=None, *, array=None, extra_keys=None, tp_rank=0, tp_size=1,
                        pp_rank=0, pp_size=1):
        prompts = list(prompts)
        sl = _core.rank_slice(ns, tp_rank, tp_size, pp_rank, pp_size)
        _check_outs(ns, prompts, outs, array, sl)
        m = await self.meta(ns)
        plan = _core.GetPlan(ns, prompts, outs, array, m, extra_keys, sl)
        if plan.keys:
            conn = await self._shm_conn(m)
            if conn is not None:
                try:
                    await asyncio.to_thread(conn.get, plan.keys, plan.shm_consume, plan.parts())
                except (OSError, _shm.ShmError):
                    pass
                self.counters["shm_get"] += len(plan.keys) - len(plan.missing())
            else:
                tcp = await self._tcp_conn(m)
                if tcp is not None:
                    try:
                        await asyncio.to_thread(tcp.get, plan.keys, plan.tcp_buffers, plan.tcp_landed, plan.parts())
                    except (OSError, _shm.ShmError):
                        pass
                    self.counters["tcp_get"] += len(plan.keys) - len(plan.missing())
            which = plan.missing()
            if which:
                await asyncio.gather(*(self._read(plan, w, p) for w, p in plan.streams(which)))
            self.counters["grpc_get"] += len(which) - len(plan.missing())
        return plan.results()
