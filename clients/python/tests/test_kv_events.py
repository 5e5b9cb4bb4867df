"""KV events of `kvmesh serve --kv-events-addr`, read as vLLM's subscribers read an engine's.

The decoder here is written from vLLM's published schema (vllm/distributed/kv_events.py:
KVEventBatch and the BlockStored / BlockRemoved / AllBlocksCleared tagged union, msgspec
array_like with omit_defaults; ZMQ PUB [topic, 8-byte big-endian seq, payload]; the replay
ROUTER answering [b"", start seq] with (seq, payload) pairs and a -1 end marker), with
Debian's python3-zmq (libzmq) and python3-msgpack: no kvmesh code decodes. vLLM's block
hash (sha256 of canonical CBOR of (parent, tokens, extra keys), NONE_HASH from the seed) is
computed here too, independently of kvmesh's prefixhash."""
import hashlib
import time

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

import kvmesh  # noqa: E402
from kvmesh.v1 import admin_pb2  # noqa: E402

# vLLM's event classes: their fields in order after the tag (msgspec array_like).
FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"],
    "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    "AllBlocksCleared": [],
}


def decode_batch(payload):
    """KVEventBatch: [ts, events(, data_parallel_rank)], each event [tag, fields...]; trailing
    fields at their defaults (None) left out."""
    arr = msgpack.unpackb(payload, raw=False)
    assert isinstance(arr, list) and 2 <= len(arr) <= 3, arr
    ts, events = arr[0], arr[1]
    assert isinstance(ts, float)
    out = []
    for ev in events:
        tag, vals = ev[0], ev[1:]
        names = FIELDS[tag]
        assert len(vals) <= len(names), ev
        d = dict.fromkeys(names)
        d.update(zip(names, vals))
        d["type"] = tag
        out.append(d)
    return ts, out


# vLLM's hash_block_tokens with sha256_cbor, from its definition: a minimal canonical CBOR.
def _head(major, v):
    if v < 24:
        return bytes([major << 5 | v])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if v < 1 << (8 * size):
            return bytes([major << 5 | info]) + v.to_bytes(size, "big")


def cbor(x):
    if x is None:
        return b"\xf6"
    if isinstance(x, int):
        return _head(0, x) if x >= 0 else _head(1, -1 - x)
    if isinstance(x, bytes):
        return _head(2, len(x)) + x
    if isinstance(x, str):
        b = x.encode()
        return _head(3, len(b)) + b
    if isinstance(x, (tuple, list)):
        return _head(4, len(x)) + b"".join(cbor(i) for i in x)
    raise TypeError(type(x))


def vllm_none_hash(seed):
    return hashlib.sha256(cbor(seed)).digest()


def vllm_block_hash(parent, tokens, extra=None):
    return hashlib.sha256(cbor((parent, tuple(tokens), tuple(extra) if extra else None))).digest()


class Sub:
    """A SUB on the node's events, keeping every message in order."""

    def __init__(self, ctx, addr):
        self.s = ctx.socket(zmq.SUB)
        self.s.setsockopt(zmq.SUBSCRIBE, b"")
        self.s.connect(addr)
        self.msgs = []  # (topic, seq, payload)

    def drain(self, timeout=0.2):
        got = 0
        while self.s.poll(int(timeout * 1000)):
            topic, seq, payload = self.s.recv_multipart()
            assert len(seq) == 8
            self.msgs.append((topic.decode(), int.from_bytes(seq, "big", signed=True), payload))
            got += 1
            timeout = 0.05
        return got

    def events(self, topic=None):
        out = []
        for t, _seq, payload in self.msgs:
            if topic is None or t == topic:
                out += decode_batch(payload)[1]
        return out

    def wait(self, what, cond, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drain()
            if cond():
                return
        raise AssertionError(f"timed out waiting for {what}: {len(self.msgs)} batches: {[(t, s) for t, s, _ in self.msgs]}")


def kv_of(ns, n_tokens, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((ns.layers, 2, n_tokens, ns.kv_heads, ns.head_dim), dtype=np.float32)


def test_kv_events_vllm_schema(start_node):
    node = start_node("--kv-events-addr", "tcp://127.0.0.1:0", "--kv-events-replay-addr", "tcp://127.0.0.1:0",
                      "--max-block-bytes", "1MiB", "--dram", "4MiB", "--nvme", "64MiB")
    addr, replay_addr = node.info["kv_events_addr"], node.info["kv_events_replay_addr"]
    assert addr.startswith("tcp://127.0.0.1:") and replay_addr.startswith("tcp://127.0.0.1:")
    ctx = zmq.Context()
    sub = Sub(ctx, addr)
    try:
        with kvmesh.Client(node.addr) as c:
            # A PUB drops what it sends before a subscription lands: put fresh probe
            # blocks until one arrives.
            probe = kvmesh.Namespace("py/probe", "float32", 16, layers=1, kv_heads=1, head_dim=8)
            for i in range(200):
                c.put(probe, list(range(i * 16, i * 16 + 16)), kv_of(probe, 16, i))
                if sub.drain(0.1):
                    break
            else:
                raise AssertionError("no KV events arrived")

            # kvmesh key scheme: the hashes are the 16-byte keys. The topic names the model
            # of a namespace a gRPC request named (here a lookup, as an engine's connector
            # looks a prompt up before it saves it): data-plane records carry only digests.
            ns = kvmesh.Namespace("py/kv", "float32", 16, layers=2, kv_heads=2, head_dim=64)
            tokens = list(range(1000, 1000 + 3 * 16 + 5))
            assert c.lookup(ns, tokens).cached_tokens == 0
            assert c.put(ns, tokens, kv_of(ns, len(tokens), 1)) == 3
            topic = f"kv@{node.node_id}@py/kv"
            sub.wait("three BlockStored", lambda: len(sub.events(topic)) >= 3)
            evs = sub.events(topic)[:3]
            keys = [bytes.fromhex(k) for k in kvmesh.keys(ns, tokens)]
            for i, e in enumerate(evs):
                assert e["type"] == "BlockStored" and e["medium"] == "CPU", e
                assert e["block_hashes"] == [keys[i]]
                assert e["parent_block_hash"] == (keys[i - 1] if i else None)
                assert e["token_ids"] == tokens[i * 16:(i + 1) * 16] and e["block_size"] == 16
                assert e["lora_name"] is None and e["extra_keys"] is None

            # vllm key scheme with a LoRA: vLLM's own 32-byte hashes, the LoRA name in
            # lora_name and in each block's extra keys, as the engine publishes them.
            vl = kvmesh.Namespace("py/vllm", "float32", 16, layers=2, kv_heads=2, head_dim=64,
                                  key_scheme="vllm", hash_seed="0", lora="adapter-1")
            vtokens = list(range(5000, 5000 + 2 * 16))
            c.lookup(vl, vtokens)
            assert c.put(vl, vtokens, kv_of(vl, len(vtokens), 2)) == 2
            vtopic = f"kv@{node.node_id}@py/vllm"
            sub.wait("two vllm-scheme BlockStored", lambda: len(sub.events(vtopic)) >= 2)
            h0 = vllm_block_hash(vllm_none_hash("0"), vtokens[:16], ["adapter-1"])
            h1 = vllm_block_hash(h0, vtokens[16:], ["adapter-1"])
            e0, e1 = sub.events(vtopic)[:2]
            assert e0["block_hashes"] == [h0] and e0["parent_block_hash"] is None
            assert e1["block_hashes"] == [h1] and e1["parent_block_hash"] == h0
            assert e0["lora_name"] == "adapter-1" and e0["extra_keys"] == [["adapter-1"]]

            # Demotion: DRAM is 4 MiB of 128 KiB blocks; more prompts push blocks to NVMe,
            # each move a BlockRemoved CPU and a BlockStored DISK of the same hash.
            fill = kvmesh.Namespace("py/fill", "float32", 16, layers=2, kv_heads=2, head_dim=64)
            ftopic = f"kv@{node.node_id}@py/fill"
            c.lookup(fill, list(range(16)))
            for p in range(8):
                ft = list(range(100000 * (p + 1), 100000 * (p + 1) + 8 * 16))
                c.put(fill, ft, kv_of(fill, len(ft), 10 + p))

            def moved():
                evs = sub.events()
                removed = {e["block_hashes"][0] for e in evs if e["type"] == "BlockRemoved" and e["medium"] == "CPU"}
                disk = {e["block_hashes"][0] for e in evs if e["type"] == "BlockStored" and e["medium"] == "DISK"}
                return removed & disk
            sub.wait("a block demoted to DISK", moved)
            assert len(sub.events(ftopic)) > 0

            # Dropping a namespace publishes one AllBlocksCleared on its topic.
            c._admin.DropNamespace(admin_pb2.DropNamespaceRequest(namespace=fill.to_proto()))
            sub.wait("AllBlocksCleared", lambda: any(e["type"] == "AllBlocksCleared" for e in sub.events(ftopic)))

        # One sequence number per batch, counting up by one with no gap (the subscriber kept up).
        seqs = [s for _t, s, _p in sub.msgs]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs[:20]

        # Replay: the ROUTER answers every batch it holds from a sequence number on,
        # byte for byte as published, then -1 and an empty frame.
        d = ctx.socket(zmq.DEALER)
        d.connect(replay_addr)
        start = seqs[len(seqs) // 2]
        d.send_multipart([b"", start.to_bytes(8, "big")])
        replayed = []
        while True:
            assert d.poll(10000), "replay did not answer"
            frames = d.recv_multipart()
            assert frames[0] == b"" and len(frames) == 3, frames[:2]
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                assert frames[2] == b""
                break
            replayed.append((seq, frames[2]))
        live = {s: p for _t, s, p in sub.msgs}
        assert [s for s, _ in replayed][:len(seqs) - len(seqs) // 2] == seqs[len(seqs) // 2:]
        for s, p in replayed:
            if s in live:
                assert p == live[s], s
        d.close(0)
    finally:
        sub.s.close(0)
        ctx.term()

