"""Namespaces with groups (hybrid models): planning a group's put, reading what resuming
needs. No I/O here; client.py does it.

A group's records are put from one tensor per call, from block `start` on:
  full, sliding, indexer (split): [layers, 2, n_tokens, kv_heads, head_dim]
  latent groups:                  [layers, n_tokens, latent_dim]
  state:                          [n_blocks, layers, kv_heads, state_bytes / dtype size]: one state
                                  per block boundary (the state after each block's last token)
where layers are the group's (its count, in its order) and n_tokens = n_blocks x block_tokens
covers the blocks from start. A get returns exactly what resuming at the longest usable
prefix P needs: every full and indexer group's blocks [0,P), each sliding group's window
before P, each state group's state at P (GroupKV).
"""
from dataclasses import dataclass

import numpy as np

from . import _tensors, _xxhash, block
from ._core import CHUNK_BYTES, _token_bytes, chunk_keys
from ._namespace import DTYPE_SIZES, group_key, key_links
from .v1 import cache_pb2


@dataclass
class GroupKV:
    """One group's part of a get: its records from block `start` on, as a tensor shaped as put
    takes them (for a state group: the one state at the prefix, [layers, kv_heads, elements],
    None when the prefix is empty)."""
    kind: str
    start: int
    kv: object


def state_shape(ns, g):
    gr = ns.groups[g]
    return (len(gr.layers), gr.kv_heads, gr.state_bytes // DTYPE_SIZES[gr.dtype])


def _check_group(ns, group):
    if group is None:
        raise ValueError(f"group: namespace {ns.model!r} has groups: name the group (0..{len(ns.groups) - 1}) "
                         "whose tensor this is")
    if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < len(ns.groups):
        raise ValueError(f"group: {group!r} is not a group of the namespace (0..{len(ns.groups) - 1})")


def _state_u8(ns, g, kv, n_blocks):
    """A uint8 numpy array [n_blocks, record bytes] of a state tensor (torch or numpy)."""
    gr = ns.groups[g]
    want = (n_blocks,) + state_shape(ns, g)
    view = _StateDtype(gr.dtype)
    if _tensors.is_torch(kv):
        if tuple(kv.shape) != want or not _tensors._torch_ok(view, kv.dtype):
            raise ValueError(f"groups[{g}].state_bytes: a state tensor {list(kv.shape)} {kv.dtype}, want "
                             f"{list(want)} of {gr.dtype} (one state per block boundary)")
        a = kv.detach().cpu().contiguous()
        a = a.view(_tensors._torch().uint8).numpy()
    else:
        a = np.ascontiguousarray(kv)
        if tuple(a.shape) != want or a.dtype.name not in _tensors._NP[gr.dtype]:
            raise ValueError(f"groups[{g}].state_bytes: a state array {list(a.shape)} {a.dtype}, want "
                             f"{list(want)} of {gr.dtype} (one state per block boundary)")
        a = a.view(np.uint8)
    return a.reshape(n_blocks, -1)


class _StateDtype:
    """What the tensor helpers read of a namespace to type-check a state: its dtype."""

    def __init__(self, dtype):
        self.dtype = dtype


class GroupPutPlan:
    """Group `group`'s records of the blocks of tokens from block `start` on, from one tensor:
    keys, chunk keys, encoded headers and payloads, as PutPlan has them for client.py."""

    def __init__(self, ns, tokens, kv, group, start, meta, extra_keys=None):
        _check_group(ns, group)
        self.ns, self.meta, self.group = ns, meta, group
        self.kns = ns.salted(meta.salt)
        B = ns.block_tokens
        tb = _token_bytes(tokens)
        nb = len(tb) // 4 // B
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= nb:
            raise ValueError(f"start: {start!r} is not a block of the prompt's {nb} full blocks")
        extra = list(extra_keys or ())
        links = key_links(self.kns, tb, extra, meta.key_version)
        chain = [link[:16] for link in links]
        cks = chunk_keys(chain, ns, meta.chunk_tokens)
        gr = ns.groups[group]
        n = nb - start
        if gr.kv_layout == "state":
            u8 = _state_u8(ns, group, kv, n)
            runs = lambda i: [u8[i - start]]  # noqa: E731
        else:
            sl = _tensors.whole(gr.view(B, ns.model))
            _tensors.check_kv(sl, kv, n_tokens=n * B, name=f"kv of groups[{group}]")
            hu8, staged = _tensors.host_u8(kv, sl)
            self._keep = (hu8, staged)
            runs = lambda i: _tensors.put_runs(sl, hu8, i - start)  # noqa: E731
        self.blocks = []  # (index, token bytes, parent link, record key, chunk key, payload runs, extra keys)
        parent = self.kns.root_link(meta.key_version) if start == 0 else links[start - 1]
        for i in range(start, nb):
            e = extra[i] if i < len(extra) and extra[i] else []
            self.blocks.append((i, tb[4 * i * B:4 * (i + 1) * B], parent, group_key(chain[i], group), cks[i], runs(i), e))
            parent = links[i]
        self.stored, self.rest = [], list(range(len(self.blocks)))

    @staticmethod
    def checksum(runs):
        if not _xxhash.available:
            return 0
        return _xxhash.xxh64_parts([(r.__array_interface__["data"][0], r.nbytes) for r in runs])

    def shm_items(self, which):
        keys, chunks, heads, payloads = [], [], [], []
        for j in which:
            (_i, tb, parent, k, ck, runs, extra) = self.blocks[j]
            h, _link = block.encode_header(self.kns, parent, tb, self.checksum(runs), self.meta.tag,
                                           self.meta.key_version, extra, None, self.group)
            keys.append(k)
            chunks.append(ck)
            heads.append(h)
            payloads.append(runs)
        return keys, chunks, heads, payloads

    def requests(self, which):
        """The BatchPut stream of blocks[which]: each record names its group, parent and chunk key."""
        first = True
        nsp = self.ns.to_proto()
        for j in which:
            (_i, tb, parent, _k, ck, runs, extra) = self.blocks[j]
            data = memoryview(np.concatenate(runs)) if len(runs) > 1 else memoryview(runs[0])
            hdr = cache_pb2.BlockHeader(parent=parent[:16], tokens=np.frombuffer(tb, "<u4").tolist(),
                                        payload_len=data.nbytes, payload_checksum=self.checksum(runs), chunk_key=ck,
                                        extra_keys=[bytes(x) for x in extra], group=self.group + 1,
                                        parent_link=parent if self.ns.key_scheme == "vllm" else b"")
            for off in range(0, max(1, data.nbytes), CHUNK_BYTES):
                req = cache_pb2.BatchPutRequest(data=bytes(data[off:off + CHUNK_BYTES]))
                if first:
                    req.namespace.CopyFrom(nsp)
                    first = False
                if off == 0:
                    req.block.CopyFrom(hdr)
                yield req

    def on_put(self, keys, st):
        from . import _shm
        ok = [keys[j] for j in range(len(keys)) if st[j] == _shm.STATUS_OK]
        self.stored += ok
        self.rest = [self.rest[j] for j in range(len(keys)) if st[j] != _shm.STATUS_OK]
        return len(ok)

    def on_grpc(self, keys):
        self.stored += list(keys)
        self.rest = []
        return len(keys)

    def count(self):
        got = set(self.stored)
        return sum(1 for b in self.blocks if b[3] in got)


def record_keys(ns, meta, tokens, extra_keys=None):
    """Per group, the record keys of every full block of tokens; and the chunk keys."""
    kns = ns.salted(meta.salt)
    chain = [link[:16] for link in key_links(kns, _token_bytes(tokens), list(extra_keys or ()), meta.key_version)]
    return [[group_key(k, g) for k in chain] for g in range(len(ns.groups))], chunk_keys(chain, ns, meta.chunk_tokens)


def _extra_proto(extra_keys):
    from .v1 import types_pb2
    return [types_pb2.BlockExtraKeys(block=i, keys=[bytes(k) for k in e]) for i, e in enumerate(extra_keys or ()) if e]


def resume_request(ns, tokens, extra_keys=None):
    return cache_pb2.BatchGetRequest(namespace=ns.to_proto(), tokens=np.frombuffer(_token_bytes(tokens), "<u4").tolist(),
                                     resume=True, extra_keys=_extra_proto(extra_keys))


class ResumeRead:
    """Assembles a resume read's frames (BatchGet with resume) into GroupKVs."""

    def __init__(self, ns, array=None):
        self.ns, self.array = ns, array
        self.records = {}  # (block, group) -> bytearray
        self.expect = {}   # (block, group) -> (payload length, checksum)
        self.cur = None

    def on_frame(self, f):
        if f.key:
            self.cur = None
            if not f.found:
                return
            if f.group < 1 or f.group > len(self.ns.groups):
                raise ValueError(f"a frame of group {f.group - 1}: not the namespace's")
            self.cur = (f.index, f.group - 1)
            self.records[self.cur] = bytearray()
            self.expect[self.cur] = (f.payload_len, f.payload_checksum)
        if self.cur is not None:
            self.records[self.cur] += f.data

    def results(self):
        """(cached_tokens, [GroupKV per group]): the longest prefix the records read make
        resumable (the node's answer, shorter if records vanished meanwhile)."""
        ns, B = self.ns, self.ns.block_tokens
        for k, (n, csum) in self.expect.items():
            buf = self.records[k]
            if len(buf) != n or (_xxhash.available and csum and _xxhash.xxh64(bytes(buf)) != csum):
                del self.records[k]  # torn or corrupt: a miss
        n = 1 + max((i for (i, _g) in self.records), default=-1)
        p, _per = _resume_of(ns, n, lambda g, i: (i, g) in self.records)
        out = []
        for g, gr in enumerate(ns.groups):
            if gr.kind == "state":
                kv = None
                if p > 0:
                    a = np.frombuffer(bytes(self.records[(p - 1, g)]), np.uint8)
                    kv = _state_tensor(ns, g, a, self.array)
                out.append(GroupKV(gr.kind, p, kv))
                continue
            start = 0 if gr.every_block else max(0, p - gr.window_blocks(B))
            sl = _tensors.whole(gr.view(B, ns.model))
            dst = _tensors.Dest(sl, _tensors.alloc(sl, (p - start) * B, self.array))
            for i in range(start, p):
                dst.put_whole(i - start, np.frombuffer(bytes(self.records[(i, g)]), np.uint8))
            out.append(GroupKV(gr.kind, start, dst.finish((p - start) * B)))
        return p * B, out


def _resume_of(ns, n, held):
    from ._namespace import resume
    return resume(ns.groups, ns.block_tokens, n, held)


def _state_tensor(ns, g, u8, array):
    shape = state_shape(ns, g)
    view = _StateDtype(ns.groups[g].dtype)
    if array == "numpy":
        return u8.view(_tensors.numpy_dtype(view)).reshape(shape).copy()
    torch = _tensors._torch()
    t = torch.frombuffer(bytearray(u8.tobytes()), dtype=torch.uint8)
    return t.view(_tensors.torch_dtype(view)).reshape(shape)
