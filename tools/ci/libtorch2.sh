#!/usr/bin/env bash
# CI's second configuration: coload built and tested against libtorch 2.x, taken from the torch
# wheel on PyPI (its torch/lib and torch/include are a libtorch), through -Dlibtorch=PATH.
#
# usage: tools/ci/libtorch2.sh [BUILD_DIR] [extra meson test args...]
#   BUILD_DIR defaults to build-libtorch2. The wheel (${COLOAD_TORCH_VERSION:-2.11.0}, CPython
#   3.11, manylinux_2_28 x86_64: the same libtorch for any local Python) is downloaded once into
#   ${XDG_CACHE_HOME:-~/.cache}/coload and unpacked there (lib, include, share only).
#
# The wheel is installed without its dependencies (--no-deps): its libtorch_cuda cannot load
# without the nvidia-* wheels, so Meson links libtorch as a CPU one (the summary says
# "libtorch cuda: False"), and the CUDA plugin is still compiled and linked against the toolkit.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/deps.sh
ensure_packages "${COLOAD_BUILD_PACKAGES[@]}" python3-torch python3-torchvision unzip
# The vision tests compare with torchvision (tools/vision/reference.py): here, where it is
# installed, its absence is a failure, not a skip.
export COLOAD_REQUIRE_TORCHVISION=1
version=${COLOAD_TORCH_VERSION:-2.11.0}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/coload
libtorch=$cache/torch-$version/torch
build=${1:-build-libtorch2}
shift || true

if [ ! -f "$libtorch/.complete" ]; then
  mkdir -p "$cache/wheels"
  wheel=$(ls "$cache/wheels"/torch-"$version"-cp311-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    pip=(python3 -m pip)
    "${pip[@]}" --version >/dev/null 2>&1 || pip=(pip3)
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
      --implementation cp --platform manylinux_2_28_x86_64 -d "$cache/wheels" "torch==$version"
    wheel=$(ls "$cache/wheels"/torch-"$version"-cp311-*.whl | head -n1)
  fi
  rm -rf "$cache/torch-$version"
  unzip -q "$wheel" 'torch/lib/*' 'torch/include/*' 'torch/share/*' -d "$cache/torch-$version"
  touch "$libtorch/.complete"
fi

# The library and its tests only: the examples and benchmarks are libtorch's users rather than
# coload's, and the first configuration builds and runs them (their tests skip here, 77). This
# keeps the whole of CI under 30 minutes on the 2-core machine (they were a quarter of this
# build).
[ -f "$build/build.ninja" ] || meson setup "$build" -Dlibtorch="$libtorch" -Dtests=true \
  -Dexamples=false -Dbench=false
ninja -C "$build" -j2
meson test -C "$build" --print-errorlogs "$@"
