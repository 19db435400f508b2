#!/bin/sh
# The Python package's worker-process and thread tests under ASan+UBSan or TSan: coload and the
# extension built with the sanitizer (against Debian's torch, as tools/test builds it), loaded by
# Debian's unsanitized /usr/bin/python3 with the sanitizer's runtime preloaded, and libstdc++
# beside it: ASan resolves its __cxa_throw interceptor when it starts, and python3 itself does
# not link libstdc++, so without it the first C++ throw in a forked worker stopped on ASan's
# CHECK "real___cxa_throw != 0" (session 20).
#
#   python/tests/sanitized.sh address|thread [pytest args...]   (default: the process, leak
#                                                                and loader tests)
#
# Builds build-asan-py or build-tsan-py in the repository (libcoload and the extension only; the
# first time compiles all of coload with the sanitizer), or in COLOAD_SANITIZED_BUILD: a build
# folder configured with the same sanitizer and -Dpython=enabled (CI's ASan stage passes its own,
# so libcoload is compiled once for both). Leak detection is off (Python and torch
# keep memory for good at exit); TSan runs with die_after_fork=0, as forking a process with
# threads is what the process executor does (the child execs nothing and uses only what
# coload's fork hook made safe), and with report_signal_unsafe=0 (Python's signal handler).
# Known under TSan (session 19): every report is a failed batch's exception object, read by the
# consumer's translator and freed later by the driver thread when it drops the consumer's wait
# slot; the order comes from libstdc++'s exception_ptr count, whose atomics TSan does not see
# (libstdc++ is not instrumented): a false positive. The Ctrl-C case hangs under TSan (its
# deferred signal delivery; it passes without), so the thread run leaves it out by default.
set -eu
kind=${1:?usage: sanitized.sh address|thread [pytest args...]}
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
case $kind in
  address) build=${COLOAD_SANITIZED_BUILD:-build-asan-py}; sanitize=address,undefined
           runtime=libasan.so
           export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:halt_on_error=1}
           export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} ;;
  thread)  build=${COLOAD_SANITIZED_BUILD:-build-tsan-py}; sanitize=thread
           runtime=libtsan.so
           export TSAN_OPTIONS=${TSAN_OPTIONS:-die_after_fork=0:report_signal_unsafe=0:halt_on_error=0:second_deadlock_stack=1} ;;
  *) echo "sanitized.sh: address or thread, not $kind" >&2; exit 2 ;;
esac
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Db_sanitize=$sanitize -Db_lundef=false -Doptimization=1 -Ddebug=false \
    -Dtests=false -Dexamples=false -Dbench=false -Dpython=enabled >&2
fi
ninja -C "$build" python/_C.cpython-311-x86_64-linux-gnu.so tools/gen/make_image_folder >&2
root=$(cd "$build" && pwd)
rm -rf "$root/python-package" && mkdir -p "$root/python-package/coload"
ln -s "$repo"/python/coload/* "$root"/python/_C.*.so "$root/python-package/coload/"
ln -s ../lib "$root/python-package/lib"
export COLOAD_MAKE_IMAGE_FOLDER=$root/tools/gen/make_image_folder
if [ $# -eq 0 ]; then
  set -- test_processes.py test_leak.py test_loader.py test_recipe.py test_errors.py
  [ "$kind" = address ] || set -- "$@" -k "not keyboard_interrupt"
fi
cd python/tests
LD_PRELOAD="$(gcc -print-file-name=$runtime) $(gcc -print-file-name=libstdc++.so.6)" PYTHONPATH=$root/python-package \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider --timeout=600 "$@"
