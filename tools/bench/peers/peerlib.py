"""What the Python peers of tools/bench/peers share: the protocol with peers.py.

A peer runs a warm-up epoch that starts from a cold loader (its first batch is timed from the
loader's construction), prints "@start" before constructing it and "@first" with the first batch
in hand, "@mark" before its first timed epoch and after each one (peers.py samples the CPU time
of the peer's whole process tree at each), and ends with one JSON line:
{"images": N, "epoch_seconds": [...], "first_batch_s": s, "version": "..."} or, when it cannot
run, {"error": "..."} and exit status 1.
"""

import argparse
import json
import sys
import time
import traceback

# ImageNet's normalisation, as torchvision's reference scripts use it.
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def threaded_args(doc, recipe=False):
    """The command line of a peer that runs its own pool of threads: ROOT, --epochs, --threads
    and --batch-size (and --recipe classic|resnet50 with `recipe`), with `doc`'s first line as
    its description."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    if recipe:
        p.add_argument("--recipe", choices=["classic", "resnet50"], default="classic")
    return p.parse_args()


def mark(what="mark"):
    sys.stdout.write(f"@{what}\n")
    sys.stdout.flush()


def fail(what):
    print(json.dumps({"error": what}), flush=True)
    sys.exit(1)


def run(make_loader, epoch_images, epochs, version):
    """Times a peer. `make_loader()` constructs the cold loader (its folder indexed, its workers
    not yet started); `epoch_images(loader, on_first)` runs one epoch, calls `on_first()` with
    the first batch in hand, and returns the images it delivered."""
    t0 = time.perf_counter()
    first = {}

    def on_first():
        if "s" not in first:
            first["s"] = time.perf_counter() - t0
            mark("first")

    mark("start")
    t0 = time.perf_counter()
    try:
        loader = make_loader()
        images = epoch_images(loader, on_first)
        mark()
        seconds = []
        for _ in range(epochs):
            t1 = time.perf_counter()
            got = epoch_images(loader, lambda: None)
            seconds.append(time.perf_counter() - t1)
            if got != images:
                fail(f"an epoch delivered {got} images, the warm-up {images}")
            mark()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 (the bench reports any failure as the row's note)
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        fail(last[:400])
    print(json.dumps({"images": images, "epoch_seconds": seconds,
                      "first_batch_s": first.get("s"), "version": version}), flush=True)


def list_image_folder(root):
    """(paths, labels) of an ImageFolder tree, in ImageFolder's order (class folders sorted,
    files sorted); the peers that have no ImageFolder of their own use it."""
    import os
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    paths, labels = [], []
    exts = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
    for i, c in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(exts):
                    paths.append(os.path.join(dirpath, f))
                    labels.append(i)
    return paths, labels
