#!/usr/bin/env python3
"""A Python training loop fed by coload.DataLoader and by a tuned torch.utils.data.DataLoader.

    train_loop.py [ROOT] [--python PY] [--torch-python PY] [--rounds 3] [--epochs 2] [--cpus 0,1] [--workers 2]
                  [--prefetch-factor 2] [--build BUILD] [--json] [--recipe classic|resnet50]

Both sides train the same model for the same steps over the same ImageFolder tree (default: the
peers folder, ~/.cache/coload/peers-folder/gen-10x100, made by tools/bench/peers/peers.py's
make_folder): batches of 64 from the standard train transform (RandomResizedCrop(224),
RandomHorizontalFlip, to float, Normalize(ImageNet)), shuffled, drop_last; each batch is one
SGD step (forward, cross-entropy, backward, step) in the main process, torch.set_num_threads(1)
on both sides.

The model is small on purpose: a careful user whose loader is what they wait on. It pools each
224 x 224 image down 8x and runs two strided 3x3 convolutions (16 and 32 channels) and a linear
head: well under a MFLOP an image, so the step is a small part of a batch's time and the loader
sets the pace (the bench prints the model's own CPU ms/image over a fixed batch to show it).

--recipe resnet50 trains with torchvision's references/classification ResNet-50 recipe instead
(RandomResizedCrop(176), flip, TrivialAugmentWide, ToDtype, Normalize, RandomErasing(0.1), and
per batch a RandomChoice of MixUp(0.2) and CutMix(1.0), so the labels are soft): coload's
"resnet50" preset against the same ops in transforms.v2 (peers.py --recipe resnet50's
torch2_tuned, here on decode_jpeg's uint8 tensors by default) with the mix in collate_fn.

  coload  coload.DataLoader(coload.vision.ImageFolder(ROOT, recipe="classic"), batch_size=64,
          shuffle=True, num_workers=2, persistent_workers=True, drop_last=True): decode and
          augmentation in C++ on worker threads, the GIL held only to take a batch.
  torch   torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(ROOT, ...), the same
          batch_size/shuffle/drop_last, num_workers=2, pin_memory=False (CPU),
          persistent_workers=True, prefetch_factor=2 (the best of 2/4/8 with torch 2.15, see
          docs/performance.md)), the images decoded by torchvision.io.decode_jpeg and
          transformed by transforms.v2 on uint8 tensors where torchvision has them (0.16+),
          else PIL and the classic transforms.

Each side runs in its own process (this script with --side), pinned to --cpus, through
tools/bench/peers' protocol: a warm-up epoch from a cold loader (first batch timed from the
loader's construction), then --epochs timed epochs; peers.py's run_peer reads the CPU time of
the process tree at each epoch's end and samples its PSS (peak over the run, workers included).
Rounds alternate the sides. Prints images/s (median of rounds), CPU ms/image, first batch, peak
PSS, and coload's images/s over torch's (the issue's target: at least 3.5x).

--python is the interpreter with torch, torchvision and the coload package (default: this
one); coload's extension may come from a build folder put on PYTHONPATH. --torch-python runs
the torch side (and the model alone) under another interpreter, e.g. a venv with torch 2.x and
torchvision where coload is built against Debian's torch 1.13: the rows say which torch each ran.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "peers"))

BATCH = 64
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def make_model(torch, classes):
    nn = torch.nn
    return nn.Sequential(
        nn.AvgPool2d(8),                                      # 224 -> 28
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),  # -> 14
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),  # -> 7
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def torch_recipe(a, torch, v2):
    """The torch side's train transform and collate_fn for --recipe, in transforms.v2."""
    if a.recipe == "classic":
        return v2.Compose([
            v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]), None
    classes = len([d for d in os.listdir(a.root) if os.path.isdir(os.path.join(a.root, d))])
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes),
                           v2.CutMix(alpha=1.0, num_classes=classes)])

    def collate(batch):
        return mix(*torch.utils.data.default_collate(batch))
    pil = [v2.PILToTensor()] if a.torch_pipeline == "pil" else []
    return v2.Compose([
        v2.RandomResizedCrop(176, antialias=True), v2.RandomHorizontalFlip(),
        # train.py's --interpolation (bilinear), as presets.py passes it on.
        v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR)] + pil + [
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(MEAN, STD), v2.RandomErasing(0.1)]), collate


def side_main(a):
    import peerlib
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    classes = len([d for d in os.listdir(a.root) if os.path.isdir(os.path.join(a.root, d))])
    model = make_model(torch, classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(images, labels):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()

    if a.side == "model":
        # The model alone over one fixed batch: what a step costs when the loader is free.
        side = 176 if a.recipe == "resnet50" else 224
        images, labels = torch.randn(BATCH, 3, side, side), torch.randint(0, classes, (BATCH,))
        for _ in range(3):
            step(images, labels)
        t, cpu = time.perf_counter(), time.thread_time()
        for _ in range(20):
            step(images, labels)
        print(json.dumps({"model_images_per_s": 20 * BATCH / (time.perf_counter() - t),
                          "model_cpu_ms_per_image": 1e3 * (time.thread_time() - cpu) / (20 * BATCH)}))
        return

    if a.side == "coload":
        try:
            import coload
        except ImportError as e:
            peerlib.fail(f"the coload package is not importable from {sys.executable}: {e}")
        version = f"coload (torch {torch.__version__})"

        def make_loader():
            return coload.DataLoader(coload.vision.ImageFolder(a.root, recipe=a.recipe),
                                     batch_size=BATCH, shuffle=True, num_workers=a.workers,
                                     persistent_workers=True, drop_last=True)
    else:
        import torchvision
        try:
            import torchvision.transforms.v2 as v2
            from torchvision.io import ImageReadMode, decode_jpeg, read_file
        except ImportError:
            v2 = None
        collate = None
        if a.recipe != "classic" and v2 is None:
            peerlib.fail(f"torchvision {torchvision.__version__} lacks transforms.v2 (MixUp, "
                         f"CutMix), needed for --recipe {a.recipe}")
        if a.torch_pipeline == "pil" and a.recipe == "classic":
            v2 = None  # peers.py's torch2_tuned transform: PIL decode, the classic transforms
        if v2 is None:
            import torchvision.transforms as T
            transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                   T.ToTensor(), T.Normalize(MEAN, STD)])
        else:
            transform, collate = torch_recipe(a, torch, v2)
        if a.torch_pipeline == "pil" or v2 is None:
            from torchvision.datasets.folder import default_loader as load
            how = "PIL + transforms" + (".v2" if v2 is not None else "")
        else:
            def load(path):
                return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)
            how = "decode_jpeg + transforms.v2"
        version = (f"torch {torch.__version__}, torchvision {torchvision.__version__} ({how}), "
                   f"prefetch_factor {a.prefetch_factor}, {a.recipe} recipe")

        def make_loader():
            dataset = torchvision.datasets.ImageFolder(a.root, transform=transform, loader=load)
            extra = {"collate_fn": collate} if collate else {}
            return torch.utils.data.DataLoader(
                dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=a.workers,
                pin_memory=False, persistent_workers=True, prefetch_factor=a.prefetch_factor,
                **extra)

    # What the model costs inside the loop (its steps' CPU and wall time on the main thread, over
    # every epoch but the warm-up) and the intra-op threads it had: written to --stats at exit,
    # so the driver can show whether either loader left the model less.
    stats = {"model_threads": torch.get_num_threads(), "interop_threads": None,
             "step_cpu_s": 0.0, "step_wall_s": 0.0, "step_images": 0, "epochs": 0}

    def epoch(loader, on_first):
        n = 0
        timed = stats["epochs"] > 0
        for images, labels in loader:
            if n == 0:
                on_first()
                stats["model_threads"] = torch.get_num_threads()
                stats["interop_threads"] = torch.get_num_interop_threads()
            cpu, wall = time.thread_time(), time.perf_counter()
            step(images, labels)
            if timed:
                stats["step_cpu_s"] += time.thread_time() - cpu
                stats["step_wall_s"] += time.perf_counter() - wall
                stats["step_images"] += images.shape[0]
            n += images.shape[0]
        stats["epochs"] += 1
        return n

    if a.stats:
        import atexit

        def dump():
            with open(a.stats, "w") as f:
                json.dump(stats, f)
        atexit.register(dump)
    peerlib.run(make_loader, epoch, a.epochs, version)


def driver_main(a):
    import peers
    python = a.python or sys.executable
    build = a.build or os.path.join(HERE, "..", "..", "..", "build")
    root = a.root or peers.make_folder(
        build, os.path.expanduser("~/.cache/coload/peers-folder/gen-10x100"),
        lambda m: print(m, file=sys.stderr))
    cpus = [int(c) for c in a.cpus.split(",")] if a.cpus else None

    import tempfile
    stats_dir = tempfile.mkdtemp(prefix="train_loop-")

    def command(side, stats=None):
        interpreter = (a.torch_python or python) if side in ("torch", "model") else python
        return ([interpreter, os.path.abspath(__file__), root, "--side", side, "--epochs",
                 str(a.epochs), "--workers", str(a.workers), "--prefetch-factor",
                 str(a.prefetch_factor), "--torch-pipeline", a.torch_pipeline, "--recipe",
                 a.recipe] +
                (["--stats", stats] if stats else []))

    runs = {"coload": [], "torch": []}
    loop_stats = {"coload": [], "torch": []}
    for r in range(a.rounds):
        for side in (("coload", "torch") if r % 2 == 0 else ("torch", "coload")):
            path = os.path.join(stats_dir, f"{side}-{r}.json")
            runs[side].append(peers.run_peer(side, command(side, path), cpus=cpus, pss=False))
            try:
                with open(path) as f:
                    loop_stats[side].append(json.load(f))
            except (OSError, ValueError):
                pass
            print(f"round {r + 1} {side}: {runs[side][-1].get('images_per_s') or runs[side][-1]}",
                  file=sys.stderr)
    rows = {}
    for side in runs:
        pss_run = peers.run_peer(side, command(side), cpus=cpus, pss=True)
        rows[side] = peers.merge_rounds(runs[side], [pss_run])
    model = {}
    import subprocess
    out = subprocess.run(command("model"), capture_output=True, text=True,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    try:
        model = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        model = {"error": out.stderr.strip()[-300:]}
    ratio = None
    if rows["coload"].get("images_per_s") and rows["torch"].get("images_per_s"):
        ratio = rows["coload"]["images_per_s"] / rows["torch"]["images_per_s"]
    in_loop = {}
    for side, runs_stats in loop_stats.items():
        n = sum(x["step_images"] for x in runs_stats)
        if n:
            in_loop[side] = {
                "model_cpu_ms_per_image": 1e3 * sum(x["step_cpu_s"] for x in runs_stats) / n,
                "model_wall_ms_per_image": 1e3 * sum(x["step_wall_s"] for x in runs_stats) / n,
                "model_threads": sorted({x["model_threads"] for x in runs_stats}),
                "interop_threads": sorted({x["interop_threads"] for x in runs_stats})}
    result = {"root": root, "python": python, "torch_python": a.torch_python or python,
              "cpus": a.cpus, "rounds": a.rounds, "epochs": a.epochs,
              "torch_pipeline": a.torch_pipeline, "recipe": a.recipe, "load_average": os.getloadavg(),
              "model": model, "model_in_loop": in_loop,
              "coload": rows["coload"], "torch": rows["torch"], "ratio": ratio}
    if a.json:
        print(json.dumps(result))
        return
    print(f"training loop, {a.recipe} recipe, over {root} ({a.rounds} rounds x {a.epochs} epochs, CPUs {a.cpus}, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    if "model_images_per_s" in model:
        print(f"model alone (fixed batch): {model['model_images_per_s']:.0f} images/s, "
              f"{model['model_cpu_ms_per_image']:.3f} CPU ms/image")
    print(f"{'loader':8} {'images/s':>9} {'CPU ms/img':>11} {'1st batch s':>12} {'peak PSS MiB':>13}"
          "  version")
    for side in ("coload", "torch"):
        row = rows[side]
        if row.get("images_per_s") is None:
            print(f"{side:8} error: {row.get('error')}")
            continue

        def f(key, fmt):
            return format(row[key], fmt) if row.get(key) is not None else "-"
        print(f"{side:8} {f('images_per_s', '9.1f')} {f('cpu_ms_per_image', '11.2f')} "
              f"{f('first_batch_s', '12.3f')} {f('peak_pss_mib', '13.0f')}  "
              f"{(runs[side][0].get('version') or '') if runs[side] else ''}")
    for side, x in in_loop.items():
        print(f"model in {side}'s loop: {x['model_cpu_ms_per_image']:.3f} CPU ms/image, "
              f"{x['model_wall_ms_per_image']:.3f} wall ms/image, torch threads "
              f"{x['model_threads']} (inter-op {x['interop_threads']})")
    if ratio is not None:
        print(f"coload / torch images/s: {ratio:.2f}x (target >= 3.5x)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?")
    p.add_argument("--side", choices=["coload", "torch", "model"])
    p.add_argument("--python")
    p.add_argument("--torch-python")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--cpus", default="0,1")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--torch-pipeline", choices=["tensor", "pil"], default="tensor",
                   help="the torch side's transform: decode_jpeg + transforms.v2 on uint8 tensors "
                   "(default, torchvision's fast path), or PIL + the classic transforms (peers.py's "
                   "torch2_tuned)")
    p.add_argument("--recipe", choices=["classic", "resnet50"], default="classic",
                   help="the training recipe on both sides (default classic; resnet50: "
                   "torchvision's ResNet-50 recipe with MixUp/CutMix, soft labels)")
    p.add_argument("--stats", help=argparse.SUPPRESS)  # a side's in-loop model stats (JSON)
    p.add_argument("--build")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.side:
        side_main(a)
    else:
        driver_main(a)


if __name__ == "__main__":
    main()
