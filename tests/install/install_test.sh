#!/bin/sh
# Installs coload into a temporary prefix and builds and runs one of its consumers against it.
#
#   install_test.sh BUILD_DIR SOURCE_DIR PREFIX LIBDIR LIBTORCH cmake|pkg-config|subproject
#
# cmake:      a CMake project with find_package(coload) (tests/install/consumer/cmake)
# pkg-config: a Makefile using `pkg-config coload` (consumer/make)
# subproject: a Meson project with coload's source tree as subprojects/coload (consumer/meson)
# Each consumer is consumer/main.cpp, which checks the batches it loads. Everything is written
# under BUILD_DIR/install-test-KIND and removed afterwards.
set -eu
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) prefix=$3 libdir=$4 libtorch=$5 kind=$6
consumers=$src/tests/install/consumer
work=$build/install-test-$kind
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT INT TERM

root=$work/root$prefix  # DESTDIR keeps the real prefix (/usr/local) untouched
if [ "$kind" != subproject ]; then
  meson install -C "$build" --no-rebuild --quiet --destdir "$work/root" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; exit 1; }
fi

case $kind in
cmake)
  cp -r "$consumers/cmake" "$work/app"
  cp "$consumers/main.cpp" "$work/app/"
  cmake -S "$work/app" -B "$work/app/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$root"
  cmake --build "$work/app/build"
  exe=$work/app/build/consumer
  ;;
pkg-config)
  cp -r "$consumers/make" "$work/app"
  cp "$consumers/main.cpp" "$work/app/"
  # --define-variable: coload.pc names the prefix it was configured with, not DESTDIR's.
  PKG_CONFIG_PATH=$root/$libdir/pkgconfig make -C "$work/app" \
    PKG_CONFIG="pkg-config --define-variable=prefix=$root"
  exe=$work/app/consumer
  ;;
subproject)
  cp -r "$consumers/meson" "$work/app"
  cp "$consumers/main.cpp" "$work/app/"
  # A copy of coload's sources, without build folders (what a wrap or a git submodule gives).
  mkdir -p "$work/app/subprojects/coload"
  (cd "$src" && tar cf - --exclude='./build*' --exclude=./.git --exclude='./subprojects/*/' .) |
    tar xf - -C "$work/app/subprojects/coload"
  # Not the CUDA plugin: the consumer needs none, and it saves a compile.
  opts="-Dcoload:cuda=disabled"
  [ -n "$libtorch" ] && opts="$opts -Dcoload:libtorch=$libtorch"
  meson setup "$work/app/build" "$work/app" $opts
  ninja -C "$work/app/build" -j2
  exe=$work/app/build/consumer
  ;;
*)
  echo "unknown consumer kind: $kind" >&2
  exit 2
  ;;
esac

# The consumer runs without LD_LIBRARY_PATH: its rpaths must find coload and libtorch.
env -u LD_LIBRARY_PATH "$exe"
