#!/bin/sh
# Makes the virtual environment tools/bench/peers runs its Python peers in
# (~/.cache/coload/venv-peers, or $COLOAD_PEERS_VENV), from PyPI with pip's ordinary resolver:
#   torch + torchvision  PyPI's Linux torch is a CUDA build; installed with its nvidia-* wheels
#                        (about 4 GB) it imports and runs on the CPU. A torch wheel cached under
#                        ~/.cache/coload/wheels is used when there is one.
#   nvidia-dali-cuda130  DALI; pipelines with device_id=None run on the CPU without a GPU.
#   spdl                 needs FFmpeg's shared libraries 4 to 9 from the system; on Debian 12
#                        those are libavdevice59 (apt-get install libavdevice59).
#   tensorflow-cpu       tf.data.
# Each is installed on its own, so that one that fails leaves the others; a peer that cannot
# be imported gets a row saying so. Quick once everything imports.
set -u
venv="${COLOAD_PEERS_VENV:-$HOME/.cache/coload/venv-peers}"
py="$venv/bin/python"
check() {
  "$py" -c "import torch, torchvision, nvidia.dali, spdl.io, tensorflow" >/dev/null 2>&1
}
if [ -x "$py" ] && check; then exit 0; fi
[ -x "$py" ] || /usr/bin/python3 -m venv "$venv" || exit 1
wheel=$(ls "$HOME"/.cache/coload/wheels/torch-*-cp311-*.whl 2>/dev/null | head -n 1)
"$venv/bin/pip" install --progress-bar off "${wheel:-torch}" torchvision ||
  echo "setup_venv: torch/torchvision failed to install" >&2
for p in nvidia-dali-cuda130 spdl tensorflow-cpu; do
  "$venv/bin/pip" install --progress-bar off "$p" || echo "setup_venv: $p failed to install" >&2
done
"$py" - <<'PY'
import importlib, importlib.metadata as md
for mod, dist in [("torch", "torch"), ("torchvision", "torchvision"),
                  ("nvidia.dali", "nvidia-dali-cuda130"), ("spdl.io", "spdl"),
                  ("tensorflow", "tensorflow-cpu")]:
    try:
        importlib.import_module(mod)
        print(f"setup_venv: {dist} {md.version(dist)}")
    except Exception as e:
        print(f"setup_venv: {dist} cannot be imported: {e}")
PY
exit 0
