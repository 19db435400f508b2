#!/usr/bin/env bash
# Run THERE, from the repository root, on a machine with a CUDA GPU, a Python whose torch is a
# CUDA build (PyTorch 2.x), Meson, Ninja and a C++20 compiler, but no Debian -dev packages and no
# network: unpacks tools/gpu/debs (made here by tools/gpu/fetch-debs.sh) into a private prefix,
# configures coload against that Python's libtorch, builds, and runs the device suite, the
# loader's device tests, the vision suite and the H2D benchmark, printing their results.
#
# usage: tools/gpu/run.sh [BUILD_DIR]        (default build-gpu)
#   PYTHON=...        the Python that holds torch (default python3)
#   COLOAD_GPU_DEBS=  the folder of .deb files (default tools/gpu/debs)
#   COLOAD_LIBTORCH=  a libtorch to use instead of that Python's torch package
#   COLOAD_GPU_TARGETS=  ninja targets to build instead of all (for trying the script without a GPU)
# Writes only under BUILD_DIR (the private prefix is BUILD_DIR/prefix). Exit status: non-zero
# when the build or a test fails, when CUDA is unusable (the GPU cases fail rather than skip:
# COLOAD_REQUIRE_CUDA=1), or when a test program has no GPU case to run; the benchmark's
# numbers are printed, not judged.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
debs=${COLOAD_GPU_DEBS:-tools/gpu/debs}
python=${PYTHON:-python3}
mkdir -p "$build"
build=$(cd "$build" && pwd)
prefix=$build/prefix
multiarch=x86_64-linux-gnu

say() { printf '\n== %s\n' "$*"; }

# --- the private prefix: the .deb files unpacked, their .pc files pointed at it ---------------
ls "$debs"/*.deb >/dev/null 2>&1 || { echo "no .deb files in $debs: run tools/gpu/fetch-debs.sh where apt works" >&2; exit 1; }
if [ ! -f "$prefix/.complete" ]; then
  say "unpacking $(ls "$debs"/*.deb | wc -l) packages into $prefix"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix"
    else  # a .deb is an ar archive holding data.tar.*
      (tmp=$(mktemp -d "$build/deb.XXXXXX") && cd "$tmp" && ar x "$deb" && tar xf data.tar.* -C "$prefix" && rm -rf "$tmp")
    fi
  done
  find "$prefix/usr/lib/$multiarch/pkgconfig" "$prefix/usr/share/pkgconfig" -name '*.pc' 2>/dev/null |
    xargs -r sed -i -E "s#^(prefix|exec_prefix|libdir|includedir)=/usr#\1=$prefix/usr#"
  touch "$prefix/.complete"
fi
# zlib1g-dev's libz.so points at the runtime library it does not carry (every machine has
# libz.so.1, in its own folder): point it there, or the linker takes the non-PIC libz.a.
zlib_so=$prefix/usr/lib/$multiarch/libz.so
if [ -L "$zlib_so" ] && [ ! -e "$zlib_so" ]; then
  system_zlib=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p) | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
  if [ -n "$system_zlib" ]; then
    ln -sfn "$system_zlib" "$zlib_so"
    rm -f "$prefix/usr/lib/$multiarch/libz.a"
  fi
fi
export PKG_CONFIG_LIBDIR=$prefix/usr/lib/$multiarch/pkgconfig:$prefix/usr/share/pkgconfig
# NOTE: the multiarch folder too, and first: it holds libjpeg62-turbo's jconfig.h, and the
# machine's own (libjpeg-turbo8's, JPEG_LIB_VERSION 80) would otherwise be found there beside
# our jpeglib.h, so every libjpeg call (the region decoder's) would fail its ABI check at run time.
export CPLUS_INCLUDE_PATH=$prefix/usr/include/$multiarch:$prefix/usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}
export LIBRARY_PATH=$prefix/usr/lib/$multiarch${LIBRARY_PATH:+:$LIBRARY_PATH}
mkdir -p "$build/bin"
if ! command -v pkg-config >/dev/null; then  # the unpacked pkgconf, with its library
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$prefix/usr/lib/$multiarch" \
    "$prefix/usr/bin/pkgconf" > "$build/bin/pkg-config"
  chmod +x "$build/bin/pkg-config"
  export PATH=$build/bin:$PATH
fi

# --- that Python's libtorch, and the CUDA libraries its wheels carry --------------------------
torch_dir=${COLOAD_LIBTORCH:-$("$python" -c 'import torch, os; print(os.path.dirname(torch.__file__))')}
say "libtorch: $torch_dir"
"$python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' ||
  echo "($python cannot import torch)"
# libtorch_cuda finds cuDNN, cuBLAS... through its RUNPATH ($ORIGIN/../../nvidia/*/lib); the
# linker checking libtorch_cuda's needs is told the same folders, so the build links it.
nvidia_libs=$("$python" -c 'import glob, os; site = os.path.dirname("'"$torch_dir"'"); print(":".join(sorted(set(os.path.dirname(p) for p in glob.glob(os.path.join(site, "nvidia", "**", "lib*.so*"), recursive=True)))))')
export LD_LIBRARY_PATH=$prefix/usr/lib/$multiarch${nvidia_libs:+:$nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The CUDA Toolkit for the plugin: /usr/local/cuda or nvcc's, else the runtime from the wheels.
if [ ! -d /usr/local/cuda ] && ! command -v nvcc >/dev/null && [ -z "${CUDA_PATH:-}" ]; then
  rt=$("$python" -c 'import glob, os; site = os.path.dirname("'"$torch_dir"'"); h = glob.glob(os.path.join(site, "nvidia", "**", "include", "cuda_runtime.h"), recursive=True); print(os.path.dirname(os.path.dirname(h[0])) if h else "")')
  if [ -n "$rt" ]; then
    mkdir -p "$build/cuda/lib64"
    ln -sfn "$rt/include" "$build/cuda/include"
    ln -sf "$(ls "$rt"/lib/libcudart.so.* | head -n1)" "$build/cuda/lib64/libcudart.so"
    export CUDA_PATH=$build/cuda
  fi
fi

# --- configure, build, test --------------------------------------------------------------------
if [ ! -f "$build/build.ninja" ]; then
  say "configuring $build"
  meson setup "$build" -Dlibtorch="$torch_dir" -Dcuda=enabled -Dtests=true -Dexamples=true \
    -Dbench=true
  printf '%s' "$CPLUS_INCLUDE_PATH" > "$build/.coload-gpu-include-path"  # nothing built yet
fi
# NOTE: ninja does not see the include path (an environment variable) in its commands: a build
# made under another one (run.sh before the multiarch folder came first compiled libjpeg's ABI
# wrong) is cleaned once, so that every object is compiled under this one.
stamp=$build/.coload-gpu-include-path
if [ -f "$build/build.ninja" ] && [ "$(cat "$stamp" 2>/dev/null)" != "$CPLUS_INCLUDE_PATH" ]; then
  say "the include path changed since the last build: cleaning $build"
  ninja -C "$build" -t clean >/dev/null
fi
printf '%s' "$CPLUS_INCLUDE_PATH" > "$stamp"
say "building"
ninja -C "$build" ${COLOAD_GPU_TARGETS:-}
status=0
# The GPU cases may not skip here: where CUDA is unusable they fail, saying why
# (tests/support/needs.hpp). And each program below must have GPU cases to run: one that has
# none (renamed, filtered out) fails this script rather than passing without touching the GPU.
export COLOAD_REQUIRE_CUDA=1
gpu_cases() {  # PROGRAM [doctest filters...]: how many "GPU: ..." cases it runs
  "$@" --test-case='GPU:*' --count 2>/dev/null |
    sed -n 's/.*unskipped test cases passing the current filters: \([0-9]*\).*/\1/p'
}
for program in "$build/tests/device/device_test" "$build/tests/loader_test" "$build/tests/vision/vision_test"; do
  n=$(gpu_cases "$program" || true)
  if [ "${n:-0}" -gt 0 ]; then
    echo "$program: $n GPU case(s)"
  else
    echo "FAIL: $program has no GPU case to run" >&2
    status=1
  fi
done
say "meson test --suite device"
meson test -C "$build" --no-rebuild --suite device --print-errorlogs --verbose || status=1
say "loader: the device tests (tests/loader/device_loader_test.cpp)"
"$build/tests/loader_test" --source-file='*device_loader_test.cpp' ||
  status=1
say "vision: the image pipeline with pin_memory and device = cuda, and the region decoder as built here (tests/vision/vision_test)"
"$build/tests/vision/vision_test" || status=1
say "tools/bench/device/h2d (coload's device stage)"
"$build/tools/bench/device/h2d" --no-pytorch || status=1
say "tools/bench/device/h2d_pytorch.py (PyTorch's DataLoader(pin_memory=True), $python)"
"$python" tools/bench/device/h2d_pytorch.py || status=1
say "done: $([ $status -eq 0 ] && echo 'all passed' || echo 'FAILURES above')"
exit $status
