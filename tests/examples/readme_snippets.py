#!/usr/bin/env python3
"""The README's C++ code blocks are regions of example programs, word for word, so the snippet a
reader copies is the one that is built (examples/readme_*) and run (here).

A region of an example's source runs from a line `// [readme:NAME]` to a line `// [/readme:NAME]`
(the marker lines themselves excluded). In the README, the line just before a ```cpp block names
the region the block must equal:

    <!-- snippet: examples/readme_first.cpp [readme:dataset] -->

(an HTML comment, so GitHub shows nothing; the path is relative to the README's folder). This
test fails when a ```cpp block of the README has no such line, when a block differs from its
region, when a region of SOURCE has no block in the README or a marker names a region that
SOURCE does not have. Then it runs BINARY (with a small image folder made by
--make-image-folder as its argument, when given) and requires exactly the --expect lines on
its stdout.

usage: readme_snippets.py --readme README --source SOURCE --binary BINARY
                          --expect LINE [--expect LINE...] [--make-image-folder GENERATOR]
Exit status: 0 passed, 1 failed, 77 skipped (the texts match but BINARY or GENERATOR is not
built).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

MARKER = re.compile(r"<!-- snippet: (\S+) \[readme:([\w-]+)\] -->")
REGION_START = re.compile(r"// \[readme:([\w-]+)\]")
REGION_END = re.compile(r"// \[/readme:([\w-]+)\]")


class Failure(Exception):
    """A check failed; the message says which and what to do."""


def regions_of(source):
    """The source's regions, by name: the text between each marker pair, every line kept."""
    with open(source, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    regions, name, body = {}, None, []
    for number, line in enumerate(lines, 1):
        bare = line.rstrip("\n")
        start, end = REGION_START.fullmatch(bare), REGION_END.fullmatch(bare)
        if start:
            if name is not None:
                raise Failure(f"{source}:{number}: region {start.group(1)!r} starts inside "
                              f"region {name!r}")
            if start.group(1) in regions:
                raise Failure(f"{source}:{number}: region {start.group(1)!r} appears twice")
            name, body = start.group(1), []
        elif end:
            if end.group(1) != name:
                raise Failure(f"{source}:{number}: end of region {end.group(1)!r}, but the open "
                              f"region is {name!r}")
            regions[name], name = "".join(body), None
        elif name is not None:
            body.append(line)
    if name is not None:
        raise Failure(f"{source}: region {name!r} has no end marker // [/readme:{name}]")
    if not regions:
        raise Failure(f"{source}: no // [readme:NAME] region")
    return regions


def cpp_blocks_of(readme):
    """Every ```cpp block of the README: (line of its fence, marker (path, name) or None, text)."""
    with open(readme, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    blocks, i = [], 0
    while i < len(lines):
        fence = lines[i].rstrip("\n")
        if not fence.startswith("```"):
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip("\n") != "```":
            end += 1
        if end == len(lines):
            raise Failure(f"{readme}:{i + 1}: a code block with no closing ```")
        if fence == "```cpp":
            marker = MARKER.fullmatch(lines[i - 1].rstrip("\n")) if i > 0 else None
            blocks.append((i + 1, marker.groups() if marker else None, "".join(lines[i + 1:end])))
        i = end + 1
    return blocks


def check_texts(readme, source):
    regions = regions_of(source)
    readme_dir = os.path.dirname(os.path.abspath(readme))
    source_path = os.path.realpath(source)
    shown = set()
    for line, marker, text in cpp_blocks_of(readme):
        if marker is None:
            raise Failure(f"{readme}:{line}: this ```cpp block has no `<!-- snippet: FILE "
                          "[readme:NAME] -->` line before it; every C++ block of the README is a "
                          "region of an example that is built and run")
        path, name = marker
        target = os.path.join(readme_dir, path)
        if not os.path.isfile(target):
            raise Failure(f"{readme}:{line}: the marker names {path}, which does not exist")
        if os.path.realpath(target) != source_path:
            continue  # another example's block: its own test checks it
        if name not in regions:
            raise Failure(f"{readme}:{line}: {source} has no region [readme:{name}]")
        if name in shown:
            raise Failure(f"{readme}:{line}: region [readme:{name}] is shown twice")
        shown.add(name)
        if text != regions[name]:
            raise Failure(f"{readme}:{line}: the ```cpp block differs from {source}'s region "
                          f"[readme:{name}]; copy the region into the README\n"
                          + first_difference(regions[name], text))
    missing = sorted(set(regions) - shown)
    if missing:
        raise Failure(f"{source}'s regions {missing} are not in {readme}: add a ```cpp block "
                      "for each, with its marker line")


def first_difference(region, block):
    want, got = region.splitlines(), block.splitlines()
    for n, (a, b) in enumerate(zip(want, got), 1):
        if a != b:
            return f"  line {n} of the region: {a!r}\n  line {n} of the README:  {b!r}"
    return (f"  the region has {len(want)} lines, the README's block {len(got)}")


def run(binary, expect, generator):
    if not os.access(binary, os.X_OK):
        print(f"texts match; skipped running: {binary} not built")
        return 77
    with tempfile.TemporaryDirectory(prefix="coload-readme-") as tmp:
        args = [binary]
        if generator:
            if not os.access(generator, os.X_OK):
                print(f"texts match; skipped running: {generator} not built")
                return 77
            folder = os.path.join(tmp, "images")
            gen = subprocess.run([generator, folder, "--classes", "2", "--per-class", "40",
                                  "--seed", "0"], capture_output=True, text=True, timeout=120)
            if gen.returncode != 0:
                raise Failure(f"{generator}: exit {gen.returncode}: {gen.stderr}")
            args.append(folder)
        done = subprocess.run(args, capture_output=True, text=True, timeout=240)
    print(done.stdout, done.stderr)
    if done.returncode != 0:
        raise Failure(f"{' '.join(args)}: exit {done.returncode}")
    if done.stdout.splitlines() != expect:
        raise Failure(f"{' '.join(args)} printed {done.stdout!r}, expected {expect!r}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Checks the README's C++ blocks against an example's regions, and runs it.")
    parser.add_argument("--readme", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--expect", action="append", required=True,
                        help="a line BINARY must print (in order; all of its stdout)")
    parser.add_argument("--make-image-folder", dest="generator",
                        help="tools/gen/make_image_folder: pass BINARY a 2 x 40 image folder")
    args = parser.parse_args()
    try:
        check_texts(args.readme, args.source)
        return run(args.binary, args.expect, args.generator)
    except Failure as failure:
        print(f"readme_snippets: {failure}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
