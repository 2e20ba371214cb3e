"""Baton's decoder as an nn.Module, for bench/pytorch_peer.py.

The model a job file describes (docs/model_contract.md): RMSNorm, rotary
positions on q and k (Meta's Llama tables, interleaved pairs), causal
attention, a GELU or SwiGLU MLP, an untied output. It starts from Baton's own
initial weights and trains on Baton's own batches: both come from
tests/oracle/oracle.py (the contract's counter-based generator, in Python), so
the peer and Baton's workers compute the same losses from the same job file.

Written as a PyTorch 2.11 user writes it: scaled_dot_product_attention
(is_causal) for the attention core, the rotary turn as real multiplications by
tables built once per model, parameter names as the contract's (Llama's), so
the oracle's weights load with load_state_dict.
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import oracle  # noqa: E402  (tests/oracle/oracle.py)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim, seq_len, theta):
    """Meta's precompute_freqs_cis (angle pos * theta^(-2i/hd), float32) as cos
    and sin tables interleaved for the feature pairs (x[2i], x[2i+1])."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    cos, sin = angles.cos(), angles.sin()
    return (torch.stack((cos, cos), -1).flatten(-2).view(seq_len, 1, head_dim),
            torch.stack((-sin, sin), -1).flatten(-2).view(seq_len, 1, head_dim))


def apply_rotary(x, tables):
    """x: (B, T, heads, head_dim); each pair (x[2i], x[2i+1]) turned by its angle."""
    cos, sin = tables
    t = x.shape[1]
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * cos[:t] + swapped * sin[:t]


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["dim"]
        self.heads, self.head_dim = c["heads"], d // c["heads"]
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x, tables):
        b, t, d = x.shape
        q, k, v = (w(x).view(b, t, self.heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary(q, tables), apply_rotary(k, tables)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["dim"], c["ffn_dim"]
        self.swiglu = c["mlp"] == "SWIGLU"
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        if self.swiglu:
            self.w3 = nn.Linear(d, f, bias=False)

    def forward(self, x):
        if self.swiglu:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))  # exact (erf) GELU


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.feed_forward = FeedForward(c)

    def forward(self, x, tables):
        h = x + self.attention(self.attention_norm(x), tables)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.vocab = c["vocab"]
        self.tok_embeddings = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        self.output = nn.Linear(c["dim"], c["vocab"], bias=False)
        # A plain attribute, not a buffer: DDP would broadcast a buffer every step.
        self.tables = rotary_tables(c["dim"] // c["heads"], c["seq_len"], c["rope_theta"])

    def forward(self, tokens, targets):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.tables)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))


def load_job(path):
    """The job file's spec (oracle.load_job), checked to be a decoder this model builds."""
    job = oracle.load_job(path)
    c = job["model"].get("decoder")
    if c is None or c["n_kv_heads"] != c["heads"] or c["block"] != "SEQUENTIAL" or c["dim"] % c["heads"]:
        raise ValueError(f"{path}: the peer builds a SEQUENTIAL decoder without grouped key/value heads")
    return job


def baton_model(job):
    """The decoder with Baton's initial weights for this job (seed, name, index)."""
    model = Transformer(job["model"]["decoder"])
    with torch.no_grad():
        model.load_state_dict({k: v.detach() for k, v in oracle.build_params(job).items()}, strict=True)
    return model


def baton_batches(job, rank, world, steps):
    """Steps 1..steps of this rank's rows (a world's equal, consecutive slices
    of each global batch, as Baton's data-parallel ranks take them):
    (inputs, targets), each (steps, rows, seq_len)."""
    rows = job["data"]["batch_size"] // world
    pairs = [oracle.batch(job, None, s, rank * rows, rows) for s in range(1, steps + 1)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
