#!/usr/bin/env python3
"""An independent oracle for Baton jobs, in PyTorch-Python.

Re-implements what a job file computes from the contract alone
(proto/job.proto and docs/model_contract.md): the counter-based
initialisation, synthetic and token-file batches, the MLP and decoder models,
torch.optim.AdamW and torch.nn.utils.clip_grad_norm_. It shares no code with
Baton; a bug in Baton's model code (a wrong attention scale, a wrong Adam bias
correction) shows up as a difference from it.

  python tests/oracle/oracle.py [--float64] JOBFILE [JOBFILE ...]

prints one JSON object per step and job:
  {"job": JOBFILE, "step": 1, "loss": ..., "grad_norm": ...}
With --float64 the same jobs run in float64 (the fp32 initial weights and
data, widened): the truth the fp32 runs - Baton's and this oracle's - are
measured against, so a test can say which side drifted and bound a
difference by how far fp32 itself drifts.
Job files are textproto, or JSON when the name ends in .json.

Exported weights (a safetensors file, read with the standard library and
torch.frombuffer only):

  oracle.py --init-diff FILE.safetensors JOBFILE
      {"tensors": N, "mismatched": K, "max_abs_diff": D} against the job's
      initial parameters (bit for bit)
  oracle.py --next-loss FILE.safetensors --step S JOBFILE
      {"step": S+1, "loss": ...}: the loss step S+1 computes from those weights
"""

import json
import math
import re
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

MASK64 = (1 << 64) - 1
DTYPE = torch.float32  # torch.float64 under --float64


# ------------------------------------------------------------- job files ---

def parse_textproto(text):
    """The textproto subset job files use: scalars, strings, enums, nested
    messages (name { ... } or name: { ... }), repeated fields, # comments."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[{}:]|[^\s{}:"#]+|#[^\n]*', text)
    tokens = [t for t in tokens if not t.startswith("#")]
    pos = 0

    def message(end):
        nonlocal pos
        fields = {}
        while pos < len(tokens) and tokens[pos] != end:
            name = tokens[pos]
            pos += 1
            if tokens[pos] == ":":
                pos += 1
            if tokens[pos] == "{":
                pos += 1
                value = message("}")
                pos += 1
            else:
                raw = tokens[pos]
                pos += 1
                if raw.startswith('"'):
                    value = json.loads(raw)
                elif re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?[fF]?", raw):
                    value = float(raw.rstrip("fF")) if re.search(r"[.eE]", raw) else int(raw)
                elif raw in ("true", "false"):
                    value = raw == "true"
                else:
                    value = raw  # an enum name
            fields.setdefault(name, []).append(value)
        return {k: (v if k == "mesh" else v[-1]) for k, v in fields.items()}

    return message(None)


def snake(name):
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def normalise_json(value):
    if isinstance(value, dict):
        return {snake(k): normalise_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise_json(v) for v in value]
    return value


def f32(x):
    """A float field as the float32 it is on the wire."""
    return float(np.float32(x))


def load_job(path):
    text = open(path).read()
    job = normalise_json(json.loads(text)) if path.endswith(".json") else parse_textproto(text)
    model = job["model"]
    if "mlp" in model:
        m = model["mlp"]
        m.setdefault("hidden", m["d_model"])
        m.setdefault("bias", True)
    else:
        d = model["decoder"]
        d.setdefault("norm_eps", 1e-5)
        d.setdefault("mlp", "GELU")
        d.setdefault("block", "SEQUENTIAL")
        d["norm_eps"] = f32(d["norm_eps"])
        d.setdefault("n_kv_heads", d["heads"])
        d["rope_theta"] = f32(d.get("rope_theta", 10000.0))
        if not d.get("ffn_dim") and d.get("multiple_of"):
            # Llama's FeedForward: 2/3 of 4 * dim, scaled, rounded up.
            hidden = int(2 * (4 * d["dim"]) / 3)
            if "ffn_dim_multiplier" in d:
                hidden = int(f32(d["ffn_dim_multiplier"]) * hidden)
            d["ffn_dim"] = d["multiple_of"] * ((hidden + d["multiple_of"] - 1) // d["multiple_of"])
    opt = job.get("optimizer", {})
    for key, default in (("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("weight_decay", 0.01),
                         ("max_grad_norm", 0.0)):
        opt[key] = f32(opt.get(key, default))
    opt["lr"] = f32(opt["lr"])
    job["optimizer"] = opt
    data = job["data"]
    data.setdefault("microbatches", 1)
    job.setdefault("seed", 0)
    return job


# ----------------------------------------------------- counter generator ---

def mix(z):
    """SplitMix64's finaliser on a uint64 array."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def stream_id(name):
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def bits(seed, stream, index):
    """Bits(seed, stream, i) for an array of indices."""
    key = mix(np.array([seed & MASK64], dtype=np.uint64))[0] ^ np.uint64(stream)
    key = mix(np.array([key], dtype=np.uint64))[0]
    return mix(np.asarray(index, dtype=np.uint64) ^ key)


def uniform01(seed, stream, index):
    return (bits(seed, stream, index) >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def normal(seed, stream, index):
    index = np.asarray(index, dtype=np.uint64)
    b1 = bits(seed, stream, index * np.uint64(2))
    b2 = bits(seed, stream, index * np.uint64(2) + np.uint64(1))
    u1 = ((b1 >> np.uint64(11)).astype(np.float64) + 1.0) * (1.0 / 9007199254740992.0)
    u2 = (b2 >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)).astype(np.float32)


def counter_int(seed, stream, index, n):
    with np.errstate(over="ignore"):
        return ((bits(seed, stream, index) >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32)


# ----------------------------------------------------------------- model ---

def init_param(seed, name, shape, kind, fan_in=None):
    n = int(np.prod(shape))
    index = np.arange(n, dtype=np.uint64)
    if kind == "ones":
        values = np.ones(n, dtype=np.float32)
    elif kind == "normal":
        values = normal(seed, stream_id(name), index) * np.float32(0.02)
    else:
        scale = np.float32(1.0 / math.sqrt(fan_in))
        values = (np.float32(2.0) * uniform01(seed, stream_id(name), index) - np.float32(1.0)) * scale
    return torch.tensor(values.reshape(shape), dtype=torch.float32, requires_grad=True)


def build_params(job):
    seed, model = job["seed"], job["model"]
    p = {}
    if "mlp" in model:
        m = model["mlp"]
        d, h = m["d_model"], m["hidden"]
        for b in range(m["blocks"]):
            pre = f"blocks.{b}."
            p[pre + "w1.weight"] = init_param(seed, pre + "w1.weight", (h, d), "uniform", d)
            if m["bias"]:
                p[pre + "w1.bias"] = init_param(seed, pre + "w1.bias", (h,), "uniform", d)
            p[pre + "w2.weight"] = init_param(seed, pre + "w2.weight", (d, h), "uniform", h)
            if m["bias"]:
                p[pre + "w2.bias"] = init_param(seed, pre + "w2.bias", (d,), "uniform", h)
        p["head.weight"] = init_param(seed, "head.weight", (1, d), "uniform", d)
        if m["bias"]:
            p["head.bias"] = init_param(seed, "head.bias", (1,), "uniform", d)
        return p
    c = model["decoder"]
    v, d, f = c["vocab"], c["dim"], c["ffn_dim"]
    p["tok_embeddings.weight"] = init_param(seed, "tok_embeddings.weight", (v, d), "normal")
    for layer in range(c["layers"]):
        pre = f"layers.{layer}."
        p[pre + "attention_norm.weight"] = init_param(seed, pre + "attention_norm.weight", (d,), "ones")
        kv = c["n_kv_heads"] * (d // c["heads"])
        for w, rows in (("wq", d), ("wk", kv), ("wv", kv), ("wo", d)):
            name = pre + f"attention.{w}.weight"
            p[name] = init_param(seed, name, (rows, d), "uniform", d)
        if c["block"] != "PARALLEL":
            p[pre + "ffn_norm.weight"] = init_param(seed, pre + "ffn_norm.weight", (d,), "ones")
        p[pre + "feed_forward.w1.weight"] = init_param(seed, pre + "feed_forward.w1.weight", (f, d), "uniform", d)
        p[pre + "feed_forward.w2.weight"] = init_param(seed, pre + "feed_forward.w2.weight", (d, f), "uniform", f)
        if c["mlp"] == "SWIGLU":
            p[pre + "feed_forward.w3.weight"] = init_param(seed, pre + "feed_forward.w3.weight", (f, d), "uniform", d)
    p["norm.weight"] = init_param(seed, "norm.weight", (d,), "ones")
    p["output.weight"] = init_param(seed, "output.weight", (v, d), "uniform", d)
    return p


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


# Tests show the oracle can fail: BATON_ORACLE_MUTANT=rope_on_v rotates v
# instead of k, rope_halves pairs feature i with i + head_dim / 2.
MUTANT = __import__("os").environ.get("BATON_ORACLE_MUTANT", "")


def rotary(x, theta):
    """Meta's Llama apply_rotary_emb: x's features as complex numbers
    (x[2i] + x[2i+1] j), times exp(j * pos * theta^(-2i/hd)). x: (b, t, h, hd).
    An odd hd's last feature has no partner: it passes through."""
    b, t, heads, hd = x.shape
    if hd % 2:
        return torch.cat((rotary_pairs(x[..., : hd - 1], theta, hd), x[..., hd - 1:]), dim=-1)
    return rotary_pairs(x, theta, hd)


def rotary_pairs(x, theta, hd):
    b, t, heads, width = x.shape
    # precompute_freqs_cis, in float32 as Meta's.
    freqs = 1.0 / (theta ** (torch.arange(0, hd, 2)[: hd // 2].to(DTYPE) / hd))
    angles = torch.outer(torch.arange(t, dtype=DTYPE), freqs)
    rot = torch.polar(torch.ones_like(angles), angles).view(1, t, 1, hd // 2)
    if MUTANT == "rope_halves":
        pairs = torch.stack((x[..., : width // 2], x[..., width // 2:]), dim=-1)
    else:
        pairs = x.to(DTYPE).reshape(b, t, heads, width // 2, 2)
    out = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * rot)
    if MUTANT == "rope_halves":
        return torch.cat((out[..., 0], out[..., 1]), dim=-1).type_as(x)
    return out.flatten(3).type_as(x)


def attention(c, p, pre, a):
    b, t, _ = a.shape
    d, heads, kv_heads = c["dim"], c["heads"], c["n_kv_heads"]
    hd = d // heads
    mask = torch.full((t, t), float("-inf"), dtype=DTYPE).triu(1)
    q = F.linear(a, p[pre + "attention.wq.weight"]).view(b, t, heads, hd)
    k = F.linear(a, p[pre + "attention.wk.weight"]).view(b, t, kv_heads, hd)
    v = F.linear(a, p[pre + "attention.wv.weight"]).view(b, t, kv_heads, hd)
    q = rotary(q, c["rope_theta"])
    if MUTANT == "rope_on_v":
        v = rotary(v, c["rope_theta"])
    else:
        k = rotary(k, c["rope_theta"])
    # Llama's repeat_kv: query head j uses key/value head j // (heads / kv_heads).
    group = heads // kv_heads
    q, k, v = (x.transpose(1, 2) for x in (q, torch.repeat_interleave(k, group, dim=2),
                                          torch.repeat_interleave(v, group, dim=2)))
    # The contract's scale is a multiplication by 1 / sqrt(head_dim)
    # (as scaled_dot_product_attention applies it): dividing instead
    # rounds the scores differently, and this model's gradient norm
    # amplifies that to ~1e-5 over a few AdamW steps.
    probs = torch.softmax((q @ k.transpose(-2, -1)).mul(1.0 / math.sqrt(hd)) + mask, dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(b, t, d)
    return F.linear(out, p[pre + "attention.wo.weight"])


def feed_forward(c, p, pre, x):
    if c["mlp"] == "SWIGLU":
        inner = F.silu(F.linear(x, p[pre + "feed_forward.w1.weight"])) * F.linear(x, p[pre + "feed_forward.w3.weight"])
    else:
        inner = F.gelu(F.linear(x, p[pre + "feed_forward.w1.weight"]))
    return F.linear(inner, p[pre + "feed_forward.w2.weight"])


def decoder_loss(c, p, tokens, targets):
    h = F.embedding(tokens, p["tok_embeddings.weight"])
    for layer in range(c["layers"]):
        pre = f"layers.{layer}."
        a = rms(h, p[pre + "attention_norm.weight"], c["norm_eps"])
        if c["block"] == "PARALLEL":  # GPT-J / PaLM: both from the one norm
            h = h + attention(c, p, pre, a) + feed_forward(c, p, pre, a)
            continue
        h = h + attention(c, p, pre, a)
        h = h + feed_forward(c, p, pre, rms(h, p[pre + "ffn_norm.weight"], c["norm_eps"]))
    logits = F.linear(rms(h, p["norm.weight"], c["norm_eps"]), p["output.weight"])
    return F.cross_entropy(logits.view(-1, c["vocab"]), targets.reshape(-1))


def mlp_loss(m, p, x, y):
    for b in range(m["blocks"]):
        pre = f"blocks.{b}."
        hidden = F.gelu(F.linear(x, p[pre + "w1.weight"], p.get(pre + "w1.bias")))
        x = x + F.linear(hidden, p[pre + "w2.weight"], p.get(pre + "w2.bias"))
    return F.mse_loss(F.linear(x, p["head.weight"], p.get("head.bias")), y)


# ------------------------------------------------------------------ data ---

def read_tokens(job):
    spec = job["data"].get("token_file")
    if spec is None:
        return None
    raw = open(spec["path"], "rb").read()
    fmt = spec.get("format", "UINT16")
    if fmt == "UINT16":
        return np.frombuffer(raw, dtype="<u2").astype(np.int64)
    if fmt == "UINT32":
        return np.frombuffer(raw, dtype="<u4").astype(np.int64)
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)


def batch(job, tokens, step, begin, rows):
    seed, model = job["seed"], job["model"]
    first = (step - 1) * job["data"]["batch_size"] + begin
    row = np.arange(first, first + rows, dtype=np.uint64)
    if "mlp" in model:
        d = model["mlp"]["d_model"]
        index = (row[:, None] * np.uint64(d) + np.arange(d, dtype=np.uint64)[None, :]).reshape(-1)
        x = normal(seed, stream_id("data.x"), index).reshape(rows, d)
        y = normal(seed, stream_id("data.y"), row).reshape(rows, 1)
        return torch.from_numpy(x), torch.from_numpy(y)
    c = model["decoder"]
    window = c["seq_len"] + 1
    j = np.arange(window, dtype=np.int64)[None, :]
    if tokens is None:
        start = counter_int(seed, stream_id("data.start"), row, c["vocab"]).astype(np.int64)[:, None]
        stride = 1 + counter_int(seed, stream_id("data.stride"), row, 8).astype(np.int64)[:, None]
        seq = (start + j * stride) % c["vocab"]
    else:
        starts = len(tokens) - window + 1
        seq = tokens[(row.astype(np.int64)[:, None] * window) % starts + j]
    seq = torch.from_numpy(np.ascontiguousarray(seq))
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def mean_loss(job_path, step, loss_of):
    """The mean over a job file's microbatches of step `step` of
    loss_of(inputs, targets), without gradients: what the step's loss is."""
    job = load_job(job_path)
    tokens = read_tokens(job)
    microbatches = job["data"]["microbatches"]
    rows = job["data"]["batch_size"] // microbatches
    with torch.no_grad():
        return sum(loss_of(*batch(job, tokens, step, mb * rows, rows)).item()
                   for mb in range(microbatches)) / microbatches


# -------------------------------------------------------------- training ---

def train(path, out):
    job = load_job(path)
    torch.set_num_threads(1)
    params = {k: v.detach().to(DTYPE).requires_grad_() for k, v in build_params(job).items()}
    opt_spec = job["optimizer"]
    optimizer = torch.optim.AdamW(params.values(), lr=opt_spec["lr"],
                                  betas=(opt_spec["beta1"], opt_spec["beta2"]),
                                  eps=opt_spec["eps"], weight_decay=opt_spec["weight_decay"])
    tokens = read_tokens(job)
    data, model = job["data"], job["model"]
    microbatches = data["microbatches"]
    rows = data["batch_size"] // microbatches
    for step in range(1, job["steps"] + 1):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for mb in range(microbatches):
            a, b = (x.to(DTYPE) if x.is_floating_point() else x for x in batch(job, tokens, step, mb * rows, rows))
            loss = mlp_loss(model["mlp"], params, a, b) if "mlp" in model else decoder_loss(model["decoder"], params, a, b)
            loss_sum += loss.item()
            (loss / microbatches).backward()
        grads = [q.grad for q in params.values() if q.grad is not None]
        norm = math.sqrt(sum(g.double().pow(2).sum().item() for g in grads))
        if opt_spec["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params.values(), opt_spec["max_grad_norm"])
        optimizer.step()
        out.write(json.dumps({"job": path, "step": step, "loss": loss_sum / microbatches, "grad_norm": norm}) + "\n")
        out.flush()


SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16}


def read_safetensors(path):
    """name -> tensor (F32 or BF16), from the format's definition: an 8-byte
    little-endian header length, a JSON header, then the raw data."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        values = torch.frombuffer(bytearray(data[begin:end]), dtype=SAFETENSORS_DTYPES[entry["dtype"]])
        out[name] = values.reshape(entry["shape"])
    return out


def init_diff(weights_path, job_path):
    weights = read_safetensors(weights_path)
    params = build_params(load_job(job_path))
    mismatched, worst = 0, 0.0
    for name, p in params.items():
        w = weights.get(name)
        if w is None or tuple(w.shape) != tuple(p.shape):
            mismatched += 1
            worst = float("inf")
            continue
        diff = (w - p.detach()).abs().max().item() if w.numel() else 0.0
        mismatched += int(not torch.equal(w, p.detach()))
        worst = max(worst, diff)
    print(json.dumps({"tensors": len(params), "exported": len(weights), "mismatched": mismatched,
                      "max_abs_diff": worst}))


def next_loss(weights_path, step, job_path):
    job = load_job(job_path)
    torch.set_num_threads(1)
    weights = read_safetensors(weights_path)
    params = {name: weights[name].clone() for name in build_params(job)}
    model = job["model"]

    def loss_of(a, b):
        return mlp_loss(model["mlp"], params, a, b) if "mlp" in model else decoder_loss(model["decoder"], params, a, b)
    print(json.dumps({"job": job_path, "step": step + 1, "loss": mean_loss(job_path, step + 1, loss_of)}))


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    if argv[1] == "--init-diff" and len(argv) == 4:
        init_diff(argv[2], argv[3])
        return 0
    if argv[1] == "--next-loss" and len(argv) == 6 and argv[3] == "--step":
        next_loss(argv[2], int(argv[4]), argv[5])
        return 0
    paths = argv[1:]
    if paths and paths[0] == "--float64":
        global DTYPE
        DTYPE = torch.float64
        paths = paths[1:]
    for path in paths:
        train(path, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
