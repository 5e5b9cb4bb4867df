#!/usr/bin/env python3
"""Writes objects.json: the keys of objects and of their pieces.

    /usr/bin/python3 prefixhash/testdata/objects_vectors.py > prefixhash/testdata/objects.json

Independent of kvmesh's code: it restates the definition with hashlib, over
the namespace roots that golden.json pins (the first vectors' roots):

    object key  o   = sha256(root || b"object" || name.encode("utf-8"))[:16]
    piece j >= 1    = sha256(o || b"piece" || j.to_bytes(4, "little"))[:16]
    piece 0         = o
"""
import hashlib
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "golden.json")) as f:
    golden = json.load(f)

names = ["a", "hello_key", "Qwen2.5-7B@tp_rank:0@pcp0@dcp0@pp_rank:0@4f3a9c", "ключ/κλειδί/鍵", "x" * 1024]
vectors = []
for v in golden["vectors"][:3]:
    root = bytes.fromhex(v["root"])
    for name in names:
        o = hashlib.sha256(root + b"object" + name.encode("utf-8")).digest()[:16]
        pieces = [o.hex()] + [
            hashlib.sha256(o + b"piece" + j.to_bytes(4, "little")).digest()[:16].hex() for j in range(1, 4)
        ]
        vectors.append({"namespace": v["name"], "root": v["root"], "name": name, "object_key": o.hex(), "piece_keys": pieces})

json.dump({"comment": __doc__.strip().splitlines()[0], "vectors": vectors}, __import__("sys").stdout, indent=1, ensure_ascii=False)
print()
