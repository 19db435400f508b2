#!/usr/bin/env python3
"""The README's first code block is examples/readme_first.cpp between its [readme] markers,
word for word, so the snippet a reader copies is the one that is built (examples/readme_first)
and run (this test runs it and checks what it prints).

usage: readme_snippets.py README EXAMPLE_SOURCE EXAMPLE_BINARY
"""
import os
import re
import subprocess
import sys


def main() -> int:
    readme, source, binary = sys.argv[1:4]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    region = text.split("// [readme]\n", 1)[1].split("// [/readme]", 1)[0]
    with open(readme, encoding="utf-8") as f:
        blocks = re.findall(r"```cpp\n(.*?)```\n", f.read(), flags=re.S)
    if not blocks or blocks[0] != region:
        print(f"README's first ```cpp block differs from {source}'s [readme] region; "
              "copy the region into the README", file=sys.stderr)
        return 1
    if not os.access(binary, os.X_OK):
        print(f"skipped running: {binary} not built")
        return 77
    run = subprocess.run([binary], capture_output=True, text=True, timeout=240)
    print(run.stdout, run.stderr)
    if run.returncode != 0 or run.stdout.strip() != "3000 samples in 3 epochs":
        print(f"{binary}: exit {run.returncode}, printed {run.stdout!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
