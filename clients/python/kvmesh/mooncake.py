"""A Mooncake Store-compatible class over kvmesh's objects.

The inference engines' Mooncake backends -- vLLM's MooncakeStoreConnector,
SGLang's Mooncake HiCache storage backend, LMCache's Mooncake remote backend --
drive one object, ``mooncake.store.MooncakeDistributedStore``. This module has a
class of that name with the methods they call, Mooncake's argument order, return
codes and semantics, over a kvmesh node: change the import and point the
"master" address at a kvmesh node's gRPC address::

    from kvmesh.mooncake import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    store.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", "127.0.0.1:7600")

Mapping of setup's arguments (positional, or the config-dict form):

- ``master_server_addr``: the kvmesh node's gRPC address (``kvmesh serve
  --grpc-addr``). There is no master: any node answers for the cluster.
- ``metadata_server``: accepted and ignored (kvmesh needs no metadata server:
  ``P2PHANDSHAKE``, ``http://...``, ``etcd://...`` all do).
- ``protocol``: ``tcp`` or ``rdma``: the fastest path kvmesh has is used either
  way (the node's shared memory on its host, else its TCP data plane; kvmesh has
  no RDMA transport yet). Other protocols (``efa``, ``cxl``, ``ascend``) are
  refused.
- ``global_segment_size``, ``local_buffer_size``, ``rdma_devices``: accepted and
  ignored: memory is the node's (``--dram``, ``--nvme``), this process
  contributes none and stages nothing.
- ``local_hostname``: returned by ``get_hostname()``.
- ``tenant_id``: kvmesh keeps each tenant's objects apart by namespace salt: a
  tenant id other than ``"default"`` salts the namespace with it. A node with
  tenants (``--auth-token-file``) salts it with the caller's tenant itself.
- ``engine``: a Mooncake TransferEngine cannot be used; pass None.
- kvmesh's own keywords (and config-dict keys): ``token`` (the node's bearer
  token; default the KVMESH_TOKEN environment variable), ``tls`` (as
  ``kvmesh.Client``), ``namespace`` (a ``kvmesh.Namespace`` to keep the objects
  in; default ``DEFAULT_NAMESPACE``), ``timeout`` (seconds), ``piece_bytes``
  (the largest piece an object is cut into; it must fit the node's
  ``--max-block-bytes``).

Semantics kept from Mooncake: a put of a key already stored succeeds and keeps
the first value; upsert replaces it; ``get`` of a missing key is ``b""``;
``get_into`` and the batch gets answer bytes read or a negative error code;
``is_exist`` 1, 0 or -1; puts and removes answer 0 or a negative code, per key
for batches; array lengths that do not match answer INVALID_PARAMS for every
key. ReplicateConfig: ``with_hard_pin`` pins objects (never evicted, counted
against the namespace's quota and the node's ``--max-pinned``);
``soft_pin_action = ENABLE`` (or ``with_soft_pin``) soft-pins them (evicted only
when nothing unpinned is left) for ``soft_pin_ttl_ms``; ``replica_num``,
``preferred_segment``, ``prefer_alloc_in_same_node`` and ``group_ids`` are
accepted: kvmesh places every object on the cluster's ``--replicas`` owners by
its key, and keeps a copy on the node it was put through while it has room.
``nof_replica_num`` and ``dfs_replica_num`` are refused (NOT_SUPPORTED).

Zero copy: ``register_buffer(ptr, size)`` names host memory (a CPU tensor's
``data_ptr()``, pinned or not); ``put_from``, ``get_into`` and their batch and
multi-buffer forms move bytes between it and the node without an intermediate
Python object: a put is sent from that memory in one sendmsg over the node's
unix socket (its shared memory; TCP elsewhere), a get copies each value from the
node's DRAM, mapped read-only into this process, straight into it. A pointer
outside every registered region, or in memory this process cannot address
(device memory), answers INVALID_PARAMS.

Methods of Mooncake's class that kvmesh does not provide raise
``NotImplementedError`` saying so; none succeeds silently. See each method's
doc, and docs/MOONCAKE.md.
"""
import bisect
import ctypes
import enum
import logging
import os
import threading

import numpy as np

from . import _objects, block
from ._namespace import Namespace
from .client import Client
from .errors import (DeadlineExceeded, InvalidArgument, KVMeshError, PermissionDenied, ResourceExhausted,
                     Unavailable)

log = logging.getLogger("kvmesh.mooncake")

#: The namespace objects are kept in unless setup names another.
DEFAULT_NAMESPACE = Namespace("mooncake", "int8", 1, layers=1, kv_heads=1, head_dim=1)

# Mooncake's ErrorCode values (mooncake-store/include/types.h) that this class answers.
OK = 0
INTERNAL_ERROR = -1
NO_AVAILABLE_HANDLE = -200
INVALID_KEY = -400
INVALID_PARAMS = -600
ILLEGAL_CLIENT = -601
OBJECT_NOT_FOUND = -704
TRANSFER_FAIL = -800
RPC_FAIL = -900
RPC_TIMEOUT = -901
NOT_SUPPORTED = -1012


class SoftPinAction(enum.IntEnum):
    """What a put does to the soft pin (Mooncake's SoftPinAction)."""
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    """Mooncake's per-put configuration; see the module doc for what kvmesh does with each field."""

    def __init__(self):
        self.replica_num = 1
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.with_soft_pin = False
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms = None
        self.with_hard_pin = False
        self.preferred_segment = ""
        self.prefer_alloc_in_same_node = False
        self.group_ids = None

    def __repr__(self):
        return (f"ReplicateConfig(replica_num={self.replica_num}, soft_pin_action={self.soft_pin_action.name}, "
                f"soft_pin_ttl_ms={self.soft_pin_ttl_ms}, with_hard_pin={self.with_hard_pin}, "
                f"preferred_segment={self.preferred_segment!r})")

    __str__ = __repr__


def _retention(config, upsert):
    """(pin, ttl_ms) of a put under config, or an error code."""
    if config is None:
        return 0, 0, OK
    if not isinstance(config, ReplicateConfig):
        raise TypeError(f"config: want a ReplicateConfig, got {type(config).__name__}")
    if config.nof_replica_num or config.dfs_replica_num:
        log.warning("nof_replica_num and dfs_replica_num are not supported by kvmesh: the node's NVMe tier "
                    "(--nvme) keeps objects on flash")
        return 0, 0, NOT_SUPPORTED
    ttl = config.soft_pin_ttl_ms
    action = SoftPinAction(config.soft_pin_action)
    if ttl is not None and (action != SoftPinAction.ENABLE or ttl < 0):
        return 0, 0, INVALID_PARAMS  # as Mooncake: a TTL only with ENABLE
    if config.with_hard_pin:
        return 2, 0, OK
    if action == SoftPinAction.ENABLE or config.with_soft_pin:
        return 1, int(ttl or 0), OK
    return 0, 0, OK


def _code(e):
    """Mooncake's error code for an exception."""
    if isinstance(e, ResourceExhausted):
        return NO_AVAILABLE_HANDLE
    if isinstance(e, (ValueError, TypeError)) and not isinstance(e, KVMeshError):
        return INVALID_KEY  # the name: empty, too long, not UTF-8
    if isinstance(e, InvalidArgument):
        return INVALID_PARAMS
    if isinstance(e, PermissionDenied):
        return ILLEGAL_CLIENT
    if isinstance(e, DeadlineExceeded):
        return RPC_TIMEOUT
    if isinstance(e, Unavailable):
        return RPC_FAIL
    return INTERNAL_ERROR


class _Regions:
    """The registered buffers: sorted, non-overlapping (base, size)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._bases, self._sizes = [], []

    def add(self, base, size):
        with self._lock:
            k = bisect.bisect_left(self._bases, base)
            if k < len(self._bases) and self._bases[k] == base:
                self._sizes[k] = max(self._sizes[k], size)
                return
            self._bases.insert(k, base)
            self._sizes.insert(k, size)

    def remove(self, base):
        with self._lock:
            k = bisect.bisect_left(self._bases, base)
            if k == len(self._bases) or self._bases[k] != base:
                return False
            del self._bases[k], self._sizes[k]
            return True

    def covers(self, ptr, size):
        with self._lock:
            k = bisect.bisect_right(self._bases, ptr) - 1
            while k >= 0:
                if self._bases[k] + self._sizes[k] >= ptr + size:
                    return True
                k -= 1
            return False


def _host_mapped(ptr, size):
    """Whether [ptr, ptr+size) lies in readable and writable mappings of this process (host
    memory; device memory reserved for CUDA's unified addressing is mapped with no access)."""
    end = ptr + size
    try:
        with open("/proc/self/maps") as f:
            spans = []
            for line in f:
                rng, perms = line.split(None, 2)[:2]
                lo, hi = (int(x, 16) for x in rng.split("-"))
                if hi > ptr and lo < end and perms.startswith("rw"):
                    spans.append((lo, hi))
    except OSError:
        return True  # no /proc: trust the caller
    spans.sort()
    at = ptr
    for lo, hi in spans:
        if lo > at:
            return False
        at = max(at, hi)
        if at >= end:
            return True
    return at >= end


class MooncakeDistributedStore:
    """Mooncake's store, over a kvmesh node. Safe to share between threads (as the engines do)."""

    def __init__(self):
        self._c = None
        self._ns = DEFAULT_NAMESPACE
        self._hostname = ""
        self._piece_bytes = _objects.DEFAULT_PIECE_BYTES
        self._regions = _Regions()
        self._warned = set()

    # ---- setup ----

    def setup(self, *args, **kwargs):
        """setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
        rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False, ssd_offload_path="",
        tenant_id="default", enable_client_http_server=False, client_http_port=9300, *, token=None,
        tls=None, namespace=None, timeout=10.0, piece_bytes=4 MiB), or setup(config: dict) with
        Mooncake's keys (local_hostname and metadata_server required, master_server_addr default
        "127.0.0.1:50051") and kvmesh's. Returns 0, or a negative code when the node does not
        answer. Raises ValueError for a protocol kvmesh does not serve, TypeError for arguments
        Mooncake does not take."""
        names = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size", "protocol",
                 "rdma_devices", "master_server_addr", "engine", "enable_ssd_offload", "ssd_offload_path",
                 "tenant_id", "enable_client_http_server", "client_http_port")
        own = ("token", "tls", "namespace", "timeout", "piece_bytes")
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            cfg = dict(args[0])
            for req in ("local_hostname", "metadata_server"):
                if req not in cfg:
                    raise TypeError(f"setup(config): {req!r} is required")
            cfg.setdefault("master_server_addr", "127.0.0.1:50051")
            cfg.setdefault("protocol", "tcp")
            unknown = set(cfg) - set(names) - set(own) - {"ipc_socket_path", "rdma_devices"}
            if unknown:
                log.warning("setup(config): ignoring keys kvmesh does not use: %s", ", ".join(sorted(unknown)))
        else:
            if len(args) > len(names):
                raise TypeError(f"setup takes at most {len(names)} positional arguments ({len(args)} given)")
            cfg = dict(zip(names, args))
            for k, v in kwargs.items():
                if k not in names and k not in own:
                    raise TypeError(f"setup: unexpected keyword argument {k!r}")
                if k in cfg:
                    raise TypeError(f"setup: got multiple values for argument {k!r}")
                cfg[k] = v
            missing = [n for n in names[:7] if n not in cfg]
            if missing:
                raise TypeError(f"setup: the positional form takes every argument through master_server_addr; "
                                f"missing {', '.join(missing)} (or pass a config dict)")
        protocol = str(cfg.get("protocol", "tcp")).lower()
        if protocol not in ("tcp", "rdma"):
            raise ValueError(f"protocol {protocol!r}: kvmesh serves 'tcp' and 'rdma' (either uses the node's "
                             "shared memory on its host, else its TCP data plane)")
        if cfg.get("engine") is not None:
            log.warning("setup: a Mooncake TransferEngine is not used by kvmesh; ignoring it")
        ns = cfg.get("namespace") or DEFAULT_NAMESPACE
        if not isinstance(ns, Namespace):
            raise TypeError(f"namespace: want a kvmesh.Namespace, got {type(ns).__name__}")
        tenant = cfg.get("tenant_id") or "default"
        if tenant != "default":
            ns = Namespace(ns.model, ns.dtype, ns.block_tokens, ns.layers, ns.kv_heads, ns.head_dim,
                           f"mooncake-tenant:{tenant}" + (":" + ns.tenant_salt if ns.tenant_salt else ""),
                           kv_layout=ns.kv_layout, latent_dim=ns.latent_dim, scales=ns.scales, lora=ns.lora,
                           key_scheme=ns.key_scheme, hash_seed=ns.hash_seed, extra_key_bytes=ns.extra_key_bytes)
        self._ns = ns
        self._hostname = str(cfg.get("local_hostname", ""))
        self._piece_bytes = int(cfg.get("piece_bytes") or _objects.DEFAULT_PIECE_BYTES)
        if self._c is not None:
            self._c.close()
        self._c = Client(str(cfg["master_server_addr"]), token=cfg.get("token") or os.environ.get("KVMESH_TOKEN"),
                         tls=cfg.get("tls"), timeout=float(cfg.get("timeout") or 10.0))
        try:
            self._c.meta(ns)
        except KVMeshError as e:
            log.error("setup: the kvmesh node at %s does not answer: %s", cfg["master_server_addr"], e)
            return _code(e)
        return OK

    def setup_dummy(self, *args, **kwargs):
        """Not provided: kvmesh has no dummy client of a real one; setup() this process against the
        node directly (on the node's host it uses the node's shared memory)."""
        raise NotImplementedError("setup_dummy: kvmesh has no dummy client; call setup() with the node's gRPC "
                                  "address as master_server_addr")

    def init_all(self, *args, **kwargs):
        """Not provided: use setup()."""
        raise NotImplementedError("init_all: use setup() with the node's gRPC address")

    def close(self):
        """Closes the node's connections. Returns 0."""
        if self._c is not None:
            self._c.close()
            self._c = None
        return OK

    def get_hostname(self):
        """The local_hostname given to setup."""
        return self._hostname

    def _client(self):
        if self._c is None:
            raise RuntimeError("MooncakeDistributedStore: call setup() first")
        return self._c

    # ---- memory ----

    def register_buffer(self, buffer_ptr, size):
        """Registers size bytes of host memory at buffer_ptr for put_from/get_into. Returns 0, or
        INVALID_PARAMS for a null pointer, a size of 0 or less, or memory this process cannot
        address (device memory: kvmesh moves host memory)."""
        if not buffer_ptr or size <= 0:
            return INVALID_PARAMS
        if not _host_mapped(buffer_ptr, size):
            log.error("register_buffer(%#x, %d): not host memory this process can read and write (device "
                      "memory is not supported: stage it in host memory)", buffer_ptr, size)
            return INVALID_PARAMS
        self._regions.add(buffer_ptr, size)
        return OK

    def unregister_buffer(self, buffer_ptr):
        """Forgets a registered buffer. Returns 0, or INVALID_PARAMS when none starts at buffer_ptr."""
        return OK if self._regions.remove(buffer_ptr) else INVALID_PARAMS

    def _spans(self, ptrs, sizes):
        """(address, size) of registered memory, or None when a range is not registered."""
        for p, n in zip(ptrs, sizes):
            if n < 0 or (n and not self._regions.covers(p, n)):
                self._warn("unregistered", f"buffer [{p:#x}, +{n}) lies outside every registered buffer "
                                           "(register_buffer it first)")
                return None
        return list(zip(ptrs, sizes))

    def _runs(self, ptrs, sizes):
        """Numpy views of registered memory (for puts), or None when a range is not registered."""
        spans = self._spans(ptrs, sizes)
        return None if spans is None else [_objects.raw(p, n) for p, n in spans]

    def _warn(self, what, msg):
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s", msg)

    # ---- puts ----

    def _put_many(self, keys, runs, config, upsert):
        """Per key 0 or a negative code; runs[i] None marks a bad buffer (INVALID_PARAMS)."""
        pin, ttl, code = _retention(config, upsert)
        if code != OK:
            return [code] * len(keys)
        if config is not None and config.replica_num > 1:
            self._warn("replicas", "replica_num > 1: kvmesh places every object on the cluster's --replicas "
                                   "owners; it cannot raise that per object")
        out = [OK] * len(keys)
        items, idx = [], []
        for i, (k, r) in enumerate(zip(keys, runs)):
            if r is None:
                out[i] = INVALID_PARAMS
            else:
                items.append((k, r))
                idx.append(i)
        if not items:
            return out
        c = self._client()
        io = c._objects
        try:
            first, rest, errors = io.plan(self._ns, items, self._piece_bytes, pin, ttl)
            if upsert:
                io.remove(self._ns, [k for (k, _r), e in zip(items, errors) if e is None])
            io.put(rest, errors)
            io.put([r for r in first if errors[r.obj] is None], errors)
        except KVMeshError as e:
            log.error("put: %s", e)
            for i in idx:
                out[i] = _code(e)
            return out
        for j, e in enumerate(errors):
            if e is not None:
                out[idx[j]] = _code(e)
        return out

    def put(self, key, value, config=None):
        """Stores value (bytes-like) under key. 0, or a negative code. A key already stored keeps
        its value (0)."""
        return self._put_many([key], [[_objects.as_u8(value)]], config, False)[0]

    def put_parts(self, key, *parts, config=None):
        """Stores the concatenation of parts (bytes-like) under key, sent from where they lie."""
        return self._put_many([key], [[_objects.as_u8(p) for p in parts]], config, False)[0]

    def put_batch(self, keys, values, config=None):
        """Stores values under keys. 0, or the first negative code."""
        if len(keys) != len(values):
            return INVALID_PARAMS
        codes = self._put_many(list(keys), [[_objects.as_u8(v)] for v in values], config, False)
        return next((c for c in codes if c != OK), OK)

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores size bytes of registered memory at buffer_ptr under key (zero copy)."""
        return self._put_many([key], [self._runs([buffer_ptr], [size])], config, False)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """put_from for many keys: per key 0 or a negative code."""
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return self._put_many(list(keys), [self._runs([p], [n]) for p, n in zip(buffer_ptrs, sizes)], config, False)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Stores, under keys[i], the concatenation of the registered buffers all_buffer_ptrs[i]
        (sizes all_sizes[i]): per key 0 or a negative code."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) or \
                any(len(p) != len(s) for p, s in zip(all_buffer_ptrs, all_sizes)):
            return [INVALID_PARAMS] * len(keys)
        return self._put_many(list(keys), [self._runs(p, s) for p, s in zip(all_buffer_ptrs, all_sizes)], config,
                              False)

    def upsert(self, key, value, config=None):
        """put that replaces the value a key holds."""
        return self._put_many([key], [[_objects.as_u8(value)]], config, True)[0]

    def upsert_parts(self, key, *parts, config=None):
        return self._put_many([key], [[_objects.as_u8(p) for p in parts]], config, True)[0]

    def upsert_batch(self, keys, values, config=None):
        if len(keys) != len(values):
            return INVALID_PARAMS
        codes = self._put_many(list(keys), [[_objects.as_u8(v)] for v in values], config, True)
        return next((c for c in codes if c != OK), OK)

    def upsert_from(self, key, buffer_ptr, size, config=None):
        return self._put_many([key], [self._runs([buffer_ptr], [size])], config, True)[0]

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return self._put_many(list(keys), [self._runs([p], [n]) for p, n in zip(buffer_ptrs, sizes)], config, True)

    # ---- gets ----

    def _read(self, keys, sink):
        """Reads keys, sink(i, parts) per object found; returns a code per key: OK when found,
        OBJECT_NOT_FOUND, INVALID_KEY, or the call's code for all."""
        out = [OBJECT_NOT_FOUND] * len(keys)
        good, idx = [], []
        for i, k in enumerate(keys):
            try:
                block.check_object_name(k)
                good.append(k)
                idx.append(i)
            except (ValueError, TypeError):
                out[i] = INVALID_KEY
        if not good:
            return out

        def found(j, _h, parts):
            out[idx[j]] = OK
            sink(idx[j], parts)
        try:
            self._client()._objects.read(self._ns, good, found)
        except KVMeshError as e:
            log.error("get: %s", e)
            return [_code(e) if o != INVALID_KEY else o for o in out]
        return out

    def get(self, key):
        """The value of key (bytes), b"" when it is not stored."""
        got = {}
        self._read([key], lambda i, spans: got.setdefault(i, b"".join(sp.tobytes() for sp in spans)))
        return got.get(0, b"")

    def get_batch(self, keys):
        """The values of keys (bytes each, b"" when not stored)."""
        got = {}
        self._read(list(keys), lambda i, spans: got.setdefault(i, b"".join(sp.tobytes() for sp in spans)))
        return [got.get(i, b"") for i in range(len(keys))]

    def get_buffer(self, key):
        """The value of key as a buffer (buffer protocol; .size(), .ptr()), or None."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys):
        """get_buffer of many keys: a buffer, or None, per key."""
        got = {}

        def keep(i, spans):
            b = Buffer(sum(sp.n for sp in spans))
            if len(b):
                _objects.scatter(spans, [(np.frombuffer(b, np.uint8).ctypes.data, len(b))])
            got[i] = b
        self._read(list(keys), keep)
        return [got.get(i) for i in range(len(keys))]

    def _get_into(self, keys, dsts):
        """dsts[i]: (address, size) runs of registered memory, or None for a bad buffer. Per key
        bytes read or a negative code."""
        out = [INVALID_PARAMS] * len(keys)
        want = [i for i, d in enumerate(dsts) if d is not None]
        if not want:
            return out

        def land(j, spans):
            i = want[j]
            n = sum(sp.n for sp in spans)
            if n > sum(size for _p, size in dsts[i]):
                out[i] = INVALID_PARAMS  # as Mooncake: the buffer is smaller than the object
                return
            _objects.scatter(spans, dsts[i])
            out[i] = n
        with _objects.deferred_copies():  # the batch's copies run together, split over threads
            codes = self._read([keys[i] for i in want], land)
        for j, i in enumerate(want):
            if codes[j] != OK:
                out[i] = codes[j]
        return out

    def get_into(self, key, buffer_ptr, size):
        """Reads key into size bytes of registered memory at buffer_ptr (zero copy): bytes read,
        or a negative code (OBJECT_NOT_FOUND; INVALID_PARAMS for an unregistered buffer or one
        smaller than the value)."""
        return self._get_into([key], [self._spans([buffer_ptr], [size])])[0]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """get_into for many keys: per key bytes read or a negative code."""
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        return self._get_into(list(keys), [self._spans([p], [n]) for p, n in zip(buffer_ptrs, sizes)])

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes):
        """Reads keys[i] into the registered buffers all_buffer_ptrs[i] (sizes all_sizes[i]), in
        order: per key bytes read or a negative code."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) or \
                any(len(p) != len(s) for p, s in zip(all_buffer_ptrs, all_sizes)):
            return [INVALID_PARAMS] * len(keys)
        return self._get_into(list(keys), [self._spans(p, s) for p, s in zip(all_buffer_ptrs, all_sizes)])

    # ---- existence, size, removal ----

    def is_exist(self, key):
        """1 when key is stored (anywhere in the cluster), 0 when not, -1 on error."""
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys):
        """is_exist of many keys."""
        keys = list(keys)
        out = [-1] * len(keys)
        good = []
        for i, k in enumerate(keys):
            try:
                block.check_object_name(k)
                good.append(i)
            except (ValueError, TypeError):
                pass
        if not good:
            return out
        try:
            present = self._client()._objects.exists(self._ns, [keys[i] for i in good])
        except KVMeshError as e:
            log.error("is_exist: %s", e)
            return out
        for i, p in zip(good, present):
            out[i] = 1 if p else 0
        return out

    def get_size(self, key):
        """The size in bytes of the value of key, or OBJECT_NOT_FOUND (INVALID_KEY for a bad key)."""
        try:
            block.check_object_name(key)
            h = self._client()._objects.headers(self._ns, [key])[0]
        except (ValueError, TypeError):
            return INVALID_KEY
        except KVMeshError as e:
            return _code(e)
        return OBJECT_NOT_FOUND if h is None else h.size

    def remove(self, key, force=False):
        """Removes key from every node of the cluster, whatever its pin: 0, or OBJECT_NOT_FOUND.
        force is accepted (kvmesh holds no read leases that a removal waits for)."""
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys, force=False):
        """remove of many keys: per key 0 or a negative code."""
        keys = list(keys)
        out = [INVALID_KEY] * len(keys)
        good = []
        for i, k in enumerate(keys):
            try:
                block.check_object_name(k)
                good.append(i)
            except (ValueError, TypeError):
                pass
        if not good:
            return out
        try:
            found = self._client()._objects.remove(self._ns, [keys[i] for i in good])
        except KVMeshError as e:
            log.error("remove: %s", e)
            return [_code(e)] * len(keys)
        for i, f in zip(good, found):
            out[i] = OK if f else OBJECT_NOT_FOUND
        return out

    def remove_all(self, force=False):
        """Removes every object of the store's namespace from every node of the cluster
        (AdminService.DropNamespace on each member; needs the admin scope on a node with
        tokens). Returns how many records were removed, or -1."""
        from .v1 import admin_pb2, admin_pb2_grpc
        import grpc
        c = self._client()
        try:
            members = c._call(c._admin.Members, admin_pb2.MembersRequest())
        except KVMeshError as e:
            log.error("remove_all: %s", e)
            return -1
        m = c.meta()
        req = admin_pb2.DropNamespaceRequest(namespace=self._ns.salted(m.salt).to_proto())
        total = 0
        for mem in members.members:
            stub = c._admin if mem.id == members.self_id else None
            ch = None
            try:
                if stub is None:
                    ch = grpc.insecure_channel(mem.grpc_addr)
                    stub = admin_pb2_grpc.AdminServiceStub(ch)
                total += c._call(stub.DropNamespace, req).dropped_blocks
            except KVMeshError as e:
                log.error("remove_all on %s: %s", mem.id, e)
                return -1
            finally:
                if ch is not None:
                    ch.close()
        return total

    def remove_by_regex(self, regex):
        """Not provided: kvmesh stores objects under hashes of their names and cannot list names."""
        raise NotImplementedError("remove_by_regex: kvmesh keys objects by a hash of their name and cannot match "
                                  "names; remove them by name, or remove_all()")

    def get_replica_desc(self, key):
        """Not provided: kvmesh does not expose where replicas lie (kvmesh inspect object shows the tier)."""
        raise NotImplementedError("get_replica_desc: not provided by kvmesh (see `kvmesh inspect object`)")

    def batch_get_replica_desc(self, keys):
        """Not provided (see get_replica_desc)."""
        raise NotImplementedError("batch_get_replica_desc: not provided by kvmesh (see `kvmesh inspect object`)")

    def __getattr__(self, name):
        # Any other method of Mooncake's class (tensor helpers, segments, tasks, ...): refused
        # loudly, never a silent success.
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(f"MooncakeDistributedStore.{name}: not provided by kvmesh's Mooncake-compatible "
                                  "class (see kvmesh.mooncake's doc for what is)")


def install_as_mooncake():
    """Makes ``import mooncake.store`` (and ``from mooncake.store import
    MooncakeDistributedStore, ReplicateConfig``) give this module, so that an engine's unchanged
    Mooncake backend runs on kvmesh; one line in a .pth file runs it in every process of an
    environment (docs/MOONCAKE.md). Returns False, changing nothing, when the real mooncake
    package is installed: it is never shadowed."""
    import importlib.util
    import sys
    import types
    if "mooncake" in sys.modules:
        return sys.modules.get("mooncake.store") is sys.modules[__name__]
    if importlib.util.find_spec("mooncake") is not None:
        log.warning("install_as_mooncake: the mooncake package is installed; not shadowing it")
        return False
    pkg = types.ModuleType("mooncake", "kvmesh's stand-in for the mooncake package (kvmesh.mooncake)")
    pkg.__path__ = []
    pkg.store = sys.modules[__name__]
    sys.modules["mooncake"] = pkg
    sys.modules["mooncake.store"] = sys.modules[__name__]
    return True


class Buffer(bytearray):
    """A value read by get_buffer: a bytearray (so the buffer protocol: memoryview(b),
    numpy.frombuffer(b)) with Mooncake's BufferHandle methods .size() and .ptr()."""

    def size(self):
        return len(self)

    def ptr(self):
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self)) if len(self) else 0
