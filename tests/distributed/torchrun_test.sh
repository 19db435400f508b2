#!/bin/sh
# Runs examples/distributed under PyTorch's launcher and checks what rank 0 concluded.
#
#   torchrun_test.sh EXAMPLE NPROC pass|fail [EXAMPLE ARGS...]
#
# pass: torchrun exits 0, rank 0 printed `coverage: exactly once`, and every rank printed its
#       count of loaded samples.
# fail: torchrun exits non-zero and rank 0 printed `coverage: FAILED` (the check can fail).
# Exit 77 (skipped) when the example was not built or /usr/bin/python3 cannot import torch.
#
# The rendezvous runs on the c10d backend at localhost:0: the launcher's store takes a free
# port and the ranks get another free one as MASTER_PORT, so tests may run in parallel
# (torchrun's default static rendezvous would put every run on port 29500).
set -u
example=$1 nproc=$2 expect=$3
shift 3

if [ ! -x "$example" ]; then
  echo "skip: $example is not built (needs -Dexamples=true, libtorch's c10d and libgloo-dev)"
  exit 77
fi
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null; then
  echo "skip: /usr/bin/python3 with torch (Debian's python3-torch) is missing"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
# --redirects 1 --tee 1: Debian's torchrun 1.13 on Python 3.11 cannot parse its own default
# `--redirects 0`; --log_dir keeps the per-rank logs it writes out of /tmp.
timeout 100 /usr/bin/python3 -m torch.distributed.run --nproc_per_node="$nproc" \
  --rdzv_backend=c10d --rdzv_endpoint=localhost:0 --rdzv_id="coload-test-$$" \
  --no_python --redirects 1 --tee 1 --log_dir "$work/logs" \
  "$example" "$@" >"$work/out" 2>&1
rc=$?
cat "$work/out"
echo "torchrun exit status: $rc"

fail() {
  echo "FAIL: $*"
  exit 1
}
case $expect in
  pass)
    [ "$rc" -eq 0 ] || fail "torchrun exited $rc"
    grep -q 'coverage: exactly once' "$work/out" || fail "no 'coverage: exactly once'"
    ranks=$(grep -c "rank [0-9]* of $nproc (local rank [0-9]*): loaded" "$work/out")
    [ "$ranks" -eq "$nproc" ] || fail "$ranks of $nproc ranks reported what they loaded"
    ;;
  fail)
    [ "$rc" -ne 0 ] || fail "torchrun exited 0 although the coverage was broken"
    grep -q 'coverage: FAILED' "$work/out" || fail "no 'coverage: FAILED'"
    ! grep -q 'coverage: exactly once' "$work/out" || fail "'coverage: exactly once' printed"
    ;;
  *)
    fail "expectation must be pass or fail, not '$expect'"
    ;;
esac
echo "ok"
