#!/usr/bin/env bash
# CI's ThreadSanitizer configuration: coload built with -fsanitize=thread and every suite whose
# code runs on more than one thread run under it (coroutines, collate, datasets, executors,
# the loader, io_uring and the HTTP client, shards local and by URL, vision's shared JPEG
# checkpoint table, hardening).
#
# usage: tools/ci/tsan.sh [BUILD_DIR] [extra meson test args...]
#   BUILD_DIR defaults to build-tsan. Measured on the 2-core machine (session 26): the suites
#   take 3.5 minutes (the vision suite 3 of them); the build a few more with a warm ccache.
#   Session 44 (tests at -O0, vision's threaded cases only): 7.5 minutes for build and suites,
#   vision 2.7 of them.
#
# Process workers: TSan cannot start threads in a child forked from a multi-threaded process
# (it exits 66, "starting new threads after multi-threaded fork is not supported"), so the cases
# that fork a worker which then starts threads leave process workers out under TSan
# (`__SANITIZE_THREAD__`); the ASan stage and the plain build run them.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/deps.sh
ensure_packages "${COLOAD_BUILD_PACKAGES[@]}"
build=${1:-build-tsan}
shift || true

# -O1 without debug info, as the ASan stage: less compile time, and TSan's reports keep their
# function names (the tests themselves compile at -O0: tests/meson.build).
[ -f "$build/build.ninja" ] || meson setup "$build" -Db_sanitize=thread -Db_lundef=false \
  -Doptimization=1 -Ddebug=false -Dtests=true -Dexamples=false -Dbench=false -Dpython=disabled
# Only the nine suites' executables (and the library), as the ASan stage.
ninja -C "$build" -j2 tests/coro_test tests/collate_test tests/dataset_test tests/exec_test \
  tests/loader_test tests/io/io_test tests/shards/shards_test tests/shards/shards_remote_test \
  tests/vision/vision_test tests/hardening/hardening_test
# A report makes the test fail (exit 66) after the whole run, so one run shows every race.
export TSAN_OPTIONS=${TSAN_OPTIONS:-second_deadlock_stack=1}
run() { meson test -C "$build" --no-rebuild --print-errorlogs --timeout-multiplier 6 "$@"; }
suites=(--suite coro --suite collate --suite dataset --suite exec --suite loader --suite io
        --suite shards --suite hardening)
if [ "$#" -gt 0 ]; then
  run "${suites[@]}" --suite vision "$@"
  exit
fi
rc=0
run "${suites[@]}" || rc=$?
# Vision: the cases of the files whose code runs on more than one thread (the folder scan's
# pool, the loader's workers, the shared checkpoint table). The decode, transform and
# augmentation cases run one thread each: 14 of the suite's 34 s in the plain build, which
# took 4.5 minutes under TSan (the ASan stage and the plain build run them).
single='*decode_test.cpp,*transforms_test.cpp,*augment_test.cpp'
run --suite vision --test-args=--source-file-exclude="$single" || rc=$?
exit "$rc"
