#!/usr/bin/env python3
"""The benchmarks' and tools' command lines (CLI11): `--help` exits 0 and lists every flag the
scripts, tests and README use; an unknown flag, a misspelt one and a bad value exit 2 with
stderr naming the flag, before any work is done.

usage: tools_cli_test.py BUILD_ROOT
Programs that are not built (-Dbench=false) are skipped; the test skips (77) if none is.
"""
import os
import subprocess
import sys
import tempfile

# program (under the build root), positional arguments, the flags --help must list,
# a misspelt flag, and a flag with a value it must refuse.
PROGRAMS = [
    ("tools/bench/io/io", [],
     ["--dir", "--files", "--size", "--repeat", "--queue-depth", "--wq-workers", "--json", "--only"],
     "--file", ["--only", "uring2"]),
    ("tools/bench/device/h2d", [],
     ["--batches", "--batch-size", "--compute-ms", "--device", "--json", "--no-pytorch"],
     "--batch", ["--batches", "many"]),
    ("tools/bench/vision/folder_index", [],
     ["--dir", "--classes", "--per-class", "--repeat", "--threads", "--json", "--no-torchvision"],
     "--per-classes", ["--classes", "-1"]),
    ("tools/bench/vision/image_pipeline", ["/nonexistent"],
     ["--epochs", "--json", "--skip-pytorch", "--breakdown", "--executor", "--metrics",
      "--workers", "--skip-decode-only"],
     "--epoch", ["--executor", "fork"]),
    ("tools/bench/shards/shards", ["/nonexistent", "/nonexistent"],
     ["--workers", "--batch-size", "--json", "--no-pytorch"],
     "--worker", ["--workers", "two"]),
    ("tools/bench/peers/coload_peer", ["/nonexistent"],
     ["--mode", "--epochs", "--workers", "--batch-size", "--prefetch-factor", "--recipe"],
     "--modes", ["--mode", "fork"]),
    ("tools/bench/vision/recipe_ops", ["/nonexistent"], ["--limit", "--rounds"],
     "--limits", ["--rounds", "0"]),
    ("tools/bench/overhead", [],
     ["--epochs", "--samples", "--json", "--no-pytorch", "--only", "--background-load",
      "--metrics", "--workers"],
     "--sample", ["--epochs", "0"]),
]


def run(args, cwd):
    # In a scratch folder and with a time limit, so that a flag taken for valid cannot leave
    # files in the tree or hang the test.
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=cwd)


def main() -> int:
    build = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as scratch:
        return check(build, scratch)


def check(build: str, scratch: str) -> int:
    failures, checked = [], 0
    for path, positional, flags, misspelt, bad_value in PROGRAMS:
        exe = os.path.join(build, path)
        name = os.path.basename(path)
        if not os.access(exe, os.X_OK):
            print(f"{name}: not built, skipped")
            continue
        checked += 1
        help_run = run([exe, "--help"], scratch)
        if help_run.returncode != 0:
            failures.append(f"{name} --help: exit {help_run.returncode}, expected 0")
        # a flag is listed when it appears as a word of the help (CLI11 writes `--flag TYPE=default`, `--flag{false}`)
        words = help_run.stdout.replace(",", " ").split()
        missing = [f for f in flags
                   if not any(w == f or w.startswith((f + "=", f + "{")) for w in words)]
        if missing:
            failures.append(f"{name} --help does not list {missing}:\n{help_run.stdout}")
        for args, named in ((positional + ["--bogus"], "--bogus"),
                            (positional + [misspelt, "1"], misspelt),
                            (positional + bad_value, bad_value[0])):
            bad = run([exe] + args, scratch)
            if bad.returncode != 2 or named not in bad.stderr:
                failures.append(f"{name} {' '.join(args)}: exit {bad.returncode} (expected 2), "
                                f"stderr {bad.stderr!r} does not name {named}")
        print(f"{name}: --help lists {len(flags)} flags; --bogus, {misspelt} and "
              f"{' '.join(bad_value)} refused")
    for f in failures:
        print(f, file=sys.stderr)
    if checked == 0:
        print("skipped: no benchmark built")
        return 77
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
