#!/usr/bin/env python3
"""Fails when a module includes a module below it in the table of docs/architecture.md.

Reads every `#include "coload/<module>/..."` and `#include <coload/<module>/...>` in
include/coload/ and lib/. A header under
include/coload/<module>/ and a source under lib/<module>/ belong to <module>; each may include
its own module and the modules above it, never one below. The umbrella coload/coload.hpp and
the precompiled headers in lib/pch/ include everything and are exempt.

usage: include_direction.py SOURCE_ROOT
       include_direction.py --self-test   (plants violations in a scratch tree, in both
                                           spellings, and fails unless each is reported)
"""

import pathlib
import re
import sys
import tempfile

# The modules from the bottom (depended on by all) to the top, as docs/architecture.md's
# Modules table lists them. A new module goes here and there at once.
ORDER = ["core", "coro", "sampler", "dataset", "collate", "io", "shards", "exec", "device",
         "vision", "loader"]
# Headers that belong to no module: the build's configuration, below everything.
BELOW_ALL = {"coload/config.hpp"}
EXEMPT = {"include/coload/coload.hpp"}
EXEMPT_DIRS = ("lib/pch/",)

INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"(coload/[^"]+)"|<(coload/[^>]+)>)')
SUFFIXES = {".hpp", ".h", ".cpp", ".cc", ".ipp", ".inl"}


def module_of_file(rel):
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) > 3:
        return parts[2]
    if parts[0] == "lib" and len(parts) > 2:
        return parts[1]
    return None


def check_tree(root):
    """(includes checked, problems) for the tree at `root`."""
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
                target = m.group(1) or m.group(2)
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
    return checked, problems


def self_test():
    """Plants a tree where core includes loader in both spellings (and allowed includes beside
    them); the check must name exactly the two planted lines."""
    with tempfile.TemporaryDirectory() as scratch:
        root = pathlib.Path(scratch)
        files = {
            "include/coload/core/planted.hpp": '#include "coload/core/index.hpp"\n'
                                               '#include "coload/loader/data_loader.hpp"\n',
            "lib/core/planted.cpp": "#include <coload/core/planted.hpp>\n"
                                    "#include <coload/loader/options.hpp>\n",
            "include/coload/loader/fine.hpp": "#include <coload/core/index.hpp>\n"
                                              '#include "coload/config.hpp"\n',
        }
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        checked, problems = check_tree(root)
    expected = ["include/coload/core/planted.hpp:2: module 'core' includes "
                "coload/loader/data_loader.hpp",
                "lib/core/planted.cpp:2: module 'core' includes coload/loader/options.hpp"]
    failures = []
    if checked != 6:
        failures.append(f"{checked} includes read in the planted tree, not 6")
    if len(problems) != len(expected) or not all(
            p.startswith(e) for p, e in zip(sorted(problems), expected)):
        failures.append("the planted violations were not reported as expected; reported:\n  "
                        + "\n  ".join(problems or ["(nothing)"]))
    for f in failures:
        print(f"self-test: {f}")
    print("self-test: " + ("failed" if failures else
                           "both planted violations (quotes and angle brackets) reported"))
    return 1 if failures else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    checked, problems = check_tree(root)
    for p in problems:
        print(p)
    print(f"{checked} includes checked, {len(problems)} against the module order")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
