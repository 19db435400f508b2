#!/bin/sh
# The training-loop bench in one command: builds the coload package against the peers venv's
# torch (2.15 today) if it is not built yet, then runs train_loop.py with that interpreter for
# both sides, so the model, torch and the interpreter are the same on both and only the loader
# differs.
#
#   tools/bench/python/run.sh [train_loop.py args...]     e.g. --rounds 3 --epochs 2
#
# Environment:
#   COLOAD_PEERS_VENV   the venv (default ~/.cache/coload/venv-peers; tools/bench/peers/
#                       setup_venv.sh makes it if missing: torch, torchvision and the other peers)
#   COLOAD_BENCH_BUILD  the package's build folder (default build-torch215 in the repository:
#                       libcoload static inside the extension, no suites; about 6 CPU minutes
#                       the first time, nothing after)
#   COLOAD_BUILD        coload's main build folder, for the generated folder's tool (default
#                       build; tools/gen/make_image_folder is built there if missing)
set -eu
repo=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$repo"
venv=${COLOAD_PEERS_VENV:-$HOME/.cache/coload/venv-peers}
build=${COLOAD_BENCH_BUILD:-$repo/build-torch215}
main_build=${COLOAD_BUILD:-$repo/build}
py=$venv/bin/python

if ! "$py" -c "import torch, torchvision" >/dev/null 2>&1; then
  echo "run.sh: making $venv (tools/bench/peers/setup_venv.sh)" >&2
  COLOAD_PEERS_VENV=$venv sh tools/bench/peers/setup_venv.sh
fi
if [ ! -f "$build/build.ninja" ]; then
  # NOTE: Meson finds Python (and so torch: meson.build asks that interpreter where torch is)
  # through the native file's `python`; the settings are pyproject.toml's for `pip install`.
  mkdir -p "$build"
  printf "[binaries]\npython = '%s'\n" "$py" >"$build/venv-python.ini"
  meson setup "$build" --native-file "$build/venv-python.ini" -Dpython=enabled \
    -Ddefault_library=static -Db_ndebug=false -Dcuda=disabled -Dtests=false \
    -Dexamples=false -Dbench=false >"$build/setup.log" ||
    { cat "$build/setup.log" >&2; exit 1; }
fi
ninja -C "$build" >&2

# The package as the build has it: the sources beside the extension (no install step).
pkg=$build/python-package/coload
rm -rf "$pkg" && mkdir -p "$pkg"
ln -s "$repo"/python/coload/* "$build"/python/_C.*.so "$pkg/"

PYTHONPATH=$build/python-package exec "$py" tools/bench/python/train_loop.py --build "$main_build" "$@"
