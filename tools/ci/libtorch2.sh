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
# python3-torchvision is installed above: the torchvision comparisons must run here too.
export COLOAD_REQUIRE_REFERENCES=${COLOAD_REQUIRE_REFERENCES:-1}
# Not the subproject consumer (tests/install/meson.build): the first configuration builds it.
meson test -C "$build" --print-errorlogs --no-suite install-subproject "$@"

# The vision suite's torchvision comparisons once more against a current torchvision, whose
# transforms.v2.functional tools/vision/reference.py then runs (Debian's 0.14 above has none):
# torchvision ${COLOAD_TORCHVISION_VERSION:-0.26.0}, torch $version's pair, in the Python
# stage's venv (tools/ci/python.sh installs both there; one made before it listed torchvision
# gets it here, 7 MB). That stage runs after this one, so on a machine where CI never ran it
# the venv is missing: this says so and the next run compares. Only a whole run (no meson test
# arguments) does this; about a minute (each case imports torch once). Left out: the
# TrivialAugmentWide recipe case, whose chains of up to 4 ops carry v2's 1-of-255 differences
# (AutoContrast, Color, Sharpness, bilinear warps) into Solarize's threshold or Equalize's
# histogram, which turn them into larger ones (2-12 of 255 in 9 of its 120 samples with
# torchvision 0.26 and 0.29.2; the same 9 before and after the warps' grids followed torch
# 2.x's arithmetic, so not theirs); each op alone is compared by the case before it. AugMix
# runs here: its nearest case differed by up to 12 of 255 while coload's grids rounded as
# torch 1.13's bmm (torch's own loop) where the torch 2.x wheels' bmm is MKL's sgemm with FMA;
# the warps now follow the linked torch's arithmetic (geometry.cpp, GridForm) and compare
# exactly with 0.26 and 0.29.2.
venv=$cache/venv-torch-$version
if [ "$#" -eq 0 ] && [ -f "$venv/.complete" ]; then
  "$venv/bin/python" -c 'import torchvision' 2>/dev/null ||
    "$venv/bin/pip" install --quiet "torchvision==${COLOAD_TORCHVISION_VERSION:-0.26.0}"
  COLOAD_REFERENCE_PYTHON=$venv/bin/python "$build/tests/vision/vision_test" \
    --test-case='*torchvision*,*F.rotate*,*transforms.v2*' \
    --test-case-exclude='*recipe with TrivialAugmentWide*'
elif [ "$#" -eq 0 ]; then
  echo "libtorch2.sh: no $venv yet (tools/ci/python.sh makes it, after this stage): the" \
    "comparisons with torchvision ${COLOAD_TORCHVISION_VERSION:-0.26.0} run from the next CI run" >&2
fi
