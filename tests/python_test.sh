#!/bin/sh
# Runs a Python test with Debian's interpreter (python3-torch, -yaml, -grpcio
# live there, not in a pyenv on PATH): python_test.sh SCRIPT ARGS...
exec /usr/bin/python3 "$@"
