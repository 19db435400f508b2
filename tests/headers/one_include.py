#!/usr/bin/env python3
"""coload/coload.hpp is "the one include": every public header must be reached from it, through
its own includes or theirs. Headers under a detail/ folder are the modules' insides and need
not be.

usage: one_include.py INCLUDE_DIR   (the folder holding coload/)
"""
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"(coload/[^"]+)"', re.MULTILINE)


def main() -> int:
    root = Path(sys.argv[1])
    public = {p.relative_to(root).as_posix() for p in (root / "coload").rglob("*.hpp")
              if "detail" not in p.relative_to(root).parts}
    seen, todo = set(), ["coload/coload.hpp"]
    while todo:
        header = todo.pop()
        if header in seen or not (root / header).is_file():
            continue  # config.hpp is generated in the build folder
        seen.add(header)
        todo += INCLUDE.findall((root / header).read_text(encoding="utf-8"))
    missing = sorted(public - seen)
    if missing:
        print("coload/coload.hpp does not include (directly or through another header):",
              file=sys.stderr)
        for m in missing:
            print(f"  {m}", file=sys.stderr)
        return 1
    print(f"coload/coload.hpp reaches all {len(public)} public headers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
