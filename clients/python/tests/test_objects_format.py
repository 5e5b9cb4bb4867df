"""Object keys and records in Python match Go's (prefixhash/testdata/objects.json, block/object.go)."""
import json
import pathlib
import struct

import pytest

from kvmesh import Namespace, block

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_object_keys_match_vectors():
    vectors = json.loads((REPO / "prefixhash" / "testdata" / "objects.json").read_text())["vectors"]
    assert len(vectors) >= 10
    for v in vectors:
        root = bytes.fromhex(v["root"])
        o = block.object_key(root, v["name"])
        assert o.hex() == v["object_key"]
        assert [block.piece_key(o, j).hex() for j in range(len(v["piece_keys"]))] == v["piece_keys"]


def test_object_record_round_trip_and_refusals():
    ns = Namespace("mooncake", "int8", 1, layers=1, kv_heads=1, head_dim=1)
    name = block.check_object_name("vllm@tp0@ab")
    h, key = block.encode_object_header(ns, name, 1, 3, 5000, 77, 1000, 123, tenant_tag=9, pin=2, ttl_ms=60000)
    assert len(h) == 192 and key == block.piece_key(block.object_key(ns.root(), name), 1)
    d = block.decode_object_header(h)
    assert (d.name, d.piece, d.pieces, d.size, d.generation, d.pin, d.ttl_ms, d.payload_len, d.tenant, d.digest) == \
        (name, 1, 3, 5000, 77, 2, 60000, 1000, 9, ns.digest())
    for i in range(len(h)):
        bad = bytearray(h)
        bad[i] ^= 0x10
        with pytest.raises(block.CorruptBlock):
            block.decode_object_header(bytes(bad))
    for bad_name in ["", "x" * 1025, b"\xff\xfe", "\ud800"]:
        with pytest.raises(ValueError):
            block.check_object_name(bad_name)


def test_golden_object_records():
    """block/testdata/golden_objects.json, written by the Go tests: Python encodes the same bytes."""
    g = json.loads((REPO / "block" / "testdata" / "golden_objects.json").read_text())
    n = g["namespace"]
    ns = Namespace(n["model"], n["dtype"], n["block_tokens"], layers=n["layers"], kv_heads=n["kv_heads"],
                   head_dim=n["head_dim"])
    from kvmesh import _xxhash
    assert len(g["records"]) >= 2
    for r in g["records"]:
        payload = bytes.fromhex(r["payload"])
        h, key = block.encode_object_header(ns, r["name"].encode(), r["piece"], r["pieces"], r["size"], r["generation"],
                                            len(payload), _xxhash.xxh64(payload), r["tenant"], r["pin"], r["ttl_ms"])
        assert (h + payload).hex() == r["record"]
        d = block.decode_object_header(bytes.fromhex(r["record"]))
        assert d.key == key and d.name.decode() == r["name"]
