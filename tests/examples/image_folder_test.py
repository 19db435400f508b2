#!/usr/bin/env python3
"""examples/image_folder as a user meets it: an unknown flag is named (exit 2); over a generated
folder (made under parents that do not exist yet), three epochs print a falling training loss
and a rising validation accuracy, one JSON object per epoch, each with the loader's verdict and
per-stage metrics; --trace writes a Chrome trace-event file that parses, with a span for every
training image's decode and transform on the workers' tracks. --recipe classic equals the
default run; --recipe resnet50 trains.

usage: image_folder_test.py IMAGE_FOLDER MAKE_IMAGE_FOLDER
"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    image_folder, make_image_folder = sys.argv[1], sys.argv[2]
    for exe in (image_folder, make_image_folder):
        if not os.access(exe, os.X_OK):
            print(f"skipped: {exe} not built")
            return 77
    failures = []
    # Flags refused before ROOT is looked at (exit 2, naming the flag): a worker count past an
    # int was cast (4294967296 gave 0 workers), and "nan" passed --val-fraction's range.
    for flag, value in (("--workers", "4294967296"), ("--val-fraction", "nan")):
        r = subprocess.run([image_folder, "/nonexistent", flag, value], capture_output=True,
                           text=True)
        if r.returncode != 2 or flag not in r.stderr:
            failures.append(f"{flag} {value}: exit {r.returncode}, stderr {r.stderr!r}")
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "not", "yet", "there")
        run = subprocess.run([make_image_folder, root, "--classes", "10", "--per-class", "60",
                              "--seed", "0"], capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 1

        for exe, args in ((image_folder, [root, "--bogus"]), (image_folder, [root, "--epoch", "2"]),
                          (make_image_folder, [root, "--bogus"])):
            bad = subprocess.run([exe] + args, capture_output=True, text=True)
            if bad.returncode != 2 or args[1] not in bad.stderr:
                failures.append(f"{os.path.basename(exe)} {args[1]}: exit {bad.returncode}, "
                                f"stderr {bad.stderr!r} does not name {args[1]}")

        run = subprocess.run([image_folder, root, "--epochs", "3", "--json"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 1
        epochs = [json.loads(line) for line in run.stdout.splitlines()]
        print(run.stdout)
        if [e["epoch"] for e in epochs] != [0, 1, 2]:
            failures.append(f"epochs {[e['epoch'] for e in epochs]}, expected [0, 1, 2]")
        else:
            losses = [e["loss"] for e in epochs]
            val = [e["val_accuracy"] for e in epochs]
            if not losses[0] > losses[1] > losses[2]:
                failures.append(f"the loss does not fall: {losses}")
            if not val[2] > val[0]:
                failures.append(f"the validation accuracy does not rise: {val}")
            if any(e["images"] != 480 or e["val_images"] != 120 for e in epochs):
                failures.append("expected 480 training and 120 validation images per epoch")
            for e in epochs:
                m = e.get("metrics", {})
                stages = m.get("stages", {})
                if m.get("samples") != 480 or m.get("batches") != 8:
                    failures.append(f"epoch {e['epoch']}: metrics count {m.get('samples')} "
                                    f"samples in {m.get('batches')} batches, expected 480 in 8")
                for stage in ("read", "decode", "transform", "wait"):
                    if stage not in stages or not {"count", "seconds", "p50_ms", "p95_ms",
                                                    "p99_ms"} <= stages[stage].keys():
                        failures.append(f"epoch {e['epoch']}: metrics lack stage {stage}")
                if stages.get("decode", {}).get("count") != 480:
                    failures.append(f"epoch {e['epoch']}: {stages.get('decode')} decodes, "
                                    "expected 480")
                if len(m.get("workers", [])) != 2 or not 0 <= m.get("wait_fraction", -1) <= 1:
                    failures.append(f"epoch {e['epoch']}: workers or wait_fraction wrong: {m}")
                verdict = e.get("verdict", "")
                if not (verdict.startswith("input-bound: the trainer waited ")
                        or verdict.startswith("the model is the bottleneck: the trainer waited ")):
                    failures.append(f"epoch {e['epoch']}: verdict {verdict!r}")

        # --recipe classic runs vision::Recipe; the classic preset is TrainTransform and
        # EvalTransform bit for bit, so the batches' hashes, the losses and the accuracies of a
        # seeded run equal the default run's. An unknown preset is named, exit 2.
        def hashed_run(extra):
            r = subprocess.run([image_folder, root, "--epochs", "1", "--hashes", "--json"] + extra,
                               capture_output=True, text=True)
            if r.returncode != 0:
                return None, r.stderr
            lines = r.stdout.splitlines()
            hashes = [line for line in lines if line.startswith("batch ")]
            epochs = [json.loads(line) for line in lines if line.startswith("{")]
            return (hashes, [(e["loss"], e["accuracy"], e["val_accuracy"]) for e in epochs]), ""
        fixed, err1 = hashed_run([])
        recipe, err2 = hashed_run(["--recipe", "classic"])
        if fixed is None or recipe is None:
            failures.append(f"--hashes runs failed: {err1} {err2}")
        elif fixed != recipe or len(fixed[0]) != 8:
            failures.append(f"--recipe classic differs from the default run: {fixed} {recipe}")
        # --recipe resnet50 (TrivialAugmentWide, RandomErasing, MixUp or CutMix, so soft labels)
        # trains: its loss, noisy with mixed labels, ends well below where it starts, and the
        # validation accuracy (eval recipe: Resize 232, CenterCrop 224) is far above chance.
        r = subprocess.run([image_folder, root, "--epochs", "4", "--json", "--recipe", "resnet50"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"--recipe resnet50 failed: {r.stderr}")
        else:
            e50 = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
            losses = [e["loss"] for e in e50]
            val = [e["val_accuracy"] for e in e50]
            print("--recipe resnet50: losses", losses, "validation accuracy", val)
            if len(e50) != 4 or not losses[-1] < losses[0] - 0.2 or not val[-1] > 0.3:
                failures.append(f"--recipe resnet50 does not train: losses {losses}, "
                                f"validation accuracy {val}")
        bad = subprocess.run([image_folder, root, "--recipe", "resnet9"], capture_output=True,
                             text=True)
        if bad.returncode != 2 or "resnet9" not in bad.stderr:
            failures.append(f"--recipe resnet9: exit {bad.returncode}, stderr {bad.stderr!r}")

        trace_path = os.path.join(tmp, "trace.json")
        run = subprocess.run([image_folder, root, "--epochs", "1", "--trace", trace_path],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 1
        if "the trainer waited" not in run.stdout:
            failures.append(f"no verdict after the epoch: {run.stdout!r}")
        with open(trace_path, encoding="utf-8") as f:
            trace = json.load(f)
        workers = {e["tid"] for e in trace
                   if e.get("name") == "thread_name" and e["args"]["name"].startswith("worker")}
        for name in ("decode", "transform"):
            spans = [e for e in trace if e.get("name") == name and e.get("ph") == "X"]
            if len(spans) != 480 or not {e["tid"] for e in spans} <= workers:
                failures.append(f"trace: {len(spans)} {name} spans, expected 480 on the workers' "
                                f"tracks {sorted(workers)}")
        if sum(1 for e in trace if e.get("name") == "wait" and e.get("ph") == "X") != 8:
            failures.append("trace: expected the trainer's 8 waits")
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
