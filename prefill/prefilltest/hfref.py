#!/usr/bin/env python3
"""hfref: small Hugging Face checkpoints made, and run, in PyTorch.

An implementation independent of kvmesh's, written from the architectures'
published definitions (transformers' modeling_llama, modeling_mistral,
modeling_qwen2, modeling_qwen3 and modeling_rope_utils) and from the
safetensors format, for kvmesh's tests and benchmarks. Only Debian's
python3-torch and numpy are needed: it reads and writes safetensors itself.

  hfref.py suite SPEC.json OUTDIR
      For each model of SPEC ({"models": [{"name", "arch", "dtype", "shards",
      "seed", "config": {...config.json fields}, "prompt": [ids]}]}): write a
      random checkpoint to OUTDIR/NAME (config.json, safetensors, index when
      sharded), read it back, and write OUTDIR/NAME/logits.f64: the logits of
      every prompt position, [positions][vocab] float64 little-endian,
      computed in float64 from the stored (16-bit) weights.
  hfref.py make DIR --arch qwen2 --dtype bf16 --shards 1 --seed 1 --config JSON
      Only the checkpoint.
  hfref.py bench DIR --prompt N --decode M --threads T --runs R
      The float32 forward's speed: prefill tokens/s of an N-token prompt and
      decode tokens/s of M tokens after it (KV cache), median of R runs; JSON.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
ST_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


# --- safetensors ---------------------------------------------------------

def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        b = tensor_bytes(tensors[name])
        header[name] = {"dtype": ST_NAMES[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path, out):
    """Reads every tensor of path into out, as float64 torch tensors."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[base + b:base + end]
        if e["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            a = u.view(np.float32)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        elif e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        else:
            raise ValueError("dtype " + e["dtype"])
        out[name] = torch.from_numpy(a.astype(np.float64)).reshape(e["shape"])


def read_checkpoint(d):
    out = {}
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        read_safetensors(os.path.join(d, name), out)
    return out


# --- checkpoints ---------------------------------------------------------

def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def make(d, arch, dtype, shards, seed, config):
    os.makedirs(d, exist_ok=True)
    c = dict(config)
    c["model_type"] = arch
    c.setdefault("hidden_act", "silu")
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("rope_theta", 10000.0)
    c.setdefault("torch_dtype", {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype])
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    dim, ffn, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]

    def lin(o, i):
        return (torch.randn(o, i, generator=g) / math.sqrt(i)).to(dt)

    def norm(n):
        return (1 + (torch.rand(n, generator=g) - 0.5) / 4).to(dt)

    def bias(n):
        return ((torch.rand(n, generator=g) - 0.5) / 4).to(dt)

    t = {"model.embed_tokens.weight": torch.randn(V, dim, generator=g).to(dt)}
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        t[p + "input_layernorm.weight"] = norm(dim)
        t[p + "self_attn.q_proj.weight"] = lin(H * hd, dim)
        t[p + "self_attn.k_proj.weight"] = lin(KV * hd, dim)
        t[p + "self_attn.v_proj.weight"] = lin(KV * hd, dim)
        if arch == "qwen2":
            t[p + "self_attn.q_proj.bias"] = bias(H * hd)
            t[p + "self_attn.k_proj.bias"] = bias(KV * hd)
            t[p + "self_attn.v_proj.bias"] = bias(KV * hd)
        if arch == "qwen3":
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "self_attn.o_proj.weight"] = lin(dim, H * hd)
        t[p + "post_attention_layernorm.weight"] = norm(dim)
        t[p + "mlp.gate_proj.weight"] = lin(ffn, dim)
        t[p + "mlp.up_proj.weight"] = lin(ffn, dim)
        t[p + "mlp.down_proj.weight"] = lin(dim, ffn)
    t["model.norm.weight"] = norm(dim)
    if not c.get("tie_word_embeddings", False):
        t["lm_head.weight"] = lin(V, dim)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    if shards <= 1:
        write_safetensors(os.path.join(d, "model.safetensors"), t)
        return
    names = sorted(t)
    weight_map = {}
    for s in range(shards):
        file = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = {n: t[n] for n in names[s::shards]}
        write_safetensors(os.path.join(d, file), part)
        weight_map.update({n: file for n in part})
    total = sum(len(tensor_bytes(x)) for x in t.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# --- the forward pass ----------------------------------------------------

def inv_freq(c):
    """RoPE's inverse frequencies and attention scaling (modeling_rope_utils)."""
    hd = head_dim(c)
    base = c.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = c.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    factor = rs["factor"]
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        low, high = rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, inv_l), 1.0
    if kind == "yarn":
        orig = rs.get("original_max_position_embeddings") or c["max_position_embeddings"]
        att = rs.get("attention_factor")
        if att is None:
            att = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr_dim(rot):
            return (hd * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), hd - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(hd // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        pos_freqs = base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        return (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra, att
    raise ValueError("rope type " + kind)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Model:
    def __init__(self, d, dtype=torch.float64):
        with open(os.path.join(d, "config.json")) as f:
            self.c = json.load(f)
        self.arch = self.c.get("model_type", "llama")
        self.w = {k: v.to(dtype) for k, v in read_checkpoint(d).items()}
        if "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.inv, self.att = inv_freq(self.c)
        self.inv = self.inv.to(dtype)
        self.dtype = dtype

    def forward(self, ids, cache=None, last=False):
        """Logits of every position of ids (with last, of the last one only,
        as generation computes them), which follow the len(cache[0][0])
        positions whose K/V cache holds (a list of per-layer [k, v])."""
        c, w = self.c, self.w
        H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
        eps = c.get("rms_norm_eps", 1e-6)
        start = 0 if not cache else cache[0][0].shape[1]
        n = len(ids)
        pos = torch.arange(start, start + n, dtype=self.dtype)
        freqs = pos[:, None] * self.inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.att, emb.sin() * self.att
        window = c.get("sliding_window") if self.arch == "mistral" else None
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        for l in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % l
            h = rms(x, w[p + "input_layernorm.weight"], eps)
            q, k, v = (h @ w[p + "self_attn.%s_proj.weight" % s].T for s in "qkv")
            if self.arch == "qwen2":
                q, k, v = (t + w[p + "self_attn.%s_proj.bias" % s] for t, s in zip((q, k, v), "qkv"))
            q = q.view(n, H, hd)
            k = k.view(n, KV, hd)
            v = v.view(n, KV, hd).transpose(0, 1)
            if self.arch == "qwen3":
                q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
                k = rms(k, w[p + "self_attn.k_norm.weight"], eps)
            q, k = q.transpose(0, 1), k.transpose(0, 1)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if cache is not None:
                if len(cache) <= l:
                    cache.append([k, v])
                else:
                    cache[l][0] = k = torch.cat((cache[l][0], k), dim=1)
                    cache[l][1] = v = torch.cat((cache[l][1], v), dim=1)
            k = k.repeat_interleave(H // KV, dim=0)
            v = v.repeat_interleave(H // KV, dim=0)
            s = q @ k.transpose(-1, -2) / math.sqrt(hd)
            qi = torch.arange(start, start + n)[:, None]
            kj = torch.arange(k.shape[1])[None, :]
            masked = kj > qi
            if window:
                masked = masked | (kj <= qi - window)
            s = s.masked_fill(masked, float("-inf"))
            o = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(n, H * hd)
            x = x + o @ w[p + "self_attn.o_proj.weight"].T
            h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
        if last:
            x = x[-1:]
        return rms(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


# --- commands ------------------------------------------------------------

def cmd_suite(spec_path, out):
    with open(spec_path) as f:
        spec = json.load(f)
    for m in spec["models"]:
        d = os.path.join(out, m["name"])
        make(d, m["arch"], m["dtype"], m.get("shards", 1), m.get("seed", 1), m["config"])
        logits = Model(d).forward(m["prompt"])
        with open(os.path.join(d, "logits.f64"), "wb") as f:
            f.write(logits.numpy().astype("<f8").tobytes())


def cmd_bench(d, prompt, decode, threads, runs):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    load0 = time.time()
    m = Model(d, torch.float32)
    load = time.time() - load0
    V = m.c["vocab_size"]
    ids = torch.randint(0, V, (prompt,)).tolist()
    pre, dec = [], []
    with torch.no_grad():
        for _ in range(runs):
            t0 = time.time()
            cache = []
            logits = m.forward(ids, cache, last=True)
            t1 = time.time()
            nxt = int(logits[-1].argmax())
            for _ in range(decode):
                nxt = int(m.forward([nxt], cache, last=True)[-1].argmax())
            t2 = time.time()
            pre.append(prompt / (t1 - t0))
            dec.append(decode / (t2 - t1) if decode else 0)
    json.dump({"threads": threads, "prompt_tokens": prompt, "decode_tokens": decode, "load_s": load,
               "prefill_tok_s": sorted(pre), "decode_tok_s": sorted(dec),
               "torch": torch.__version__, "blas": blas_info()}, sys.stdout)


def blas_info():
    """The BLAS library the process loaded (Debian's torch calls libblas.so.3:
    the reference BLAS, or OpenBLAS when installed or on LD_LIBRARY_PATH)."""
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "blas" in line.lower() and "/" in line})
        return ", ".join(os.path.relpath(l, "/usr/lib/x86_64-linux-gnu") if l.startswith("/usr/lib") else l for l in libs)
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("suite")
    s.add_argument("spec")
    s.add_argument("out")
    mk = sub.add_parser("make")
    mk.add_argument("dir")
    mk.add_argument("--arch", required=True)
    mk.add_argument("--dtype", default="bf16")
    mk.add_argument("--shards", type=int, default=1)
    mk.add_argument("--seed", type=int, default=1)
    mk.add_argument("--config", required=True)
    b = sub.add_parser("bench")
    b.add_argument("dir")
    b.add_argument("--prompt", type=int, default=512)
    b.add_argument("--decode", type=int, default=16)
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if a.cmd == "suite":
        cmd_suite(a.spec, a.out)
    elif a.cmd == "make":
        make(a.dir, a.arch, a.dtype, a.shards, a.seed, json.loads(a.config))
    else:
        cmd_bench(a.dir, a.prompt, a.decode, a.threads, a.runs)


if __name__ == "__main__":
    main()
