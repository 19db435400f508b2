#!/usr/bin/env python3
"""Turns examples/image_folder's --json lines into one PNG: throughput per epoch, the
consumer's wait fraction per epoch, and where each image's time went, stage by stage.

usage: tools/plot_run.py RUN.jsonl [-o run.png] [--size 1500x500] [--title TEXT]
       build/examples/image_folder ROOT --json | tools/plot_run.py - -o run.png

Each non-blank line is one epoch's JSON object, as image_folder --json prints it: "epoch",
"images_per_s" and "metrics" (the loader's metrics for that epoch: "samples",
"wait_fraction" and "stages", each stage with its "seconds"; stages may be left out).
Per-image time of a stage is its seconds / samples (summed over the workers, so it is CPU
time per image, not wall time); "read" is drawn beside the others, not stacked on them: an
asynchronous read's seconds are I/O latency that overlaps the rest. Lines that --hashes adds ("batch E N HASH") are skipped.
A line that is not JSON or lacks a key is an error naming the file, the line and the key;
nothing is written then. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import re
import sys

# The stages an image goes through, in pipeline order (the metrics' names). "wait" is the
# consumer's, shown as the wait fraction rather than as a per-image cost.
STAGES = ["sample", "read", "decode", "transform", "collate", "pin", "copy"]
COLORS = {"sample": "tab:blue", "decode": "tab:purple", "transform": "tab:green",
          "collate": "tab:red", "pin": "tab:brown", "copy": "tab:gray"}
HASH_LINE = re.compile(r"^batch \d+ \d+ [0-9a-fA-F]+$")


class RunError(Exception):
    """Bad input: the message names where."""


def number(obj, path, where):
    """The number at `path` (keys) in `obj`; RunError naming the dotted key otherwise."""
    cur = obj
    for i, key in enumerate(path):
        if not isinstance(cur, dict) or key not in cur:
            raise RunError(f"{where}: missing key '{'.'.join(path[:i + 1])}'")
        cur = cur[key]
    if isinstance(cur, bool) or not isinstance(cur, (int, float)):
        raise RunError(f"{where}: '{'.'.join(path)}' is {json.dumps(cur)}, not a number")
    return float(cur)


def read_epochs(lines, name):
    """One dict per epoch line: epoch, images_per_s, wait_fraction, ms per image by stage."""
    epochs = []
    for n, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or HASH_LINE.match(line):
            continue
        where = f"{name} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RunError(f"{where}: not JSON ({e.msg} at column {e.colno}): {line[:60]!r}")
        if not isinstance(obj, dict):
            raise RunError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        samples = number(obj, ["metrics", "samples"], where)
        stages = obj["metrics"].get("stages")
        if not isinstance(stages, dict):
            raise RunError(f"{where}: missing key 'metrics.stages'")
        ms = {}
        for stage in STAGES:
            if stage in stages:
                seconds = number(obj, ["metrics", "stages", stage, "seconds"], where)
                ms[stage] = 1e3 * seconds / samples if samples > 0 else 0.0
        epochs.append({
            "epoch": int(number(obj, ["epoch"], where)),
            "images_per_s": number(obj, ["images_per_s"], where),
            "wait_fraction": number(obj, ["metrics", "wait_fraction"], where),
            "ms": ms,
        })
    if not epochs:
        raise RunError(f"{name}: no epoch lines")
    return epochs


def plot(epochs, out, width_px, height_px, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dpi = 100
    fig, (ax_rate, ax_wait, ax_stage) = plt.subplots(
        1, 3, figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    xs = [e["epoch"] for e in epochs]

    ax_rate.plot(xs, [e["images_per_s"] for e in epochs], marker="o", color="tab:blue")
    ax_rate.set_title("throughput")
    ax_rate.set_xlabel("epoch")
    ax_rate.set_ylabel("images/s")
    ax_rate.set_ylim(bottom=0)

    ax_wait.bar(xs, [100 * e["wait_fraction"] for e in epochs], color="0.45")
    ax_wait.set_title("trainer waiting for data")
    ax_wait.set_xlabel("epoch")
    ax_wait.set_ylabel("% of the epoch")
    ax_wait.set_ylim(0, 100)

    # NOTE: "read" stands beside the stack, not in it: an asynchronous read (io_uring) is
    # latency that overlaps the other stages and other reads, not time a worker spent.
    width = 0.38
    reads = [e["ms"].get("read", 0.0) for e in epochs]
    if any(reads):
        ax_stage.bar([x - width / 2 for x in xs], reads, width, color="white",
                     edgecolor="tab:orange", hatch="//", label="read (I/O, overlaps)")
    at = [x + width / 2 for x in xs] if any(reads) else xs
    bottom = [0.0] * len(epochs)
    for stage in STAGES:
        if stage == "read":
            continue
        heights = [e["ms"].get(stage, 0.0) for e in epochs]
        if not any(heights):
            continue
        ax_stage.bar(at, heights, width if any(reads) else 0.8, bottom=bottom, label=stage,
                     color=COLORS[stage])
        bottom = [b + h for b, h in zip(bottom, heights)]
    bottom = [max(b, r) for b, r in zip(bottom, reads)]
    ax_stage.set_title("time per image by stage")
    ax_stage.set_xlabel("epoch")
    ax_stage.set_ylabel("ms per image (all workers)")
    if any(bottom):
        # Room above the tallest bar for the legend, which lists the stages top first as
        # they are stacked.
        ax_stage.set_ylim(0, 1.4 * max(bottom))
        handles, labels = ax_stage.get_legend_handles_labels()
        ax_stage.legend(handles[::-1], labels[::-1], fontsize="small", ncol=4,
                        loc="upper center")

    for ax in (ax_rate, ax_wait, ax_stage):
        ax.set_xticks(xs)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    # NOTE: no bbox_inches="tight": the PNG keeps exactly the size asked for.
    fig.savefig(out, dpi=dpi, format="png")
    plt.close(fig)


def size(text):
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m or not (100 <= int(m[1]) <= 10000 and 100 <= int(m[2]) <= 10000):
        raise argparse.ArgumentTypeError(
            f"expected WIDTHxHEIGHT in pixels, each 100 to 10000, got {text!r}")
    return int(m[1]), int(m[2])


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Plot examples/image_folder --json lines (one per epoch) as a PNG: "
                    "throughput, the trainer's wait fraction, and per-image time by stage.")
    parser.add_argument("run", help="the JSON lines file, or - for stdin")
    parser.add_argument("-o", "--output", default="run.png", help="the PNG to write "
                        "(default: run.png)")
    parser.add_argument("--size", type=size, default=(1500, 500),
                        help="WIDTHxHEIGHT in pixels (default: 1500x500)")
    parser.add_argument("--title", default="", help="a title above the three plots")
    args = parser.parse_args(argv)
    try:
        if args.run == "-":
            epochs = read_epochs(sys.stdin, "<stdin>")
        else:
            try:
                with open(args.run, encoding="utf-8") as f:
                    epochs = read_epochs(f, args.run)
            except OSError as e:
                raise RunError(f"{args.run}: {e.strerror}")
    except RunError as e:
        print(f"plot_run.py: {e}", file=sys.stderr)
        return 1
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_run.py: matplotlib is missing (Debian: apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 1
    plot(epochs, args.output, args.size[0], args.size[1], args.title)
    print(f"plot_run.py: wrote {args.output} ({len(epochs)} epochs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
