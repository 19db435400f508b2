#!/usr/bin/env python3
"""Compiles one snippet that must not compile, and checks that what the compiler says first is
what a user needs: every `// expect: TEXT` line of the snippet must appear, as written, within
the first 10 lines of the compiler's output.

usage: check.py SNIPPET COMPILER [ARGS...]   (ARGS: include paths, -std, ...)
"""
import subprocess
import sys

FIRST_LINES = 10


def main() -> int:
    snippet, command = sys.argv[1], sys.argv[2:]
    with open(snippet, encoding="utf-8") as f:
        expected = [line.split("// expect:", 1)[1].strip()
                    for line in f if line.lstrip().startswith("// expect:")]
    if not expected:
        print(f"{snippet}: no `// expect:` line", file=sys.stderr)
        return 2
    run = subprocess.run(command + ["-fsyntax-only", "-fdiagnostics-color=never", snippet],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = run.stdout
    if run.returncode == 0:
        print(f"{snippet} compiled, but must not", file=sys.stderr)
        return 1
    head = "\n".join(output.splitlines()[:FIRST_LINES])
    missing = [e for e in expected if e not in head]
    if missing:
        print(f"{snippet}: the compiler's first {FIRST_LINES} lines lack:", file=sys.stderr)
        for m in missing:
            print(f"  {m!r}", file=sys.stderr)
        print("--- first lines of the compiler's output ---", file=sys.stderr)
        print(head, file=sys.stderr)
        return 1
    print(f"{snippet}: failed to compile as expected; first lines:\n{head}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
