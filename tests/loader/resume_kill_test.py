#!/usr/bin/env python3
"""A training process killed with SIGKILL mid-epoch and restarted from its last saved state
yields, concatenated, the same batch hashes as an uninterrupted run.

usage: resume_kill_test.py IMAGE_FOLDER_EXAMPLE MAKE_IMAGE_FOLDER
Exits 77 (skipped) when the example was not built."""
import os
import signal
import subprocess
import sys
import tempfile

example, maker = sys.argv[1], sys.argv[2]
if not (os.access(example, os.X_OK) and os.access(maker, os.X_OK)):
    print("skipped: examples/image_folder or tools/gen/make_image_folder not built")
    sys.exit(77)

BATCHES_PER_EPOCH = 10  # 80 images, batch 8
EPOCHS = 3


def batch_lines(text):
    return [l for l in text.splitlines() if l.startswith("batch ")]


def run(args):
    out = subprocess.run([example] + args, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} exited {out.returncode}: {out.stderr}")
    return batch_lines(out.stdout)


def check(tmp, root, extra, kill_after):
    # No validation split: every image is a training image, as the batch counts above assume.
    common = [root, "--batch-size", "8", "--epochs", str(EPOCHS), "--seed", "3", "--hashes",
              "--val-fraction", "0"] + extra
    full = run(common)
    if len(full) != EPOCHS * BATCHES_PER_EPOCH:  # not `assert`: python -O would drop it
        sys.exit(f"FAIL: uninterrupted run: {len(full)} batches, not {EPOCHS * BATCHES_PER_EPOCH}")

    state = os.path.join(tmp, "loader.state")
    proc = subprocess.Popen([example] + common + ["--state", state], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    first = []
    for line in proc.stdout:
        if line.startswith("batch "):
            first.append(line.rstrip("\n"))
            if len(first) == kill_after:
                proc.send_signal(signal.SIGKILL)
                break
    first += batch_lines(proc.stdout.read())
    proc.wait()
    if proc.returncode != -signal.SIGKILL:
        sys.exit(f"FAIL: the run ended with {proc.returncode}, not SIGKILL")

    fields = dict((l + " ").split(" ", 1) for l in open(state).read().splitlines())
    position = int(fields["epoch"]) * BATCHES_PER_EPOCH + int(fields["delivered"])
    second = run(common + ["--resume", state])
    if len(first) == position:
        got = first + second
    elif len(first) == position - 1:
        # Killed between saving a batch's state and printing its line: that line is lost,
        # the rest must still line up.
        print(f"note: killed between state and hash line of batch {position - 1}")
        got = first + [full[position - 1]] + second
    else:
        sys.exit(f"FAIL: {len(first)} lines printed but the state says {position} delivered")
    if got != full:
        for i, (a, b) in enumerate(zip(got, full)):
            if a != b:
                sys.exit(f"FAIL ({extra}): line {i}: resumed '{a}' != uninterrupted '{b}'")
        sys.exit(f"FAIL ({extra}): {len(got)} lines resumed, {len(full)} uninterrupted")
    print(f"ok ({' '.join(extra)}): killed after {len(first)} batches, resumed at {position}, "
          f"{len(got)} hashes equal")


with tempfile.TemporaryDirectory() as tmp:
    root = os.path.join(tmp, "images")
    subprocess.run([maker, root, "--classes", "4", "--per-class", "20", "--seed", "0"],
                   check=True, capture_output=True)
    check(tmp, root, ["--workers", "2"], kill_after=13)
    check(tmp, root, ["--workers", "2", "--executor", "processes"], kill_after=7)
    check(tmp, root, ["--workers", "0"], kill_after=BATCHES_PER_EPOCH)
print("PASS")
