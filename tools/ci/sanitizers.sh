#!/usr/bin/env bash
# CI's sanitizer configuration: coload built with ASan+UBSan (UBSan halting on the first error)
# and the loader, exec, io, vision and hardening suites run under it.
#
# usage: tools/ci/sanitizers.sh [BUILD_DIR] [extra meson test args...]
#   BUILD_DIR defaults to build-asan. Only the five suites' executables (and the library) are
#   built, with at most two jobs. Measured on the 2-core machine while other builds ran (load
#   average about 8): 41 min to build from a cold ccache, 68 s to run the suites. On an idle
#   machine the build should take a quarter to a half of that; with a warm ccache, a few minutes.
#   Session 44, the library from ccache and every test compiled: 8m52s for build and suites
#   with the tests at -O0, where CI's stage at -O1 took 27 minutes.
#
# NOTE: leak detection is off. libtorch (not built with ASan) keeps allocations for the
# process's life (its allocator caches, thread pools, registries), which LeakSanitizer reports
# as leaks at exit; coload's own lifetimes are checked by the tests (counted objects, fds,
# threads, children) instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/deps.sh
# pybind11-dev and python3-torch: the Python package, built here too (.ci/run runs its
# sanitized tests in this folder after these suites).
ensure_packages "${COLOAD_BUILD_PACKAGES[@]}" pybind11-dev python3-torch
build=${1:-build-asan}
shift || true

# -O1 without debug info: what ASan recommends, and less compile time than the default -O3
# (the tests compile at -O0: tests/meson.build says why).
[ -f "$build/build.ninja" ] || meson setup "$build" -Db_sanitize=address,undefined \
  -Db_lundef=false -Doptimization=1 -Ddebug=false -Dtests=true -Dexamples=false -Dbench=false \
  -Dpython=enabled
# A folder configured before the Python package was built here gets it.
[ "$(meson_option "$build" python)" = enabled ] ||
  meson configure "$build" -Dpython=enabled >/dev/null
ninja -C "$build" -j2 tests/loader_test tests/exec_test tests/io/io_test tests/vision/vision_test \
  tests/hardening/hardening_test tests/shards/shards_remote_test
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
meson test -C "$build" --no-rebuild --print-errorlogs --suite loader --suite exec --suite io \
  --suite vision --suite hardening --timeout-multiplier 3 "$@"
# Shards by URL: the HTTP client's driver thread, paused and resumed transfers, retries (by
# name: the rest of the shards suite is not built here).
meson test -C "$build" --no-rebuild --print-errorlogs --timeout-multiplier 3 "shards by URL"
