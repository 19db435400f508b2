#!/bin/sh
# Makes the virtual environment tools/bench/shards runs the webdataset peer in
# (~/.cache/coload/venv-shards): PyTorch from PyPI (the wheel cached under ~/.cache/coload/wheels
# when there is one), torchvision and webdataset. PyPI's Linux torch is a CUDA build: where its
# CUDA wheels cannot be had (an offline machine), it cannot be imported, and the venv is made
# instead over /usr/bin/python3's own torch and torchvision (--system-site-packages) with
# webdataset from PyPI; the bench prints the versions it ran.
set -e
venv="${COLOAD_WDS_VENV:-$HOME/.cache/coload/venv-shards}"
check() { "$venv/bin/python" -c "import torch, torchvision, webdataset" 2>/dev/null; }
if [ -x "$venv/bin/python" ] && check; then exit 0; fi
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
wheel=$(ls "$HOME"/.cache/coload/wheels/torch-*.whl 2>/dev/null | head -n 1 || true)
# NOTE: --no-deps for torch and torchvision: their CUDA dependencies are gigabytes; the CPU
# path needs only the small pure-Python ones below.
"$venv/bin/pip" install --quiet --no-deps ${wheel:-torch} torchvision || true
"$venv/bin/pip" install --quiet filelock typing-extensions sympy networkx jinja2 fsspec numpy \
  pillow webdataset || true
if ! check; then
  echo "setup_venv: PyPI's torch cannot be imported here; using /usr/bin/python3's torch" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install --quiet webdataset
fi
"$venv/bin/python" -c "import torch, torchvision, webdataset; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
