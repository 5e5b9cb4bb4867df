"""The synchronous client."""
import concurrent.futures
import threading

import grpc

from . import _core, _groups, _objects, _shm, _tcp, _tensors, block
from .errors import KVMeshError, PermissionDenied, from_rpc
from .v1 import admin_pb2, admin_pb2_grpc, cache_pb2, cache_pb2_grpc

_MAX_MSG = 64 << 20


def channel_credentials(tls):
    """tls: None (plain TCP), True (system roots), a PEM CA path or bytes, a dict
    {ca, cert, key} of PEM paths or bytes, or grpc.ChannelCredentials."""
    if tls is None or tls is False:
        return None
    if isinstance(tls, grpc.ChannelCredentials):
        return tls

    def pem(x):
        if x is None or isinstance(x, bytes):
            return x
        with open(x, "rb") as f:
            return f.read()
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, dict):
        return grpc.ssl_channel_credentials(root_certificates=pem(tls.get("ca")), private_key=pem(tls.get("key")),
                                            certificate_chain=pem(tls.get("cert")))
    return grpc.ssl_channel_credentials(root_certificates=pem(tls))


def ssl_context(tls):
    """The TLS context of the TCP data plane for tls as given to the client, or None when
    it cannot be had from it (gRPC credentials built by the caller): then no TCP path."""
    import ssl
    if tls is None or tls is False:
        return None
    if tls is True:
        return ssl.create_default_context()
    if isinstance(tls, (str, bytes)) or isinstance(tls, dict):
        d = tls if isinstance(tls, dict) else {"ca": tls}
        ca = d.get("ca")
        ctx = ssl.create_default_context(**({"cadata": ca.decode()} if isinstance(ca, bytes) else {"cafile": ca}))
        if d.get("cert"):
            if isinstance(d["cert"], bytes):
                return None
            ctx.load_cert_chain(d["cert"], d.get("key"))
        return ctx
    return None


TRANSPORTS = ("auto", "tcp", "grpc")


def check_transport(transport):
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r}: want one of {', '.join(TRANSPORTS)}")


def channel_options(tls):
    opts = [("grpc.max_receive_message_length", _MAX_MSG), ("grpc.max_send_message_length", _MAX_MSG)]
    if isinstance(tls, dict) and tls.get("server_name"):
        opts.append(("grpc.ssl_target_name_override", tls["server_name"]))
    return opts


def _check_put_items(ns, items, sl):
    _core.check_ns(ns)
    for p, item in enumerate(items):
        if not 2 <= len(item) <= 4:
            raise ValueError(f"items[{p}]: want (tokens, kv[, scales[, extra_keys]])")
        _tensors.check_kv(sl, item[1], n_tokens=len(_core._token_bytes(item[0])) // 4,
                          name=f"kv of prompt {p}" if len(items) > 1 else "kv")


def _check_outs(ns, prompts, outs, array, sl):
    _core.check_ns(ns)
    if array not in (None, "torch", "numpy"):
        raise ValueError(f"array: want 'torch' or 'numpy', got {array!r}")
    if outs is not None:
        if len(outs) != len(prompts):
            raise ValueError(f"outs: {len(outs)} outputs for {len(prompts)} prompts")
        for p, out in enumerate(outs):
            if out is not None:
                _tensors.check_kv(sl, out, name=f"outs[{p}]" if len(prompts) > 1 else "out")
    for t in prompts:
        _core._token_bytes(t)


class Client:
    """A kvmesh node's client: ``with kvmesh.Client("127.0.0.1:7600") as c: ...``.

    token: the bearer token (a node with tokens requires one); tls: see
    channel_credentials; timeout: seconds per call. transport: how blocks move
    -- "auto" (the node's shared memory when it runs on this host, else its TCP
    data plane), "tcp" (the TCP data plane), "grpc" (gRPC streams only); what
    a data plane lacks or fails at goes through gRPC. Safe to share between
    threads.
    """

    def __init__(self, addr, *, token=None, tls=None, timeout=10.0, transport="auto"):
        check_transport(transport)
        self.addr, self.timeout = addr, timeout
        creds = channel_credentials(tls)
        opts = channel_options(tls)
        self._channel = grpc.secure_channel(addr, creds, opts) if creds else grpc.insecure_channel(addr, opts)
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
        self._lock = threading.Lock()
        self._shm = None
        #: Blocks (and object records) moved, by path: shm_get, tcp_get, grpc_get, shm_put, tcp_put, grpc_put.
        self.counters = dict.fromkeys(("shm_get", "tcp_get", "grpc_get", "shm_put", "tcp_put", "grpc_put"), 0)
        self._objects = _objects.ObjectIO(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        with self._lock:
            if self._shm is not None:
                self._shm.close()
                self._shm = None
            if self._tcp is not None:
                self._tcp.close()
                self._tcp = None
        self._channel.close()

    def _call(self, fn, req, **kw):
        try:
            return fn(req, timeout=self.timeout, metadata=self._md, **kw)
        except grpc.RpcError as e:
            raise from_rpc(e) from None

    def meta(self, ns=None):
        """Whom the node takes this client for, where its shared memory is, and (given a
        namespace to ask with) how it keys blocks; asked once."""
        m = self._meta
        if m is None:
            try:
                who = self._call(self._admin.WhoAmI, admin_pb2.WhoAmIRequest())
            except KVMeshError as e:
                if e.code != "UNIMPLEMENTED":
                    raise
                who = None
            members = self._call(self._admin.Members, admin_pb2.MembersRequest(page_size=1))
            m = _core.meta_from(who, members)
        if not m.key_version and ns is not None:
            first = None
            try:
                for f in self._cache.BatchGet(_core.probe_request(ns), timeout=self.timeout, metadata=self._md):
                    first = f if first is None else first
            except grpc.RpcError as e:
                raise from_rpc(e) from None
            if first is None:
                raise KVMeshError("the node answered the key probe with nothing")
            m.key_version = _core.key_version_from(ns, m.salt, first.key)
        self._meta = m
        return m

    def _shm_conn(self, m):
        if not (self._use_shm and m.same_host and m.shm_socket):
            return None
        with self._lock:
            if self._shm is None or self._shm.closed:
                try:
                    self._shm = _shm.ShmConn(m.shm_socket, self._token, self.timeout)
                except _shm.ShmAuthError as e:
                    raise PermissionDenied(str(e)) from None
                except (OSError, _shm.ShmError):
                    self._use_shm = False  # not usable from here: gRPC from now on
                    return None
            return self._shm

    def _tcp_conn(self, m):
        if not (self._use_tcp and m.data_addr) or (self._tls and self._ssl is None):
            return None
        with self._lock:
            if self._tcp is None or self._tcp.closed:
                try:
                    self._tcp = _tcp.TcpConn(m.data_addr, self._token, self._ssl, self.timeout)
                except _shm.ShmAuthError as e:
                    raise PermissionDenied(str(e)) from None
                except (OSError, _shm.ShmError):
                    self._use_tcp = False
                    return None
            return self._tcp

    @property
    def shm_active(self):
        """Whether the last call could use the shared-memory path."""
        return self._shm is not None and not self._shm.closed

    # ---- API ----

    def lookup(self, ns, tokens, *, extra_keys=None):
        """How much of a prompt is cached: .cached_tokens, and per block .key/.node/.tier.
        extra_keys[i]: block i's extra keys (bytes each), as put took them."""
        _core.check_ns(ns)
        _core._token_bytes(tokens)
        m = self.meta(ns)
        return _core.lookup_result(self._call(self._cache.Lookup, _core.lookup_request(ns, tokens, m, extra_keys)))

    def put(self, ns, tokens, kv, *, group=None, start=0, scales=None, extra_keys=None, tp_rank=0, tp_size=1,
            pp_rank=0, pp_size=1):
        """Stores this rank's part of every full block of tokens; returns the number of blocks
        stored (or acknowledged: a part the node already holds, or that another rank holding
        the same part is sending). kv is the rank's slice, [layers/pp_size, 2, len(tokens),
        kv_heads/tp_size, head_dim] ([layers/pp_size, len(tokens), latent_dim] for a latent
        namespace; the ranks' ranges are block.rank_part's). A block serves gets once parts of
        every layer and head are stored. A namespace with scales needs scales, float32
        [n_blocks, *scales shape of the slice]. extra_keys[i] are block i's extra keys (bytes
        each: e.g. an image's hash and offset), which its key covers. Raises BadPart for a rank
        layout that does not fit the namespace, PartConflict when a part overlaps different
        bytes the node holds of a block.

        A namespace with groups (hybrid models) takes one group's tensor per call: group names it
        (its index in ns.groups) and kv holds its records of blocks start.. of the prompt: a KV
        group's [group layers, 2, n_tokens, kv_heads, head_dim] ([layers, n_tokens, latent_dim]),
        a state group's [n_blocks, group layers, kv_heads, elements]: one state per block
        boundary (kvmesh/_groups.py). Whole records only (tp_size and pp_size 1)."""
        if getattr(ns, "groups", None) or group is not None or start:
            if scales is not None or (tp_size, pp_size) != (1, 1):
                raise ValueError("put of a group: whole records (tp_size 1, pp_size 1), no scales argument")
            return self._put_group(ns, tokens, kv, group, start, extra_keys)
        return self.batch_put(ns, [(tokens, kv, scales, extra_keys)], tp_rank=tp_rank, tp_size=tp_size,
                              pp_rank=pp_rank, pp_size=pp_size)[0]

    def _put_group(self, ns, tokens, kv, group, start, extra_keys):
        _core.check_ns(ns)
        if not ns.groups:
            raise ValueError(f"group: namespace {ns.model!r} has no groups")
        m = self.meta(ns)
        plan = _groups.GroupPutPlan(ns, tokens, kv, group, start, m, extra_keys)
        if not plan.blocks:
            return 0
        conn, path = self._shm_conn(m), "shm_put"
        if conn is None:
            conn, path = self._tcp_conn(m), "tcp_put"
        if conn is not None:
            try:
                keys, chunks, heads, payloads = plan.shm_items(plan.rest)
                self.counters[path] += plan.on_put(keys, conn.put_publish(keys, chunks, heads, payloads))
            except (OSError, _shm.ShmError):
                pass
        if plan.rest:
            try:
                resp = self._cache.BatchPut(plan.requests(plan.rest), timeout=self.timeout, metadata=self._md)
            except grpc.RpcError as e:
                raise from_rpc(e) from None
            self.counters["grpc_put"] += plan.on_grpc(resp.keys)
        return plan.count()

    def exists(self, ns, tokens, *, extra_keys=None):
        """Which full blocks of tokens are cached anywhere in the cluster: a bool per block, or
        for a namespace with groups a list per group (its records of each block)."""
        _core.check_ns(ns)
        m = self.meta(ns)
        if ns.groups:
            per, cks = _groups.record_keys(ns, m, tokens, extra_keys)
        else:
            per = [_core.key_bytes(ns.salted(m.salt), _core._token_bytes(tokens), m.key_version, extra_keys=extra_keys)]
            cks = _core.chunk_keys(per[0], ns, m.chunk_tokens)
        out = []
        for ks in per:
            resp = self._call(self._cache.Exists, cache_pb2.ExistsRequest(keys=ks, chunk_keys=cks))
            out.append(list(resp.present))
        return out if ns.groups else out[0]

    def batch_put(self, ns, items, *, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
        """put of many (tokens, kv[, scales[, extra_keys]]) in one call; returns blocks stored
        per prompt."""
        items = list(items)
        sl = _core.rank_slice(ns, tp_rank, tp_size, pp_rank, pp_size)
        _check_put_items(ns, items, sl)
        m = self.meta(ns)
        plan = _core.PutPlan(ns, items, m, sl)
        if not plan.blocks:
            return [0] * len(items)
        conn, path = self._shm_conn(m), "shm_put"
        if conn is None:
            conn, path = self._tcp_conn(m), "tcp_put"
        if conn is not None:
            try:
                if block.replicated(ns, tp_size):
                    # Ranks holding the same part: ask first, send only what the node lacks.
                    plan.on_claims(conn.claim(*plan.claim_items()))
                if plan.rest:
                    keys, chunks, heads, payloads = plan.shm_items(plan.rest)
                    self.counters[path] += plan.on_put(keys, conn.put_publish(keys, chunks, heads, payloads))
            except (OSError, _shm.ShmError):
                pass
        if plan.rest and not sl.whole:
            raise plan.unsent(conn is not None and not conn.closed)
        if plan.rest:
            try:
                resp = self._cache.BatchPut(plan.requests(plan.rest), timeout=self.timeout, metadata=self._md)
            except grpc.RpcError as e:
                raise from_rpc(e) from None
            self.counters["grpc_put"] += plan.on_grpc(resp.keys)
        return plan.counts()

    def _read(self, plan, which, prefix):
        staging = {}
        try:
            for f in self._cache.BatchGet(plan.request(which, prefix), timeout=self.timeout, metadata=self._md):
                plan.on_frame(which, f, staging)
        except grpc.RpcError as e:
            raise from_rpc(e) from None

    def get(self, ns, tokens, out=None, *, array=None, extra_keys=None, tp_rank=0, tp_size=1, pp_rank=0,
            pp_size=1):
        """Reads this rank's slice of the longest cached prefix of tokens (complete blocks only,
        whatever parallel layout wrote them): returns (cached_tokens, kv), and for a namespace
        with scales (cached_tokens, kv, scales) with scales float32 [cached blocks, *scales shape
        of the slice]. kv is shaped as put takes it, [layers/pp_size, 2, cached_tokens,
        kv_heads/tp_size, head_dim]. With out (such a tensor) the blocks land in it in place (as
        many as fit); else a new torch tensor (array="numpy": numpy array) of the cached tokens.
        extra_keys: block i's extra keys, as put took them.

        A namespace with groups returns exactly what resuming at the longest usable prefix P needs:
        (cached_tokens, [GroupKV per group]), a KV group's records from block .start (0 for full
        and indexer groups, the window's first block for a sliding one) to P as .kv, a state group's
        state at P (.kv [layers, kv_heads, elements], None for P = 0). Read over gRPC."""
        if getattr(ns, "groups", None):
            return self._get_resume(ns, tokens, array, extra_keys)
        return self.batch_get(ns, [tokens], None if out is None else [out], array=array,
                              extra_keys=None if extra_keys is None else [extra_keys], tp_rank=tp_rank,
                              tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size)[0]

    def _get_resume(self, ns, tokens, array, extra_keys):
        _core.check_ns(ns)
        self.meta(ns)
        rd = _groups.ResumeRead(ns, array)
        try:
            for f in self._cache.BatchGet(_groups.resume_request(ns, tokens, extra_keys), timeout=self.timeout,
                                          metadata=self._md):
                rd.on_frame(f)
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        return rd.results()

    def batch_get(self, ns, prompts, outs=None, *, array=None, extra_keys=None, tp_rank=0, tp_size=1, pp_rank=0,
                  pp_size=1):
        """get of many prompts in one call; returns [(cached_tokens, kv[, scales]), ...].
        extra_keys: one list per prompt (or None)."""
        prompts = list(prompts)
        sl = _core.rank_slice(ns, tp_rank, tp_size, pp_rank, pp_size)
        _check_outs(ns, prompts, outs, array, sl)
        m = self.meta(ns)
        plan = _core.GetPlan(ns, prompts, outs, array, m, extra_keys, sl)
        if plan.keys:
            conn = self._shm_conn(m)
            if conn is not None:
                try:
                    conn.get(plan.keys, plan.shm_consume, plan.parts())
                except (OSError, _shm.ShmError):
                    pass
                self.counters["shm_get"] += len(plan.keys) - len(plan.missing())
            else:
                tcp = self._tcp_conn(m)
                if tcp is not None:
                    try:
                        tcp.get(plan.keys, plan.tcp_buffers, plan.tcp_landed, plan.parts())
                    except (OSError, _shm.ShmError):
                        pass
                    self.counters["tcp_get"] += len(plan.keys) - len(plan.missing())
            which = plan.missing()
            if which:
                runs = plan.streams(which)
                if len(runs) == 1:
                    self._read(plan, *runs[0])
                else:
                    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
                        for f in [pool.submit(self._read, plan, w, p) for w, p in runs]:
                            f.result()
            self.counters["grpc_get"] += len(which) - len(plan.missing())
        return plan.results()

    # ---- objects (issue 33; _objects.py) ----

    def put_objects(self, ns, objects, *, pin="none", ttl=0.0, upsert=False, piece_bytes=_objects.DEFAULT_PIECE_BYTES):
        """Stores objects, {name: value} or [(name, value)], under their names in ns (values:
        bytes-like or numpy arrays, read where they lie). Returns one exception per object, or
        None for each stored (or held already: a second put keeps the first value unless
        upsert). pin ("none", "soft", "hard") and ttl (seconds: a lease without a pin, the pin's
        lifetime with one) are applied as each piece is stored, within the node's limits."""
        _core.check_ns(ns)
        items = list(objects.items() if isinstance(objects, dict) else objects)
        pins = block.PINS.index(pin)
        first, rest, errors = self._objects.plan(ns, [(n, [_objects.as_u8(v)]) for n, v in items], piece_bytes,
                                                 pins, int(ttl * 1000))
        if upsert:
            self._objects.remove(ns, [n for (n, _v), e in zip(items, errors) if e is None])
        self._objects.put(rest, errors)
        self._objects.put([r for r in first if errors[r.obj] is None], errors)
        return errors

    def get_objects(self, ns, names):
        """The values of objects by name (bytes), None for each not found."""
        _core.check_ns(ns)
        out = [None] * len(names)

        def sink(i, _h, spans):
            out[i] = b"".join(sp.tobytes() for sp in spans)
        self._objects.read(ns, list(names), sink)
        return out

    def remove_objects(self, ns, names):
        """Removes objects (every piece) from every node of the cluster, whatever their
        retention; per name whether a node held it."""
        _core.check_ns(ns)
        return self._objects.remove(ns, list(names))

    def retain(self, ns, *, objects=(), tokens=None, pin="none", ttl=0.0):
        """Sets the retention of objects by name and of the blocks of a prompt's prefix (tokens),
        on the nodes that own them, replacing what they had (pin "none" and ttl 0 clear it).
        Returns per item (the objects, then the prompt's full blocks) whether it was applied.
        Pin a prefix from its first block: a block's descendants go with it."""
        _core.check_ns(ns)
        m = self.meta(ns)
        chain, chunks = [], None
        if tokens is not None:
            kns = ns.salted(m.salt)
            chain = _core.key_bytes(kns, _core._token_bytes(tokens), m.key_version)
            chunks = _core.chunk_keys(chain, ns, m.chunk_tokens)
        return self._objects.retain(ns, list(objects), chain, chunks, block.PINS.index(pin), int(ttl * 1000))
