#!/bin/sh
# The seeds' two-rank gloo lab (tests/seed_lab/lab.py) on the environment's
# torch 2.11: FSDP2 vs a reference < 1e-5, bf16 < 5e-2, the local-state ratio
# in [0.45, 0.55], TP and PP < 1e-5, six redistributes exact, DCP < 1e-7.
# It prints a CHECK line per figure and exits non-zero when one fails.
exec external/torch/python tests/seed_lab/lab.py --timeout 240
