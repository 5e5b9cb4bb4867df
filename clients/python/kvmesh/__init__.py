"""kvmesh: the Python client of a kvmesh node, for inference workers.

    import kvmesh
    ns = kvmesh.Namespace("meta-llama/Llama-3.1-8B", "bfloat16", 16, layers=32, kv_heads=8, head_dim=128)
    with kvmesh.Client("127.0.0.1:7600") as c:
        c.put(ns, tokens, kv)            # kv: [layers, 2, len(tokens), kv_heads, head_dim]
        n, kv = c.get(ns, tokens)        # the longest cached prefix: n tokens
        # a tensor-parallel rank: its heads only, kv [32, 2, n, 8 // 4, 128]
        n, kv = c.get(ns, tokens, tp_rank=1, tp_size=4)

A hybrid model's cache (sliding-window, recurrent-state, indexer layers beside full
attention) is a Namespace with groups: put takes one group's tensor (group=), get returns
what resuming needs, lookup says what each group allows (see kvmesh/_groups.py).

Keys (kvmesh.keys) are computed here, bit-identical to the node's; on the node's
host, blocks move through its shared memory. See clients/python/README.md.
"""
from ._namespace import DTYPES, KEY_VERSION, Group, Namespace, group_key, keys
from ._groups import GroupKV
from ._core import CachedBlock, GroupLookup, LookupResult
from .client import Client
from .block import Part, rank_part
from .errors import (BadPart, BlockCorrupt, BlockTooLarge, Busy, CacheFull, DeadlineExceeded, InvalidArgument,
                     InvalidPageToken, KVMeshError, NamespaceForbidden, NotFound, PartConflict, PermissionDenied, QuotaExceeded,
                     ResourceExhausted, ScopeMissing, TooManyBlocks, Unauthenticated, Unavailable)
from . import aio, paged  # noqa: E402

__all__ = ["Namespace", "Group", "GroupKV", "GroupLookup", "group_key", "keys", "Client", "aio", "paged", "LookupResult", "CachedBlock", "KVMeshError", "NotFound",
           "Unavailable", "InvalidArgument", "PermissionDenied", "ResourceExhausted", "DeadlineExceeded",
           "TooManyBlocks", "BlockTooLarge", "BlockCorrupt", "InvalidPageToken", "Unauthenticated", "ScopeMissing",
           "NamespaceForbidden", "QuotaExceeded", "CacheFull", "Busy", "BadPart", "PartConflict", "Part", "rank_part",
           "KEY_VERSION", "DTYPES"]
__version__ = "0.1.0"
