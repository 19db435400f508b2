#!/usr/bin/env python3
"""Fails when a module includes a module below it in the table of docs/architecture.md.

Reads every `#include "coload/<module>/..."` in include/coload/ and lib/. A header under
include/coload/<module>/ and a source under lib/<module>/ belong to <module>; each may include
its own module and the modules above it, never one below. The umbrella coload/coload.hpp and
the precompiled headers in lib/pch/ include everything and are exempt.

usage: include_direction.py SOURCE_ROOT
"""

import pathlib
import re
import sys

# The modules from the bottom (depended on by all) to the top, as docs/architecture.md's
# Modules table lists them. A new module goes here and there at once.
ORDER = ["core", "coro", "sampler", "dataset", "collate", "io", "shards", "exec", "device",
         "vision", "loader"]
# Headers that belong to no module: the build's configuration, below everything.
BELOW_ALL = {"coload/config.hpp"}
EXEMPT = {"include/coload/coload.hpp"}
EXEMPT_DIRS = ("lib/pch/",)

INCLUDE = re.compile(r'^\s*#\s*include\s*"(coload/[^"]+)"')
SUFFIXES = {".hpp", ".h", ".cpp", ".cc", ".ipp", ".inl"}


def module_of_file(rel):
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) > 3:
        return parts[2]
    if parts[0] == "lib" and len(parts) > 2:
        return parts[1]
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    rank = {m: i for i, m in enumerate(ORDER)}
    problems = []
    checked = 0
    for top in ("include/coload", "lib"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            if rel in EXEMPT or rel.startswith(EXEMPT_DIRS):
                continue
            here = module_of_file(rel)
            if here is None:
                problems.append(f"{rel}: belongs to no module (put it in a module's folder)")
                continue
            if here not in rank:
                problems.append(f"{rel}: module '{here}' is not in the module table")
                continue
            for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                checked += 1
                target = m.group(1)
                if target in BELOW_ALL:
                    continue
                parts = target.split("/")
                there = parts[1] if len(parts) > 2 else None
                if there is None or there not in rank:
                    problems.append(f"{rel}:{lineno}: includes {target}, which is in no module "
                                    f"of the table")
                elif rank[there] > rank[here]:
                    problems.append(f"{rel}:{lineno}: module '{here}' includes {target} from "
                                    f"module '{there}', which is below it ("
                                    + " -> ".join(ORDER) + ")")
    for p in problems:
        print(p)
    print(f"{checked} includes checked, {len(problems)} against the module order")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
