#!/usr/bin/env python3
"""Baton's Hugging Face interchange checked by Hugging Face's own code:
transformers' LlamaForCausalLM (eager attention, float32), nothing written
here but the loss over its logits. The batch a step reads comes from the
oracle (tests/oracle/oracle.py), which follows Baton's job-file contract.

  hf_transformers.py --next-loss HF_DIR --step S JOBFILE
      loads HF_DIR with LlamaForCausalLM.from_pretrained and prints
      {"step": S+1, "loss": ..., "transformers": VERSION}: the loss step S+1
      of the job computes from those weights
  hf_transformers.py --save-random TEMPLATE_DIR OUT_DIR SEED JOBFILE
      a LlamaForCausalLM with TEMPLATE_DIR's config.json, initialised by
      transformers itself under torch.manual_seed(SEED), written with
      save_pretrained (safetensors) to OUT_DIR; prints {"step": 1, "loss": ...}:
      the job's first loss from those weights

Run with Baton's Python environment (third_party/python/env.sh), which has
transformers. Nothing is fetched from a hub: HF_HUB_OFFLINE is set.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402  (the job's data, from the contract)


def job_loss(model, job_path, step):
    """The mean over the job's microbatches of step `step`'s cross-entropy."""
    def loss_of(ids, targets):
        logits = model(input_ids=ids).logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return oracle.mean_loss(job_path, step, loss_of)


def load(hf_dir):
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def next_loss(hf_dir, step, job_path):
    loss = job_loss(load(hf_dir), job_path, step + 1)
    print(json.dumps({"step": step + 1, "loss": loss, "transformers": transformers.__version__}))


def save_random(template_dir, out_dir, seed, job_path):
    config = LlamaConfig.from_pretrained(template_dir)
    config.torch_dtype = "float32"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    # The loss from what was written, read back as a user would.
    loss = job_loss(load(out_dir), job_path, 1)
    print(json.dumps({"step": 1, "loss": loss, "transformers": transformers.__version__}))


def main(argv):
    torch.set_num_threads(1)
    if len(argv) == 6 and argv[1] == "--next-loss" and argv[3] == "--step":
        next_loss(argv[2], int(argv[4]), argv[5])
        return 0
    if len(argv) == 6 and argv[1] == "--save-random":
        save_random(argv[2], argv[3], int(argv[4]), argv[5])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
