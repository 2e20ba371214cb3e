#!/bin/sh
# Runs a Python test that needs no torch with Debian's interpreter (python3-yaml
# and python3-grpcio live there, not in a pyenv on PATH): python_test.sh SCRIPT
# ARGS... Tests that need PyTorch run the environment's interpreter instead
# (//third_party:python; tests/seed_lab_test.sh).
exec /usr/bin/python3 "$@"
