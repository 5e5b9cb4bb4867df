"""kvmesh.keys against the golden vectors that the Go tests check too."""
import json
import os
import pathlib

import pytest

import kvmesh
from kvmesh import _namespace, block

REPO = pathlib.Path(__file__).resolve().parents[3]


def golden_path():
    """prefixhash/testdata/golden.json, written by the Go tests (KVMESH_GOLDEN: another)."""
    own = REPO / "prefixhash" / "testdata" / "golden.json"
    for p in (os.environ.get("KVMESH_GOLDEN"), own):
        if p and pathlib.Path(p).exists():
            d = json.loads(pathlib.Path(p).read_text())
            if isinstance(d, dict) and d.get("key_version") == kvmesh.KEY_VERSION:
                return p
    pytest.fail(f"no golden file of key format {kvmesh.KEY_VERSION} at {own}")


def vectors():
    return json.loads(pathlib.Path(golden_path()).read_text())["vectors"]


def ns_of(v):
    n = v["namespace"]
    return kvmesh.Namespace(n["model"], n["dtype"], n["block_tokens"], layers=n["layers"],
                            kv_heads=n["kv_heads"], head_dim=n["head_dim"], tenant_salt=n["tenant_salt"], kv_layout=n.get("kv_layout", "split"),
                            latent_dim=n.get("latent_dim", 0), scales=n.get("scales", "none"), lora=n.get("lora", ""),
                            key_scheme=n.get("key_scheme", "kvmesh"), hash_seed=n.get("hash_seed", ""),
                            extra_key_bytes=n.get("extra_key_bytes", 0))


def extra_of(v):
    return [[bytes.fromhex(k) for k in (e or [])] for e in v.get("extra_keys") or []]


def test_golden():
    vs = vectors()
    assert len(vs) >= 5
    for v in vs:
        ns = ns_of(v)
        assert _namespace.DTYPE_IDS[ns.dtype] == v["namespace"]["dtype_id"], v["name"]
        assert ns.encoding().hex() == v["encoding"], v["name"]
        assert ns.root().hex() == v["root"], v["name"]
        assert f"{ns.digest():016x}" == v["digest"], v["name"]
        assert kvmesh.keys(ns, v["tokens"], extra_of(v)) == v["keys"], v["name"]
    names = {v["name"] for v in vs}
    assert {"kimi-bf16-b16-latent576", "llama-bf16-b16-extra-keys", "vllm-bf16-b16-lora-salt-mm"} <= names


def test_vllm_vectors():
    """The vllm key scheme against hashes computed from vLLM's own definition
    (prefixhash/testdata/vllm_vectors.py, with cbor2)."""
    vs = json.loads((REPO / "prefixhash" / "testdata" / "vllm.json").read_text())["vectors"]
    assert len(vs) >= 10
    for v in vs:
        ns = kvmesh.Namespace("m", "bfloat16", v["block_tokens"], 1, 1, 8, tenant_salt=v["cache_salt"],
                              lora=v["lora"], key_scheme="vllm", hash_seed=v["hash_seed"], extra_key_bytes=256)
        assert ns.root_link().hex() == v["none_hash"], v["name"]
        b = v["block_tokens"]
        extra = []
        for i in range(len(v["tokens"]) // b):
            e = [_namespace.vllm_mm_key(ident, off - i * b) for ident, off, n in v["mm"] if i * b + b > off and i * b < off + n]
            if i < len(v["embeds"]):
                e.append(_namespace.cbor_bytes(bytes.fromhex(v["embeds"][i])))
            extra.append(e)
        links = _namespace.key_links(ns, v["tokens"], extra)
        assert [l.hex() for l in links] == v["hashes"], v["name"]
        assert kvmesh.keys(ns, v["tokens"], extra) == [h[:32] for h in v["hashes"]], v["name"]


def test_extra_keys_separate_blocks():
    ns = kvmesh.Namespace("m", "float16", 4, layers=2, kv_heads=1, head_dim=8, extra_key_bytes=64)
    toks = list(range(12))
    plain = kvmesh.keys(ns, toks)
    a = kvmesh.keys(ns, toks, [None, [b"image-a"]])
    b = kvmesh.keys(ns, toks, [None, [b"image-b"]])
    assert a[0] == plain[0] and a[1:] != b[1:] and a[1] != plain[1]
    assert kvmesh.keys(ns, toks, [[], []]) == plain
    with pytest.raises(ValueError):
        kvmesh.keys(ns, toks, [[], [], [], [b"x"]])  # more blocks than the prompt
    with pytest.raises(ValueError):
        kvmesh.keys(ns, toks, [[b"x"] * 65])
    with pytest.raises(ValueError, match="extra_key_bytes"):
        kvmesh.keys(ns, toks, [[b"x" * 61]])  # 65 bytes with its length, the room is 64
    with pytest.raises(ValueError, match="extra_key_bytes"):
        kvmesh.keys(kvmesh.Namespace("m", "float16", 4, 2, 1, 8), toks, [[b"x"]])


def test_latent_namespace():
    ns = kvmesh.Namespace("moonshotai/Kimi-K2.5", "fp8_e4m3", 16, layers=61, kv_layout="latent", latent_dim=576,
                          scales="block")
    assert ns.block_shape() == (61, 16, 576) and ns.scales_shape() == (61,)
    assert ns.block_bytes == 61 * 16 * 576 + 4 * 61
    with pytest.raises(ValueError, match="kv_layout"):
        kvmesh.Namespace("m", "bfloat16", 16, 2, kv_layout="mla", latent_dim=8)
    with pytest.raises(ValueError, match="latent_dim"):
        kvmesh.Namespace("m", "bfloat16", 16, 2, kv_layout="latent")
    with pytest.raises(ValueError, match="scales"):
        kvmesh.Namespace("m", "bfloat16", 16, 2, 1, 8, scales="block")
    with pytest.raises(ValueError, match="hash_seed"):
        kvmesh.Namespace("m", "bfloat16", 16, 2, 1, 8, key_scheme="vllm")


def test_golden_token_types():
    """Lists, numpy arrays of any integer type and torch tensors key alike."""
    np = pytest.importorskip("numpy")
    v = next(v for v in vectors() if len(v["keys"]) > 1)
    ns = ns_of(v)
    assert kvmesh.keys(ns, np.array(v["tokens"], dtype=np.uint32)) == v["keys"]
    assert kvmesh.keys(ns, np.array(v["tokens"], dtype=np.int64)) == v["keys"]
    torch = pytest.importorskip("torch")
    assert kvmesh.keys(ns, torch.tensor(v["tokens"], dtype=torch.int64)) == v["keys"]


def test_keys_chain_and_tail():
    ns = kvmesh.Namespace("m", "float16", 4, layers=2, kv_heads=1, head_dim=8)
    toks = list(range(11))
    k = kvmesh.keys(ns, toks)
    assert len(k) == 2 and all(len(x) == 32 for x in k)
    assert kvmesh.keys(ns, toks[:8]) == k  # the tail has no key
    assert kvmesh.keys(ns, toks[:4]) == k[:1]  # a prefix's keys are a prefix
    assert kvmesh.keys(ns, [99] + toks[1:8])[0] != k[0]
    assert kvmesh.keys(ns.salted("t"), toks) != k  # salts separate
    assert kvmesh.keys(ns, []) == []


def test_salted_with():
    ns = kvmesh.Namespace("m", "float16", 4, layers=2, kv_heads=1, head_dim=8, tenant_salt=b"own")
    assert ns.salted("t").tenant_salt == "t:own"
    assert ns.salted("t").salted("t").tenant_salt == "t:own"
    assert ns.salted("") is ns


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8"])
def test_dtype_names(dtype):
    assert kvmesh.Namespace("m", dtype, 16, 1, 1, 8).dtype == dtype


def test_dtype_objects():
    np = pytest.importorskip("numpy")
    assert kvmesh.Namespace("m", np.float16, 16, 1, 1, 8).dtype == "float16"
    torch = pytest.importorskip("torch")
    assert kvmesh.Namespace("m", torch.bfloat16, 16, 1, 1, 8).dtype == "bfloat16"


@pytest.mark.parametrize("kw,field", [
    (dict(model=""), "model"), (dict(model="x" * 257), "model"), (dict(dtype="float64"), "dtype"),
    (dict(block_tokens=0), "block_tokens"), (dict(block_tokens=1 << 17), "block_tokens"),
    (dict(layers=0), "layers"), (dict(layers=-1), "layers"), (dict(layers="x"), "layers"),
    (dict(layers=(1, 2)), "layers"), (dict(layers=(1 << 20) + 1), "layers"),
    (dict(kv_heads=0), "kv_heads"), (dict(head_dim=0), "head_dim"),
    (dict(tenant_salt="s" * 257), "tenant_salt"), (dict(block_tokens=1.5), "block_tokens"),
])
def test_bad_namespace(kw, field):
    args = dict(model="m", dtype="float16", block_tokens=16, layers=2, kv_heads=2, head_dim=8)
    args.update(kw)
    with pytest.raises(ValueError, match=field):
        kvmesh.Namespace(**args)


@pytest.mark.parametrize("tokens", [[-1], [1 << 32], [[1, 2]], ["a"], b"abcd", "abcd", [1.5]])
def test_bad_tokens(tokens):
    ns = kvmesh.Namespace("m", "float16", 1, 1, 1, 8)
    with pytest.raises(ValueError, match="tokens"):
        kvmesh.keys(ns, tokens)


def test_block_header_roundtrip():
    ns = kvmesh.Namespace("m", "float16", 4, layers=2, kv_heads=2, head_dim=8)
    for kv in (kvmesh.KEY_VERSION,):
        h, key = block.encode_header(ns, ns.root(kv), [1, 2, 3, 4], 0x1234, tenant_tag=99, key_version=kv)
        assert len(h) == block.header_len(4, 4) == 192
        d = block.decode_header(h, kv)
        block.check_namespace(d, ns)
        assert (d.key, d.parent, d.checksum, d.tenant, d.payload_len) == (key, ns.root(kv), 0x1234, 99, ns.block_bytes)
        assert h[96:104] == (99).to_bytes(8, "little")  # the tenant tag's place
        for off in (0, 4, 6, 16, 30, 60, 96, 104, 120, 128, 144, 160, 191):  # 152..192: the padding, zeros
            bad = bytearray(h)
            bad[off] ^= 1
            with pytest.raises(block.CorruptBlock):
                block.decode_header(bytes(bad), kv)
        other = kvmesh.Namespace("m", "float16", 4, layers=2, kv_heads=2, head_dim=8, tenant_salt="x")
        with pytest.raises(block.CorruptBlock):
            block.check_namespace(d, other)


def test_keys_speed_128k():
    """Keys of a 128k-token prompt: the issue's budget is 5 ms; a shared 2-core CI
    machine gets ten times that before this fails."""
    import time
    ns = kvmesh.Namespace("m", "bfloat16", 16, 32, 8, 128)
    toks = list(range(128 * 1024))
    best = min((lambda t0: (kvmesh.keys(ns, toks), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(3))
    assert best < 0.05, f"{best * 1e3:.1f} ms"
