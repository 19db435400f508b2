#!/bin/sh
# Makes the virtual environment tools/bench/shards runs the webdataset peer in:
# ~/.cache/coload/venv-shards with PyTorch from PyPI (the wheel cached under ~/.cache/coload
# when there is one), torchvision and webdataset.
set -e
venv="${COLOAD_WDS_VENV:-$HOME/.cache/coload/venv-shards}"
python3 -m venv "$venv"
wheel=$(ls "$HOME"/.cache/coload/wheels/torch-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then
  "$venv/bin/pip" install --quiet "$wheel" torchvision webdataset pillow
else
  "$venv/bin/pip" install --quiet torch torchvision webdataset pillow
fi
"$venv/bin/python" -c "import torch, torchvision, webdataset; print('torch', torch.__version__)"
