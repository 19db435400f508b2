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
#
# The installed tree must be relocatable: cmake and pkg-config install into one prefix, move the
# tree to another path (another depth too) and build from there, with nothing left at the
# first. The cmake kind also hides Asio's header and requires find_package(coload) to fail,
# naming it.
set -eu
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) prefix=$3 libdir=$4 libtorch=$5 kind=$6
consumers=$src/tests/install/consumer
work=$build/install-test-$kind
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT INT TERM

if [ "$kind" != subproject ]; then
  # DESTDIR keeps the real prefix (/usr/local) untouched; the tree is then moved away from it.
  meson install -C "$build" --no-rebuild --quiet --destdir "$work/installed" \
    >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
  root=$work/moved/elsewhere/coload
  mkdir -p "$(dirname "$root")"
  mv "$work/installed$prefix" "$root"
  rm -rf "$work/installed"
fi

case $kind in
cmake)
  cp -r "$consumers/cmake" "$work/app"
  cp "$consumers/main.cpp" "$work/app/"
  # Without Asio's header, find_package(coload) must fail and say what is missing. CMake's
  # find_path skips the folders in CMAKE_IGNORE_PATH: here the one the compiler takes asio.hpp
  # from.
  asio_dir=$(printf '#include <asio.hpp>\n' | ${CXX:-c++} -x c++ -std=c++20 -M - |
             tr ' \\' '\n\n' | sed -n 's,/asio\.hpp$,,p' | head -n1)
  [ -n "$asio_dir" ] || { echo "install test: the compiler finds no asio.hpp" >&2; exit 1; }
  if cmake -S "$work/app" -B "$work/no-asio" -G Ninja -DCMAKE_PREFIX_PATH="$root" \
       -DCMAKE_IGNORE_PATH="$asio_dir" >"$work/no-asio.log" 2>&1; then
    echo "install test: find_package(coload) succeeded with $asio_dir/asio.hpp hidden" >&2
    exit 1
  fi
  said=$(tr -s ' \n' '  ' <"$work/no-asio.log")  # CMake wraps the package's message
  case $said in
  *"asio.hpp was not found"*"install libasio-dev"*) ;;
  *)
    echo "install test: without Asio, cmake failed without naming it:" >&2
    cat "$work/no-asio.log" >&2; exit 1 ;;
  esac
  echo "install test: with $asio_dir ignored, find_package(coload) names the missing asio.hpp"

  cmake -S "$work/app" -B "$work/app/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$root"
  # The package found must be the moved one (not one installed on the machine).
  found=$(sed -n 's/^coload_DIR:[A-Z]*=//p' "$work/app/build/CMakeCache.txt")
  case $found in
  "$root"/*) ;;
  *) echo "install test: cmake found coload in '$found', not under $root" >&2; exit 1 ;;
  esac
  cmake --build "$work/app/build"
  exe=$work/app/build/consumer
  ;;
pkg-config)
  cp -r "$consumers/make" "$work/app"
  cp "$consumers/main.cpp" "$work/app/"
  export PKG_CONFIG_PATH=$root/$libdir/pkgconfig
  # coload.pc's prefix is relative to its own folder, so it is the moved tree, as found.
  pc_prefix=$(pkg-config --variable=prefix coload)
  [ "$(cd "$pc_prefix" 2>/dev/null && pwd -P)" = "$(cd "$root" && pwd -P)" ] ||
    { echo "install test: coload.pc's prefix is '$pc_prefix', not the moved $root" >&2; exit 1; }
  make -C "$work/app"
  exe=$work/app/consumer
  ;;
subproject)
  cp -r "$consumers/meson" "$work/app"
  cp "$consumers/main.cpp" "$work/app/"
  # A copy of coload's sources, without build folders (what a wrap or a git submodule gives).
  mkdir -p "$work/app/subprojects/coload"
  (cd "$src" && tar cf - --exclude='./build*' --exclude=./.git --exclude='./subprojects/*/' .) |
    tar xf - -C "$work/app/subprojects/coload"
  # Not the CUDA plugin: the consumer needs none, and it saves a compile. buildtype plain (no
  # -g): the consumer's default, debug, wrote libtorch's debug info into every object of
  # libcoload (2m03s alone here, 5.5 minutes in CI's first stage; 1m32s without).
  opts="-Dcoload:cuda=disabled --buildtype=plain"
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
