"""kvmesh.mooncake.MooncakeDistributedStore against real `kvmesh serve` processes, called as
Mooncake's own tests and the three engines' Mooncake backends call it (vLLM's
MooncakeStoreConnector, SGLang's HiCache mooncake_store.py, LMCache's mooncakestore_connector)."""
import ctypes
import time
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvmesh import mooncake  # noqa: E402
from kvmesh.mooncake import MooncakeDistributedStore, ReplicateConfig, SoftPinAction  # noqa: E402


def uniq(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def mc_node(start_node):
    return start_node("--max-pinned", "0.05", "--max-retention-ttl", "1h", "--max-block-bytes", "8MiB")


@pytest.fixture
def store(mc_node):
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "", mc_node.addr) == 0
    yield s
    s.close()


def test_basic_put_get_exist(store):
    """Mooncake's test_basic_put_get_exist_operations and test_batch_is_exist_operations."""
    key, data = uniq("basic"), b"Hello, World!"
    assert store.put(key, data) == 0
    assert store.get_size(key) == len(data)
    assert store.get(key) == data
    assert store.put(key, b"another value") == 0      # a second put succeeds and keeps the first
    assert store.get(key) == data
    assert store.is_exist(key) == 1
    assert store.remove(key) == 0
    assert store.is_exist(key) == 0 and store.get(key) == b"" and store.get_size(key) == mooncake.OBJECT_NOT_FOUND
    assert store.remove(key) == mooncake.OBJECT_NOT_FOUND
    keys = [uniq("exist") for _ in range(20)]
    for k in keys[:10]:
        assert store.put(k, b"Hello, Batch World!") == 0
    assert store.batch_is_exist(keys) == [1] * 10 + [0] * 10
    assert store.batch_is_exist([]) == []
    assert store.batch_remove(keys[:10] + ["gone-" + keys[0]]) == [0] * 10 + [mooncake.OBJECT_NOT_FOUND]


def test_zero_copy(store):
    """Mooncake's test_zero_copy_operations, test_batch_put_from_operations, test_batch_get_into_operations."""
    key, data = uniq("zc"), (b"Zero copy test data " * 1000)
    src = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    ptr = ctypes.addressof(src)
    assert store.register_buffer(ptr, len(data)) == 0
    assert store.put_from(key, ptr, len(data)) == 0
    assert store.get(key) == data
    dst = (ctypes.c_ubyte * (len(data) + 100))()
    dptr = ctypes.addressof(dst)
    assert store.register_buffer(dptr, len(dst)) == 0
    assert store.get_into(key, dptr, len(dst)) == len(data)
    assert bytes(dst[:len(data)]) == data
    small = (ctypes.c_ubyte * 10)()
    assert store.register_buffer(ctypes.addressof(small), 10) == 0
    assert store.get_into(key, ctypes.addressof(small), 10) < 0
    # Batches: one large registered buffer, values 1 MiB apart.
    vals = [b"Batch Put Data 1! " * 100, b"Batch Put Data 2! " * 200, b"Batch Put Data 3! " * 150]
    keys = [uniq("bpf") for _ in vals]
    big = (ctypes.c_ubyte * (3 << 20))()
    base = ctypes.addressof(big)
    assert store.register_buffer(base, 3 << 20) == 0
    ptrs = [base + (i << 20) for i in range(3)]
    for p, v in zip(ptrs, vals):
        ctypes.memmove(p, v, len(v))
    assert store.batch_put_from(keys, ptrs, [len(v) for v in vals]) == [0, 0, 0]
    assert [store.get(k) for k in keys] == vals
    assert store.batch_put_from(keys[:2], ptrs[:3], [1, 2, 3]) == [mooncake.INVALID_PARAMS] * 2
    assert store.batch_put_from([], [], []) == []
    out = (ctypes.c_ubyte * (3 << 20))()
    obase = ctypes.addressof(out)
    assert store.register_buffer(obase, 3 << 20) == 0
    optrs = [obase + (i << 20) for i in range(3)]
    assert store.batch_get_into(keys, optrs, [1 << 20] * 3) == [len(v) for v in vals]
    for p, v in zip(optrs, vals):
        assert ctypes.string_at(p, len(v)) == v
    assert store.batch_get_into(keys[:2], optrs[:3], [1, 2, 3]) == [mooncake.INVALID_PARAMS] * 2
    assert store.batch_get_into([], [], []) == []
    assert store.batch_get_into([uniq("absent")], optrs[:1], [1 << 20]) == [mooncake.OBJECT_NOT_FOUND]
    # batch_get_buffer: buffers with .size() and the buffer protocol; None for a miss.
    bufs = store.batch_get_buffer([keys[0], uniq("absent")])
    assert bufs[0].size() == len(vals[0]) and bytes(memoryview(bufs[0])) == vals[0] and bufs[1] is None
    for p in (ptr, dptr, ctypes.addressof(small), base, obase):
        assert store.unregister_buffer(p) == 0
    assert store.unregister_buffer(ptr) == mooncake.INVALID_PARAMS


def test_vllm_connector(store):
    """As vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py: register the KV
    cache's storage, batch_is_exist, then batch_put_from_multi_buffers of the missing keys (K and V
    segments of each block) and batch_get_into_multi_buffers into another cache."""
    layers, blocks, page = 2, 8, 16 * 8 * 64 * 2  # bytes of one block of one layer's K (or V)
    kv = torch.randint(0, 255, (2, blocks, page), dtype=torch.uint8)  # K/V-first: [2, num_blocks, page]
    back = torch.zeros_like(kv)
    for t in (kv, back):
        # vLLM registers cache.untyped_storage()'s data_ptr() and nbytes() (older torch: storage()).
        st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        nbytes = st.nbytes() if hasattr(st, "nbytes") else st.size() * t.element_size()
        assert store.register_buffer(st.data_ptr(), nbytes) == 0
    seg = kv.stride(0) * kv.element_size()
    keys = [f"Qwen2.5-7B@tp_rank:0@pcp0@dcp0@pp_rank:0@{i:032x}" for i in range(blocks)]
    addrs = [[kv.data_ptr() + i * page, kv.data_ptr() + seg + i * page] for i in range(blocks)]
    sizes = [[page, page] for _ in range(blocks)]
    cfg = ReplicateConfig()
    cfg.preferred_segment = "localhost:12345"
    exists = store.batch_is_exist(keys)
    missing = [i for i, e in enumerate(exists) if e != 1]
    assert missing == list(range(blocks))
    res = store.batch_put_from_multi_buffers([keys[i] for i in missing], [addrs[i] for i in missing],
                                             [sizes[i] for i in missing], cfg)
    assert res == [0] * blocks
    assert store.batch_is_exist(keys) == [1] * blocks
    baddrs = [[back.data_ptr() + i * page, back.data_ptr() + seg + i * page] for i in range(blocks)]
    assert store.batch_get_into_multi_buffers(keys, baddrs, sizes) == [2 * page] * blocks
    assert torch.equal(kv, back)
    assert store.remove_all(force=True) >= blocks
    assert store.batch_is_exist(keys) == [0] * blocks
    _ = layers


def test_sglang_hicache(mc_node):
    """As sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py: setup with the transfer
    engine argument and keywords, the warmup, the host pool registered once, batch_put_from of the
    keys batch_is_exist says are missing, batch_get_into, clear() = remove_all()."""
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 4 << 30, 16 << 20, "rdma", "", mc_node.addr, None,
                       tenant_id="sglang-tenant") == 0
    warm = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex
    assert store.put(warm, bytes(4096)) == 0
    assert store.is_exist(warm) == 1 and store.get(warm) == bytes(4096)
    page, pages = 64 << 10, 16
    pool = torch.randint(0, 255, (pages * page,), dtype=torch.uint8)
    assert store.register_buffer(pool.data_ptr(), pool.numel() * pool.element_size()) == 0
    keys = [f"{uuid.uuid4().hex}_0_k" for _ in range(pages)]
    ptrs = [pool.data_ptr() + i * page for i in range(pages)]
    exist = store.batch_is_exist(keys)
    todo = [i for i, e in enumerate(exist) if e != 1]
    assert store.batch_put_from([keys[i] for i in todo], [ptrs[i] for i in todo], [page] * len(todo)) == [0] * pages
    out = torch.zeros_like(pool)
    assert store.register_buffer(out.data_ptr(), out.numel()) == 0
    got = store.batch_get_into(keys, [out.data_ptr() + i * page for i in range(pages)], [page] * pages)
    assert all(r > 0 for r in got) and torch.equal(pool, out)
    # Another tenant id is another namespace: the objects are not its.
    other = MooncakeDistributedStore()
    assert other.setup({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                        "master_server_addr": mc_node.addr}) == 0
    assert other.batch_is_exist(keys[:2]) == [0, 0]
    assert store.remove_all() >= pages
    store.close()
    other.close()


def test_lmcache_backend(store):
    """As lmcache/v1/storage_backend/connector/mooncakestore_connector.py: ReplicateConfig with
    replica_num 1 and preferred_segment = get_hostname(), the CPU pool registered, put_from of a
    chunk, batch_get_into into pool allocations, put_parts with metadata, batch_get_buffer."""
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.preferred_segment = store.get_hostname()
    assert cfg.preferred_segment == "localhost"
    pool = torch.zeros(8 << 20, dtype=torch.uint8)
    assert store.register_buffer(pool.data_ptr(), pool.numel()) == 0
    chunk = torch.randint(0, 255, (3 << 20,), dtype=torch.uint8)  # more than one piece is fine
    pool[:chunk.numel()] = chunk
    key = "vllm@Qwen@1@0@" + uuid.uuid4().hex
    assert store.put_from(key, pool.data_ptr(), chunk.numel(), cfg) == 0
    assert store.is_exist(key)
    got = store.batch_get_into([key], [pool.data_ptr() + (4 << 20)], [4 << 20])
    assert got == [chunk.numel()] and torch.equal(pool[4 << 20:(4 << 20) + chunk.numel()], chunk)
    meta, data = bytes(range(28)), bytes(1000)
    k2 = key + "-meta"
    assert store.put_parts(k2, meta, data) == 0
    [buf] = store.batch_get_buffer([k2])
    assert buf.size() == 1028 and bytes(memoryview(buf)[:28]) == meta
    assert store.unregister_buffer(pool.data_ptr()) == 0


def test_retention(store):
    """ReplicateConfig's pins: hard pins stop at the node's share (NO_AVAILABLE_HANDLE, as the
    engines expect under pressure); a soft-pin TTL only with ENABLE, as Mooncake's own test."""
    key = uniq("pin")
    hard = ReplicateConfig()
    hard.with_hard_pin = True
    assert store.put(key, b"pinned", hard) == 0
    enable = ReplicateConfig()
    enable.soft_pin_action = SoftPinAction.ENABLE
    enable.soft_pin_ttl_ms = 1000
    assert store.put(uniq("soft"), b"soft", enable) == 0
    preserve_ttl = ReplicateConfig()
    preserve_ttl.soft_pin_ttl_ms = 1000
    assert store.upsert(key, b"x", preserve_ttl) == mooncake.INVALID_PARAMS
    disable_ttl = ReplicateConfig()
    disable_ttl.soft_pin_action = SoftPinAction.DISABLE
    disable_ttl.soft_pin_ttl_ms = 1000
    assert store.upsert(key, b"x", disable_ttl) == mooncake.INVALID_PARAMS
    assert store.upsert(key, b"new") == 0 and store.get(key) == b"new"
    too_long = ReplicateConfig()
    too_long.soft_pin_action = SoftPinAction.ENABLE
    too_long.soft_pin_ttl_ms = 2 * 3600 * 1000
    assert store.put(uniq("ttl"), b"x", too_long) == mooncake.INVALID_PARAMS
    # 5% of 512 MiB: hard pins of 4 MiB values stop within a few dozen.
    big = bytes(4 << 20)
    codes = [store.put(uniq("hard"), big, hard) for _ in range(10)]
    assert codes[0] == 0 and mooncake.NO_AVAILABLE_HANDLE in codes, codes
    nof = ReplicateConfig()
    nof.nof_replica_num = 1
    assert store.put(uniq("nof"), b"x", nof) == mooncake.NOT_SUPPORTED


def test_bad_input(store):
    """Keys, buffers and sizes that are wrong: clear codes, and the store keeps serving."""
    assert store.put("", b"x") == mooncake.INVALID_KEY
    assert store.put("k" * 1025, b"x") == mooncake.INVALID_KEY
    assert store.put(b"\xff\xfe", b"x") == mooncake.INVALID_KEY
    assert store.get("") == b"" and store.is_exist("") == -1 and store.get_size("") == mooncake.INVALID_KEY
    buf = (ctypes.c_ubyte * 64)()
    assert store.put_from(uniq("unreg"), ctypes.addressof(buf), 64) == mooncake.INVALID_PARAMS
    assert store.get_into(uniq("unreg"), ctypes.addressof(buf), 64) == mooncake.INVALID_PARAMS
    assert store.register_buffer(0, 10) == mooncake.INVALID_PARAMS
    assert store.register_buffer(ctypes.addressof(buf), 0) == mooncake.INVALID_PARAMS
    # Memory this process cannot address (CUDA's device memory looks so in /proc/self/maps).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                               ctypes.c_int, ctypes.c_int, ctypes.c_long]
    no_access = libc.mmap(None, 1 << 16, 0, 0x22, -1, 0)  # PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS
    assert no_access not in (None, ctypes.c_void_p(-1).value)
    assert store.register_buffer(no_access, 1 << 16) == mooncake.INVALID_PARAMS
    libc.munmap(ctypes.c_void_p(no_access), ctypes.c_size_t(1 << 16))
    assert store.put_batch(["a", "b"], [b"x"]) == mooncake.INVALID_PARAMS
    with pytest.raises(ValueError):
        MooncakeDistributedStore().setup("localhost", "P2PHANDSHAKE", 0, 0, "efa", "", "127.0.0.1:1")
    with pytest.raises(TypeError):
        MooncakeDistributedStore().setup("localhost", "P2PHANDSHAKE", 0, 0, "tcp")
    with pytest.raises(NotImplementedError):
        store.setup_dummy(1 << 20, 1 << 20, "localhost:8080")
    with pytest.raises(NotImplementedError):
        store.remove_by_regex("^x")
    with pytest.raises(NotImplementedError):
        store.batch_get_replica_desc(["x"])
    with pytest.raises(NotImplementedError):
        store.put_tensor("x", torch.zeros(1))
    key = uniq("after")
    assert store.put(key, b"still serving") == 0 and store.get(key) == b"still serving"
    down = MooncakeDistributedStore()
    assert down.setup("localhost", "P2PHANDSHAKE", 0, 0, "tcp", "", "127.0.0.1:1", timeout=1.0) < 0


def test_two_nodes(kvmesh_bin, start_node):
    """An object put through one node is read through another (once the first node's push
    reached the owner), and removed from both through either."""
    a = start_node()
    b = start_node("--join", a.gossip_addr)
    sa, sb = MooncakeDistributedStore(), MooncakeDistributedStore()
    assert sa.setup("localhost", "P2PHANDSHAKE", 0, 0, "tcp", "", a.addr) == 0
    assert sb.setup("localhost", "P2PHANDSHAKE", 0, 0, "tcp", "", b.addr) == 0
    keys = [uniq("two") for _ in range(16)]
    vals = [np.random.default_rng(i).integers(0, 255, 10000, dtype=np.uint8).tobytes() for i in range(16)]
    assert all(sa.put(k, v) == 0 for k, v in zip(keys, vals))
    deadline = time.monotonic() + 20
    while sb.batch_is_exist(keys) != [1] * 16:
        assert time.monotonic() < deadline, "the objects never reached the other node's view"
        time.sleep(0.05)
    assert sb.get_batch(keys) == vals
    assert sb.batch_remove(keys) == [0] * 16
    assert sa.batch_is_exist(keys) == [0] * 16 and sa.get(keys[0]) == b""
    sa.close()
    sb.close()


def test_install_as_mooncake():
    """An engine's unchanged `from mooncake.store import ...` gets kvmesh's class."""
    import subprocess
    import sys
    code = ("import kvmesh.mooncake as k; assert k.install_as_mooncake()\n"
            "from mooncake.store import MooncakeDistributedStore, ReplicateConfig\n"
            "assert MooncakeDistributedStore is k.MooncakeDistributedStore and ReplicateConfig is k.ReplicateConfig\n")
    import pathlib
    env = {"PYTHONPATH": str(pathlib.Path(mooncake.__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
