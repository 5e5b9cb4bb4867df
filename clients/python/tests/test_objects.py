"""kvmesh.Client's objects against real `kvmesh serve` processes."""
import numpy as np
import pytest

import kvmesh

NS = kvmesh.Namespace("mooncake", "int8", 1, layers=1, kv_heads=1, head_dim=1)


@pytest.mark.parametrize("transport", ["auto", "tcp", "grpc"])
def test_put_get_remove(node, transport):
    rng = np.random.default_rng(7)
    vals = {f"{transport}-obj-{i}": rng.integers(0, 256, int(n), dtype=np.uint8).tobytes()
            for i, n in enumerate([1, 100, 4096, 300 << 10, 1 << 20])}
    with kvmesh.Client(node.addr, transport=transport) as c:
        assert c.put_objects(NS, vals, piece_bytes=128 << 10) == [None] * len(vals)
        names = list(vals) + [f"{transport}-absent"]
        got = c.get_objects(NS, names)
        assert got[:-1] == list(vals.values()) and got[-1] is None
        # A second put keeps the first value; upsert replaces it.
        first = names[0]
        assert c.put_objects(NS, {first: b"other"}) == [None]
        assert c.get_objects(NS, [first]) == [vals[first]]
        assert c.put_objects(NS, {first: b"other"}, upsert=True) == [None]
        assert c.get_objects(NS, [first]) == [b"other"]
        assert c.remove_objects(NS, names[:2] + [f"{transport}-absent"]) == [True, True, False]
        assert c.get_objects(NS, names[:2]) == [None, None]
        if transport == "auto":
            assert c.counters["shm_get"] > 0 and c.counters["shm_put"] > 0
        errs = c.put_objects(NS, [("", b"x"), ("x" * 1025, b"x"), ("ok-" + transport, b"y")])
        assert isinstance(errs[0], ValueError) and isinstance(errs[1], ValueError) and errs[2] is None
