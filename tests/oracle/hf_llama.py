#!/usr/bin/python3
"""Hugging Face's Llama forward, in PyTorch-Python, for checking Baton's
`checkpoint export --format=hf`.

Written from the formulas of transformers' modeling_llama.py
(LlamaForCausalLM, eager attention): LlamaRMSNorm in float32, rotary
embeddings applied with rotate_half to cos/sin of cat(freqs, freqs),
repeat_kv for grouped-query attention, softmax in float32, the SiLU-gated
MLP, lm_head (or the embedding, tied). It reads only config.json and
model.safetensors (Hugging Face's names and row order) and shares no code
with Baton; the batch a step reads and the safetensors reader come from the
oracle (tests/oracle/oracle.py), which follows the job-file contract.

  hf_llama.py --next-loss HF_DIR --step S JOBFILE
      {"step": S+1, "loss": ...}: the loss step S+1 computes from the
      weights exported after step S
  hf_llama.py --bf16-diff F32_DIR BF16_DIR
      {"tensors": N, "mismatched": K}: whether each bf16 tensor is the f32
      one rounded as torch.Tensor.to(torch.bfloat16) rounds
"""

import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402  (the job's data, from the contract)

def rms_norm(x, weight, eps):
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_cos_sin(config, seq):
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    inv_freq = 1.0 / (config["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    position_ids = torch.arange(seq)[None, :]
    freqs = (inv_freq[None, :, None].float() @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(hidden, n_rep):
    b, kv, t, hd = hidden.shape
    if n_rep == 1:
        return hidden
    return hidden[:, :, None, :, :].expand(b, kv, n_rep, t, hd).reshape(b, kv * n_rep, t, hd)


def causal_lm_loss(config, w, tokens, targets):
    b, t = tokens.shape
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or config["hidden_size"] // heads
    eps = config["rms_norm_eps"]
    cos, sin = rotary_cos_sin(config, t)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)
    h = F.embedding(tokens, w["model.embed_tokens.weight"])
    for layer in range(config["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        residual = h
        x = rms_norm(h, w[pre + "input_layernorm.weight"], eps)
        q = F.linear(x, w[pre + "self_attn.q_proj.weight"]).view(b, t, -1, hd).transpose(1, 2)
        k = F.linear(x, w[pre + "self_attn.k_proj.weight"]).view(b, t, -1, hd).transpose(1, 2)
        v = F.linear(x, w[pre + "self_attn.v_proj.weight"]).view(b, t, -1, hd).transpose(1, 2)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        k, v = repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads)
        scores = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, -1)
        h = residual + F.linear(out, w[pre + "self_attn.o_proj.weight"])
        residual = h
        x = rms_norm(h, w[pre + "post_attention_layernorm.weight"], eps)
        gated = F.silu(F.linear(x, w[pre + "mlp.gate_proj.weight"])) * F.linear(x, w[pre + "mlp.up_proj.weight"])
        h = residual + F.linear(gated, w[pre + "mlp.down_proj.weight"])
    h = rms_norm(h, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = F.linear(h, head).float()
    return F.cross_entropy(logits.view(-1, config["vocab_size"]), targets.reshape(-1))


def next_loss(hf_dir, step, job_path):
    torch.set_num_threads(1)
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    assert config["model_type"] == "llama" and config["hidden_act"] == "silu", config
    w = {k: v.float() for k, v in oracle.read_safetensors(os.path.join(hf_dir, "model.safetensors")).items()}
    loss = oracle.mean_loss(job_path, step + 1, lambda a, b: causal_lm_loss(config, w, a, b))
    print(json.dumps({"step": step + 1, "loss": loss}))


def bf16_diff(f32_dir, bf16_dir):
    full = oracle.read_safetensors(os.path.join(f32_dir, "model.safetensors"))
    half = oracle.read_safetensors(os.path.join(bf16_dir, "model.safetensors"))
    assert set(full) == set(half), (sorted(full), sorted(half))
    mismatched = sum(int(not (half[n].dtype == torch.bfloat16 and torch.equal(full[n].to(torch.bfloat16), half[n])))
                     for n in full)
    config = json.load(open(os.path.join(bf16_dir, "config.json")))
    print(json.dumps({"tensors": len(full), "mismatched": mismatched, "torch_dtype": config["torch_dtype"]}))


def main(argv):
    if len(argv) == 6 and argv[1] == "--next-loss" and argv[3] == "--step":
        next_loss(argv[2], int(argv[4]), argv[5])
        return 0
    if len(argv) == 4 and argv[1] == "--bf16-diff":
        bf16_diff(argv[2], argv[3])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
