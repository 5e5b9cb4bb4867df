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


@pytest.mark.parametrize("transport", ["auto", "tcp", "grpc"])
def test_deferred_copies(node, transport):
    """Copies queued while reading (as kvmesh.mooncake's batch_get_into does) land whole through
    every path: one piece and several, before the memory they come from is released."""
    from kvmesh import _objects
    rng = np.random.default_rng(7)
    vals = [rng.integers(0, 255, n, dtype=np.uint8) for n in (1 << 20, 3 << 20, 10 << 20, 100)]
    names = [f"deferred-{transport}-{i}" for i in range(len(vals))]
    with kvmesh.Client(node.addr, transport=transport) as c:
        assert all(e is None for e in c.put_objects(NS, list(zip(names, (v.tobytes() for v in vals)))))
        outs = [np.zeros(v.size, np.uint8) for v in vals]

        def sink(i, _h, spans):
            _objects.scatter(spans, [(outs[i].ctypes.data, outs[i].size)])
        with _objects.deferred_copies():
            assert c._objects.read(NS, names, sink) == []
        for o, v in zip(outs, vals):
            assert np.array_equal(o, v)
