#!/usr/bin/env bash
# CI's Python stage: the coload package built with pip (meson-python over meson.build) against
# the torch ${COLOAD_TORCH_VERSION:-2.11.0} wheel, then its pytest suite (python/tests).
#
# usage: tools/ci/python.sh [pytest args...]
#
# The venv (torch with its nvidia-* wheels, which its libtorch_python needs to import: about
# 4.6 GB) is kept under ${XDG_CACHE_HOME:-~/.cache}/coload and the package's build folder in
# build-python, so a run after the first only rebuilds what changed (the first run downloads ~2.2 GB; the torch
# wheel libtorch2.sh cached is installed from there, not fetched again).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/deps.sh
ensure_packages "${COLOAD_BUILD_PACKAGES[@]}" python3-venv python3-dev
version=${COLOAD_TORCH_VERSION:-2.11.0}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/coload
venv=$cache/venv-torch-$version
if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  wheel=$(ls "$cache/wheels"/torch-"$version"-cp311-*.whl 2>/dev/null | head -n1 || true)
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet "${wheel:-torch==$version}" 'meson-python>=0.13' \
    'packaging>=23.2' pytest pytest-timeout "torchvision==${COLOAD_TORCHVISION_VERSION:-0.26.0}"
  touch "$venv/.complete"
fi
# A persistent build folder in the checkout (ignored by git; .ci/run does not remove it), so that
# a run rebuilds only what changed: about 1 GiB (libcoload's precompiled header is 440 MiB).
build=$PWD/${COLOAD_PYTHON_BUILD:-build-python}
# NOTE: the venv is not activated, so meson-python runs the system's Meson and ninja, as the
# other stages do; pip's own cache is off (the wheel is built into the venv each run).
install() {
  "$venv/bin/pip" install --quiet --no-build-isolation --no-deps --no-cache-dir \
    --config-settings=build-dir="$build" .
}
# NOTE: once, ccache handed this build a precompiled header that GCC then refused ("one or more
# PCH files were found, but they were invalid"), failing every object of libcoload; compiling
# again without taking results from ccache cured it. A real error fails both tries.
if ! install; then
  echo "python.sh: the build failed; once more without ccache's results (CCACHE_RECACHE)" >&2
  rm -f "$build"/lib/libcoload.a.p/*.gch
  CCACHE_RECACHE=1 install
fi
export COLOAD_MAKE_IMAGE_FOLDER=$build/tools/gen/make_image_folder
cd python/tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider --timeout=300 "$@"
