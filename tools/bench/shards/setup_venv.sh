#!/bin/sh
# Makes the virtual environment tools/bench/shards runs its webdataset peer in: the peers'
# environment (tools/bench/peers/setup_venv.sh: PyTorch and torchvision from PyPI, which import
# and run on the CPU with their nvidia-* wheels installed) with the webdataset package added.
# $COLOAD_PEERS_VENV moves it, as for the peers; the bench prints the versions it ran.
set -u
here=$(cd "$(dirname "$0")" && pwd)
venv="${COLOAD_PEERS_VENV:-$HOME/.cache/coload/venv-peers}"
py="$venv/bin/python"
"$py" -c "import torch, torchvision, webdataset" >/dev/null 2>&1 && exit 0
sh "$here/../peers/setup_venv.sh"
"$venv/bin/pip" install --progress-bar off webdataset || echo "setup_venv: webdataset failed to install" >&2
"$py" -c "import torch, torchvision, webdataset, importlib.metadata as m; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'webdataset', m.version('webdataset'))"
