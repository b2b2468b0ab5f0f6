#!/usr/bin/env bash
# Make the virtual environment bench/peers.py drives Google Tunix in. Tunix pins
# safetensors<0.8 (we need newer), so it gets its own venv, outside the repo:
#   bench/peers_setup.sh [VENV_DIR]      (default ~/.cache/memsearcher-jax/tunix-venv)
# Uses the same Python as the caller's (python3 on PATH, or $PYTHON).
set -euo pipefail
VENV="${1:-$HOME/.cache/memsearcher-jax/tunix-venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# CPU jax; Tunix 0.1.7 as published on PyPI.
"$VENV/bin/python" -m pip install --quiet "google-tunix==0.1.7" "jax[cpu]"
"$VENV/bin/python" -c "import tunix, jax, flax; print('tunix venv ready:', '$VENV', 'jax', jax.__version__, 'flax', flax.__version__)"
