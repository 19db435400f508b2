#!/usr/bin/env python3
"""tools/plot_run.py over synthetic image_folder --json lines (the metrics schema of issue 19):
a PNG of the size asked for, with something drawn in each of its three plots, is written, from
a file or stdin; a line that is not JSON, or
lacks a key, is an error that names the line and the key, and writes nothing.

usage: plot_run_test.py PLOT_RUN_PY
Skipped (77) where /usr/bin/python3 has no matplotlib.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

PYTHON = "/usr/bin/python3"


def stage(seconds):
    return {"count": 640, "seconds": seconds, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}


def epoch_line(e, rate, wait):
    metrics = {
        "seconds": 10.0, "batches": 10, "samples": 640,
        "wait_seconds": 10.0 * wait, "wait_fraction": wait,
        "stages": {"sample": stage(0.01), "read": stage(0.2), "decode": stage(1.5),
                   "transform": stage(0.8), "collate": stage(0.1), "wait": stage(10.0 * wait)},
        "bytes_read": 123456,
        "workers": [{"id": 0, "pid": 1234, "busy_fraction": 0.98}],
        "occupancy": 0.9, "num_workers": 2, "skipped": 0, "errors": 0,
    }
    return json.dumps({"epoch": e, "images": 640, "seconds": 10.0, "images_per_s": rate,
                       "wait_seconds": 10.0 * wait, "loss": 2.0 - e, "accuracy": 0.1 * e,
                       "digest": "00000000deadbeef", "metrics": metrics})


def png_size(path):
    """(width, height) from the PNG's IHDR chunk; raises if it is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


# Per third of the image (the three plots side by side): the share of its pixels that are
# saturated colour (the throughput line, tab:blue; the stage bars) and that are the wait bars'
# gray (0.45). Axes, ticks and text are black and white with antialiased edges, which leave
# about 0.1% of either; a plot with its data left out has no colour and no more gray.
INK = r"""
import sys
import matplotlib.image as mpimg
img = mpimg.imread(sys.argv[1])[..., :3]
w = img.shape[1]
for k in range(3):
    panel = img[:, w * k // 3:w * (k + 1) // 3]
    hi, lo = panel.max(axis=2), panel.min(axis=2)
    colour = (hi - lo > 0.15).mean()
    gray = ((hi - lo < 0.02) & (abs(lo - 0.45) < 0.03)).mean()
    print(colour, gray)
"""
# (plot, what must be drawn, share of its pixels at least): well above the 0.1% of a blank one.
DRAWN = [("throughput", "colour", 0.002), ("trainer waiting", "gray", 0.02),
         ("time per image", "colour", 0.02)]


def drawn_problems(path):
    """What of the three plots in the PNG at `path` has nothing drawn in it."""
    r = subprocess.run([PYTHON, "-c", INK, path], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return [f"cannot read {path}: {r.stderr.strip()}"]
    shares = [dict(zip(("colour", "gray"), map(float, line.split())))
              for line in r.stdout.split("\n") if line.strip()]
    return [f"the {name} plot has {shares[k][kind]:.4f} of its pixels in {kind}, under {least}: "
            "nothing drawn" for k, (name, kind, least) in enumerate(DRAWN)
            if shares[k][kind] < least]


def main() -> int:
    script = sys.argv[1]
    if subprocess.run([PYTHON, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        print("skipped: no matplotlib for /usr/bin/python3 (python3-matplotlib)")
        return 77
    failures = []

    def run(args, stdin=None):
        return subprocess.run([PYTHON, script] + args, capture_output=True, text=True,
                              input=stdin, timeout=120)

    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "run.jsonl")
        lines = [epoch_line(0, 410.0, 0.52), "", "batch 1 0 0123abcd", epoch_line(1, 620.5, 0.2),
                 epoch_line(2, 640.0, 0.01)]
        with open(good, "w") as f:
            f.write("\n".join(lines) + "\n")

        # A file, with a size asked for; the default size; and stdin.
        for args, want, stdin in (([good, "--size", "1200x450", "--title", "t"], (1200, 450), None),
                                  ([good], (1500, 500), None),
                                  (["-", "--size", "800x300"], (800, 300), "\n".join(lines))):
            out = os.path.join(tmp, f"out{want[0]}.png")
            r = run(args + ["-o", out], stdin)
            if r.returncode != 0:
                failures.append(f"{args}: exit {r.returncode}: {r.stderr}")
                continue
            try:
                got = png_size(out)
            except (OSError, ValueError) as e:
                failures.append(f"{args}: {e}")
                continue
            if got != want:
                failures.append(f"{args}: PNG is {got[0]}x{got[1]}, expected {want[0]}x{want[1]}")
            failures += [f"{args}: {p}" for p in drawn_problems(out)]
            if "3 epochs" not in r.stderr:
                failures.append(f"{args}: stderr {r.stderr!r} does not say 3 epochs")

        # Bad input: (lines, what stderr must name).
        no_metrics = json.loads(epoch_line(1, 600.0, 0.1))
        del no_metrics["metrics"]
        no_seconds = json.loads(epoch_line(0, 600.0, 0.1))
        del no_seconds["metrics"]["stages"]["decode"]["seconds"]
        text_rate = json.loads(epoch_line(0, 600.0, 0.1))
        text_rate["images_per_s"] = "fast"
        bad_cases = [
            ([epoch_line(0, 1.0, 0.1), json.dumps(no_metrics)], ["line 2", "'metrics'"]),
            ([json.dumps(no_seconds)], ["line 1", "'metrics.stages.decode.seconds'"]),
            ([epoch_line(0, 1.0, 0.1), epoch_line(1, 1.0, 0.1), "{oops"], ["line 3", "not JSON"]),
            (["[1, 2]"], ["line 1", "JSON object"]),
            ([json.dumps(text_rate)], ["line 1", "images_per_s", "not a number"]),
            ([""], ["no epoch lines"]),
        ]
        for i, (bad_lines, words) in enumerate(bad_cases):
            bad = os.path.join(tmp, f"bad{i}.jsonl")
            with open(bad, "w") as f:
                f.write("\n".join(bad_lines) + "\n")
            out = os.path.join(tmp, f"bad{i}.png")
            r = run([bad, "-o", out])
            if r.returncode == 0:
                failures.append(f"bad case {i}: exit 0")
            for w in words + [bad]:
                if w not in r.stderr:
                    failures.append(f"bad case {i}: stderr {r.stderr!r} does not name {w!r}")
            if os.path.exists(out):
                failures.append(f"bad case {i}: wrote {out} anyway")

        # A missing file and a bad --size are named too.
        r = run([os.path.join(tmp, "absent.jsonl"), "-o", os.path.join(tmp, "x.png")])
        if r.returncode == 0 or "absent.jsonl" not in r.stderr:
            failures.append(f"missing file: exit {r.returncode}, stderr {r.stderr!r}")
        r = run([good, "--size", "big"])
        if r.returncode != 2 or "--size" not in r.stderr:
            failures.append(f"--size big: exit {r.returncode}, stderr {r.stderr!r}")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
