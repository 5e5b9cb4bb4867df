"""What the sync and asyncio clients share: planning puts and gets, reading the
node's answers. No I/O here; client.py and aio.py do it."""
import os
from dataclasses import dataclass, field

import numpy as np

from . import _shm, _tensors, _xxhash, block
from ._namespace import KEY_VERSION, Namespace, key_bytes, key_links
from .errors import InvalidArgument, KVMeshError, PartConflict
from .v1 import cache_pb2

CHUNK_BYTES = 1 << 20  # payload bytes per gRPC message (the node takes messages up to 4 MiB)
DEFAULT_CHUNK_TOKENS = 512


@dataclass
class CachedBlock:
    key: str   # 32 hex digits
    node: str  # id of a node holding it
    tier: str  # dram, nvme, ...


@dataclass
class GroupLookup:
    kind: str    # full, sliding, state, indexer
    blocks: int  # full/indexer: leading blocks held; sliding/state: the longest prefix it alone allows


@dataclass
class LookupResult:
    cached_tokens: int
    cached_blocks: int
    prompt_tokens: int
    blocks: list = field(default_factory=list)
    # A namespace with groups: per group, a GroupLookup (kind, blocks): what it allows on its
    # own, so a shorter hit than the full-attention blocks says why.
    groups: list = field(default_factory=list)


@dataclass
class Meta:
    """What the client learns from its node once: whom it is, where the node's
    shared memory is, how it keys."""
    salt: str = ""
    tag: int = 0
    shm_socket: str = ""
    data_addr: str = ""
    same_host: bool = False
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    key_version: int = 0  # 0: not probed yet


def local_host_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def meta_from(whoami, members):
    """Meta from a WhoAmI answer and the first page of Members: the node that answers is
    listed first, and only it matters here (a page of one suffices)."""
    m = Meta()
    if whoami is not None:
        m.salt, m.tag = whoami.namespace_salt, whoami.tenant_tag
    if members is not None:
        m.chunk_tokens = members.chunk_tokens or DEFAULT_CHUNK_TOKENS
        for mem in members.members:
            if mem.id == members.self_id:
                m.shm_socket = mem.shm_socket
                m.data_addr = mem.data_addr
                m.same_host = bool(mem.host_id) and mem.host_id == local_host_id() and os.path.exists(mem.shm_socket)
    return m


def check_ns(ns):
    if not isinstance(ns, Namespace):
        raise TypeError(f"ns: want a kvmesh.Namespace, got {type(ns).__name__}")


def _probe_ns(ns):
    """ns, or for a namespace with groups (whose reads by tokens are resume reads, answering
    nothing uncached) one without them that keys as the node keys it."""
    if not ns.groups:
        return ns
    return Namespace(ns.model, ns.dtype, ns.block_tokens, ns.layers, 1, 1, ns.tenant_salt, lora=ns.lora,
                     key_scheme=ns.key_scheme, hash_seed=ns.hash_seed, extra_key_bytes=ns.extra_key_bytes)


def probe_request(ns):
    """A BatchGet whose first answer names the key the node computes for one block of
    zeros: whether it keys blocks as this client does (format 1 nodes predate SHA-256
    keys; a node that salts a tenant's namespaces without saying so would differ too)."""
    return cache_pb2.BatchGetRequest(namespace=_probe_ns(ns).to_proto(), tokens=[0] * ns.block_tokens, prefix=True)


def key_version_from(ns, salt, key):
    kns = _probe_ns(ns).salted(salt)
    if key_bytes(kns, [0] * ns.block_tokens)[0] == key:
        return KEY_VERSION
    raise KVMeshError(f"the node keys blocks differently from this client (key format {KEY_VERSION}): a node "
                      "from before the SHA-256 keys, or one that salts namespaces without saying so; upgrade it")


def chunk_keys(keys, ns, chunk_tokens):
    c = max(1, chunk_tokens // ns.block_tokens)
    return [keys[i - i % c] for i in range(len(keys))]


# ---- put ----

def rank_slice(ns, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
    """The Slice of ns's blocks that a parallel rank holds (block.rank_part); BadPart when the
    rank layout does not fit the namespace."""
    check_ns(ns)
    return _tensors.Slice(ns, block.rank_part(ns, tp_rank, tp_size, pp_rank, pp_size),
                          (tp_rank, tp_size, pp_rank, pp_size))


class PutPlan:
    """The blocks of a batch of prompts: keys, parents, chunk keys, payloads (a rank's parts)."""

    def __init__(self, ns, items, meta, sl=None):
        """items: (tokens, kv[, scales[, extra_keys]]) per prompt; sl: the rank's Slice (default
        the whole block)."""
        check_ns(ns)
        self.ns, self.meta = ns, meta
        self.sl = sl = sl or _tensors.whole(ns)
        self.kns = ns.salted(meta.salt)
        B = ns.block_tokens
        self.blocks = []  # (prompt, index, tokens bytes, parent link, key, chunk, payload runs, extra keys)
        self.per_prompt = []
        self._keep = []
        for p, item in enumerate(items):
            tokens, kv = item[0], item[1]
            scales = item[2] if len(item) > 2 else None
            extra = list(item[3] or ()) if len(item) > 3 else []
            name = f" of prompt {p}" if len(items) > 1 else ""
            tb = _token_bytes(tokens)
            _tensors.check_kv(sl, kv, n_tokens=len(tb) // 4, name="kv" + name)
            sc = _tensors.check_scales(sl, scales, len(tb) // 4 // B, name="scales" + name)
            u8, staged = _tensors.host_u8(kv, sl)
            self._keep.append((u8, staged, sc))
            links = key_links(self.kns, tb, extra, meta.key_version)
            ks = [link[:16] for link in links]
            cks = chunk_keys(ks, ns, meta.chunk_tokens)
            parent = self.kns.root_link(meta.key_version)
            for i, k in enumerate(ks):
                # The block's part in the stored order, then its scales: views of the tensor
                # where the order allows (the data planes send them as they lie), else one
                # copy of the block (put_runs).
                runs = _tensors.put_runs(sl, u8, i)
                if sc is not None:
                    runs.append(sc[i].view(np.uint8))
                e = extra[i] if i < len(extra) and extra[i] else []
                self.blocks.append((p, i, tb[4 * i * B:4 * (i + 1) * B], parent, k, cks[i], runs, e))
                parent = links[i]
            self.per_prompt.append(len(ks))
        # What the put has done so far (both clients drive the same steps): keys stored (or
        # needing nothing sent), and the indexes of blocks still to put.
        self.stored = []
        self.rest = list(range(len(self.blocks)))

    @staticmethod
    def checksum(runs):
        if not _xxhash.available:
            return 0
        return _xxhash.xxh64_parts([(r.__array_interface__["data"][0], r.nbytes) for r in runs])

    def shm_items(self, which=None):
        """keys, chunk keys, encoded headers and payload runs of blocks[which] (default all), as
        the data planes' puts take them: part records for a rank's part."""
        keys, chunks, heads, payloads = [], [], [], []
        for j in range(len(self.blocks)) if which is None else which:
            (_p, _i, tb, parent, k, ck, payload, extra) = self.blocks[j]
            h, link = block.encode_header(self.kns, parent, tb, self.checksum(payload), self.meta.tag,
                                          self.meta.key_version, extra, self.sl.part)
            assert link[:16] == k
            keys.append(k)
            chunks.append(ck)
            heads.append(h)
            payloads.append(payload)
        return keys, chunks, heads, payloads

    def requests(self, which):
        """The BatchPut stream of blocks[which] (indexes): whole blocks only (gRPC's BatchPut
        carries no part range)."""
        if not self.sl.whole:
            raise KVMeshError("a rank's part of a block (tp_size or pp_size > 1) is put through the node's data "
                              "plane (shared memory or TCP), which this client could not use; gRPC's BatchPut "
                              "takes whole blocks only")
        first = True
        nsp = self.ns.to_proto()
        for j in which:
            (_p, _i, tb, parent, k, ck, runs, extra) = self.blocks[j]
            data = memoryview(np.concatenate(runs)) if len(runs) > 1 else memoryview(runs[0])
            hdr = cache_pb2.BlockHeader(parent=parent[:16], tokens=np.frombuffer(tb, "<u4").tolist(),
                                        payload_len=data.nbytes, payload_checksum=self.checksum(runs), chunk_key=ck,
                                        extra_keys=[bytes(x) for x in extra],
                                        parent_link=parent if self.ns.key_scheme == "vllm" else b"")
            for off in range(0, data.nbytes, CHUNK_BYTES):
                req = cache_pb2.BatchPutRequest(data=bytes(data[off:off + CHUNK_BYTES]))
                if first:
                    req.namespace.CopyFrom(nsp)
                    first = False
                if off == 0:
                    req.block.CopyFrom(hdr)
                yield req

    def keys(self):
        return [b[4] for b in self.blocks]

    def claim_items(self):
        """keys and part ranges of every block, as the data planes' claim takes them."""
        return self.keys(), [self.sl.part] * len(self.blocks)

    def on_claims(self, statuses):
        """Takes the node's ClaimStatus per block: blocks complete, covered, or being sent by
        another writer holding the claim need nothing sent (stored); those answered CLAIM_WRITE
        are the rest to send."""
        self.stored = [b[4] for b, st in zip(self.blocks, statuses) if st != _shm.CLAIM_WRITE]
        self.rest = [j for j, st in enumerate(statuses) if st == _shm.CLAIM_WRITE]

    def on_put(self, keys, st):
        """Takes the data plane's put statuses of keys (shm_items(rest)): the stored leave rest;
        returns how many. Raises PartConflict when any part overlapped what the node holds with
        other bytes (nothing of those parts was stored)."""
        conflicts = [keys[j].hex() for j in range(len(keys)) if st[j] == _shm.STATUS_CONFLICT]
        if conflicts:
            raise PartConflict(f"{len(conflicts)} of {len(keys)} parts ({self.sl.part}) conflict with different "
                               f"bytes the node holds of the same blocks (first {conflicts[0]}); nothing of them "
                               "was stored")
        ok = [keys[j] for j in range(len(keys)) if st[j] == _shm.STATUS_OK]
        self.stored += ok
        self.rest = [self.rest[j] for j in range(len(keys)) if st[j] != _shm.STATUS_OK]
        return len(ok)

    def on_grpc(self, keys):
        """Takes the keys BatchPut stored; returns how many."""
        self.stored += list(keys)
        return len(keys)

    def unsent(self, tried):
        """The error for the rest of a rank's part that the data plane did not store (gRPC
        cannot carry parts): tried says whether a data plane was reached at all."""
        rest = self.rest
        if not tried:
            return KVMeshError(f"{len(rest)} parts ({self.sl.part}) not put: a rank's part of a block (tp_size or "
                               "pp_size > 1) goes through the node's data plane (shared memory or TCP), which this "
                               "client could not use (transport='grpc', TLS credentials it cannot reuse, or the "
                               "connection failed); gRPC's BatchPut takes whole blocks only")
        return KVMeshError(f"the node did not store {len(rest)} of {len(self.blocks)} parts ({self.sl.part}) "
                           f"(first {self.blocks[rest[0]][4].hex()}): it refused or asked to retry them")

    def counts(self):
        """Blocks stored per prompt."""
        got = set(self.stored)
        out = [0] * len(self.per_prompt)
        for (p, _i, _tb, _parent, k, _ck, _pl, _e) in self.blocks:
            if k in got:
                out[p] += 1
        return out


# ---- get ----

class GetPlan:
    """Keys of a batch of prompts and where their blocks land."""

    def __init__(self, ns, prompts, outs, array, meta, extra_keys=None, sl=None):
        check_ns(ns)
        self.sl = sl = sl or _tensors.whole(ns)
        if extra_keys is not None and len(extra_keys) != len(prompts):
            raise ValueError(f"extra_keys: {len(extra_keys)} lists for {len(prompts)} prompts")
        if outs is not None and len(outs) != len(prompts):
            raise ValueError(f"outs: {len(outs)} outputs for {len(prompts)} prompts")
        if array not in (None, "torch", "numpy"):
            raise ValueError(f"array: want 'torch' or 'numpy', got {array!r}")
        self.ns, self.meta = ns, meta
        self.kns = ns.salted(meta.salt)
        B = ns.block_tokens
        tbs = [_token_bytes(t) for t in prompts]
        for p, out in enumerate(outs or []):
            if out is not None:
                _tensors.check_kv(sl, out, name=f"outs[{p}]" if len(prompts) > 1 else "out")
        if array is None:
            array = "torch" if _tensors._torch() is not None else "numpy"
        self.array = array
        self.keys, self.where, self.dests, self.nblocks, self.given = [], [], [], [], []
        for p, tb in enumerate(tbs):
            nb = len(tb) // 4 // B
            out = outs[p] if outs is not None else None
            if out is not None:
                nb = min(nb, _tensors.tokens_of(ns, out) // B)
            else:
                out = _tensors.alloc(sl, nb * B, array)
            extra = list((extra_keys[p] if extra_keys is not None else None) or ())[:nb]
            ks = key_bytes(self.kns, tb[:4 * nb * B], meta.key_version, extra_keys=extra) if nb else []
            for i, k in enumerate(ks):
                self.keys.append(k)
                self.where.append((p, i))
            self.nblocks.append(nb)
            self.given.append(outs is not None and outs[p] is not None)
            self.dests.append(_tensors.Dest(sl, out))
        self.found = [set() for _ in tbs]
        self._tcp = {}

    def chunk_keys(self):
        out = []
        start = 0
        for nb in self.nblocks:
            out += chunk_keys(self.keys[start:start + nb], self.ns, self.meta.chunk_tokens)
            start += nb
        return out

    def land(self, j, payload):
        """Lands a whole block's payload (gRPC's BatchGet answers whole blocks): the rank's part
        of it is copied into place."""
        p, i = self.where[j]
        self.dests[p].put_whole(i, payload)
        self.found[p].add(i)

    def parts(self):
        """What the data planes ask for: None (whole blocks, getReq) or the rank's part per key
        (getPartReq: the node answers with part records)."""
        return None if self.sl.whole else [self.sl.part] * len(self.keys)

    def shm_consume(self, j, mem, mem_np, off, n):
        """Lands the encoded record at offset off (n bytes) of mem (the node's arena, read in
        place, or the shared region; mem_np a numpy view of it) for key j, if it checks out:
        header (checksum, versions, key = H(parent ‖ tokens)), the key asked for, the
        namespace, layout and part range. The payload is copied once, node memory to
        destination."""
        hl = block.namespace_header_len(self.kns)
        if n != hl + self.sl.part_bytes:
            return
        try:
            h = block.decode_header(mem[off:off + hl], self.meta.key_version)
            if h.header_len != hl:
                return
            block.check_namespace(h, self.kns, self.sl.part)
        except block.CorruptBlock:
            return
        if h.key != self.keys[j]:
            return
        p, i = self.where[j]
        self.dests[p].put_part(i, mem_np[off + hl:off + n])
        self.found[p].add(i)

    def tcp_buffers(self, j, n):
        """Where the value of key j (n bytes) is read to: its header into a buffer of its own,
        its payload straight into the destination where the stored order allows (Dest.segments),
        else into a buffer copied into place once checked."""
        p, i = self.where[j]
        hl = block.namespace_header_len(self.kns)
        if n != hl + self.sl.part_bytes:
            self._tcp[j] = None
            return [memoryview(bytearray(n))]  # not a record of this namespace and part: read and dropped
        hdr = bytearray(hl)
        segs = self.dests[p].segments(i)
        staged = None
        if segs is None:
            staged = np.empty(n - hl, np.uint8)
            segs = [memoryview(staged)]
        self._tcp[j] = (hdr, segs, staged)
        return [memoryview(hdr)] + segs

    def tcp_landed(self, j):
        """Checks the record read for key j (header, key, namespace, part, payload checksum): one
        that fails is a miss (its bytes in the destination are then unspecified)."""
        got = self._tcp.pop(j, None)
        if got is None:
            return
        hdr, segs, staged = got
        try:
            h = block.decode_header(hdr, self.meta.key_version)
            block.check_namespace(h, self.kns, self.sl.part)
        except block.CorruptBlock:
            return
        if h.key != self.keys[j] or h.header_len != len(hdr):
            return
        parts = [(np.frombuffer(s, np.uint8).ctypes.data, s.nbytes) for s in segs]
        if _xxhash.xxh64_parts(parts) != h.checksum:
            return
        p, i = self.where[j]
        if staged is not None:
            self.dests[p].put_part(i, staged)
        self.found[p].add(i)

    def missing(self):
        """Indexes of keys not landed yet."""
        return [j for j, (p, i) in enumerate(self.where) if i not in self.found[p]]

    def request(self, which, prefix=None):
        cks = self.chunk_keys()
        if prefix is None:
            prefix = len(self.dests) == 1
        return cache_pb2.BatchGetRequest(namespace=self.ns.to_proto(), keys=[self.keys[j] for j in which],
                                         chunk_keys=[cks[j] for j in which], prefix=prefix)

    def streams(self, which, most=4, min_bytes=8 << 20):
        """which cut into up to `most` runs of consecutive keys, one BatchGet stream each, so
        that one stream's wait for its next message overlaps the others' (a Python gRPC
        stream hands over one message at a time). Small reads stay one stream, which stops
        at the first miss of a single prompt."""
        k = min(most, len(which) * self.ns.block_bytes // min_bytes)
        if k <= 1:
            return [(which, None)]
        step = -(-len(which) // k)
        return [(which[i:i + step], False) for i in range(0, len(which), step)]

    def on_frame(self, which, f, staging):
        """Consumes one BatchGet answer frame for the request of keys which. A block comes as
        a first frame (offset 0: found, key, payload length, checksum) and, when its payload
        spans several messages, continuation frames carrying only index, offset and data."""
        if f.offset == 0:
            if not f.found:
                return
            j = which[f.index]
            if f.payload_len != self.ns.block_bytes or f.key != self.keys[j]:
                raise KVMeshError(f"node sent block {f.index} of {f.payload_len} bytes under another key or layout")
            if f.last:
                if len(f.data) == f.payload_len and self._checksum_ok(f.data, f.payload_checksum):
                    self.land(j, f.data)
                return
            staging[f.index] = (bytearray(f.payload_len), f.payload_checksum)
        st = staging.get(f.index)
        if st is None:
            raise KVMeshError(f"node sent a continuation of block {f.index}, which it did not start")
        buf, csum = st
        if f.offset + len(f.data) > len(buf):
            raise KVMeshError(f"block {f.index}: data past its {len(buf)}-byte payload")
        buf[f.offset:f.offset + len(f.data)] = f.data
        if f.last:
            del staging[f.index]
            if self._checksum_ok(buf, csum):
                self.land(which[f.index], buf)

    @staticmethod
    def _checksum_ok(buf, csum):
        # A damaged block is a miss, as the node treats one.
        return not (_xxhash.available and csum) or _xxhash.xxh64(buf) == csum

    def results(self):
        out = []
        B = self.ns.block_tokens
        for p, d in enumerate(self.dests):
            n = 0
            while n < self.nblocks[p] and n in self.found[p]:
                n += 1
            kv = d.finish(n * B)
            if not self.given[p] and n < self.nblocks[p]:
                kv = kv[:, :n * B] if self.ns.kv_layout == "latent" else kv[:, :, :n * B]
                kv = kv.contiguous() if _tensors.is_torch(kv) else np.ascontiguousarray(kv)
            if d.scales is not None:
                out.append((n * B, kv, d.scales[:n].reshape((n,) + self.sl.scales_shape)))
            else:
                out.append((n * B, kv))
        return out


def _token_bytes(tokens):
    from ._namespace import token_bytes
    if isinstance(tokens, (bytes, bytearray, str)):
        raise ValueError("tokens: want a sequence of int token ids (not bytes or str)")
    return token_bytes(tokens)


def lookup_request(ns, tokens, meta, extra_keys=None):
    check_ns(ns)
    tb = _token_bytes(tokens)
    ks = key_bytes(ns.salted(meta.salt), tb, meta.key_version, extra_keys=extra_keys)
    return cache_pb2.LookupRequest(namespace=ns.to_proto(), chain=b"".join(ks), prompt_tokens=len(tb) // 4)


def lookup_result(resp):
    from ._namespace import GROUP_KINDS
    return LookupResult(cached_tokens=resp.cached_tokens, cached_blocks=resp.cached_blocks,
                        prompt_tokens=resp.prompt_tokens,
                        blocks=[CachedBlock(key=b.key.hex(), node=b.node_id, tier=b.tier) for b in resp.blocks],
                        groups=[GroupLookup(GROUP_KINDS[g.kind], g.blocks) for g in resp.groups])


def bad(msg):
    return InvalidArgument(msg)
