#!/usr/bin/python3
"""tools/bench/peers: coload's image pipeline against the other loaders a user could pick.

    tools/bench/peers/peers.py [ROOT] [--rounds 3] [--epochs 3] [--peers a,b] [--workers 2]
                               [--pss-runs 1] [--quick] [--json] [--recipe classic|resnet50]

Sets up the peers in a virtual environment (~/.cache/coload/venv-peers, by setup_venv.sh beside
this file, once), then runs each of them on the same ImageFolder tree with the same transform
(RandomResizedCrop 224, horizontal flip, normalise; batch 64) and the same 2 workers or threads
(--workers), each pinned to the same CPUs (--cpus, default 0,1), one after another:

  coload_threads    coload's vision::ImagePipeline through its DataLoader, 2 worker threads
  coload_processes  the same with 2 worker processes (persistent)
  coload_python     coload_threads' pipeline from Python (the coload package: coload.DataLoader
                    over coload.vision.ImageFolder, the preset recipe, default classic)
  torch2_default    PyTorch 2.x (PyPI) DataLoader over ImageFolder, PyTorch's defaults
  torch2_tuned      the same with persistent_workers, prefetch_factor and set_num_threads(1)
  torch113_default  Debian's PyTorch 1.13 (/usr/bin/python3), PyTorch's defaults
  dali_cpu          NVIDIA DALI's CPU pipeline (device_id=None), 2 threads
  spdl              SPDL, FFmpeg decoding on 2 threads
  tfdata            tf.data (tensorflow-cpu), AUTOTUNE on a 2-thread pool
  coload_shards     coload's ShardImagePipeline over coload-shard's shards of ROOT, threads
  coload_shards_fast  the same over `coload-shard --fast-crop` shards (restart markers: crops
                    decode only the intervals covering them); both written by the bench, in
                    the same order, under ~/.cache/coload/peers-shards (sizes in meta)
  decode_full       a bare full-size TurboJPEG decode of every file on 2 threads (CPU floor)
  decode_entropy    only the Huffman data of every file decoded (libjpeg, 2 threads; all but
                    the last iMCU row): the part of a decode that a crop cannot skip above its
                    bottom row

Each peer is its own process and runs one warm-up epoch from a cold loader, then --epochs timed
ones. Measured: images/s (median of the timed epochs), CPU milliseconds per image (all the
peer's processes: sampled from /proc at each epoch boundary, so worker processes count),
time to first batch (constructing the loader, its folder indexed, to the first batch in hand;
the interpreter's start and imports excluded; also as CPU seconds of its processes, which a
loaded machine inflates less), and the peak over a run of the proportional set size summed
over the peer's process and all its descendants (/proc/PID/smaps_rollup, sampled every
--sample-interval seconds and at each epoch's end). With --rounds N the peers run N times
interleaved (round 1 all peers, round 2 all peers, ...) and each figure is the median of the
rounds. The PSS is measured apart, in one more run of each peer after the timed rounds
(--pss-runs): reading smaps_rollup walks a process's mappings under its memory-map lock, and
at every 0.1 s, on the same 2 CPUs, it cost PyTorch 2.15's DataLoader (three processes mapping
the CUDA wheel's libraries) 13-17% of its images/s and coload 5%, so timing and sampling in
one run favoured coload's ratios. Before anything is timed every file is read once, so all
peers find the page cache warm.

--recipe resnet50 runs every peer with its own equivalent of torchvision's ResNet-50 recipe
(RandomResizedCrop 176, flip, TrivialAugmentWide, ToDtype, Normalize, RandomErasing 0.1, and
MixUp 0.2 or CutMix 1.0 per batch): coload its preset, PyTorch transforms.v2 (peer_torch.py),
DALI auto_aug.trivial_augment_wide and fn.erase with v2's MixUp/CutMix on its batches
(peer_dali.py), tf.data the same ops written in TensorFlow (tf_recipes.py); SPDL has none and
says so in its row. Its targets are RESNET50_TARGETS (issue 31's). --recipe classic runs
coload's rows through the classic preset's Recipe (the others run their classic transform as
without --recipe).

Prints a table and the issue's target ratios, or with --json exactly one JSON object. A peer
that cannot run gets a row saying what failed. The bench's own logic (the PSS sum, the tree
walk, the table and JSON) is tested by tests/tools/peers_test.py with a fake peer.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
VENV = os.path.expanduser(os.environ.get("COLOAD_PEERS_VENV", "~/.cache/coload/venv-peers"))
TICKS = os.sysconf("SC_CLK_TCK")

# name -> (what it is, how it is started: "coload", "venv" or "system")
PEERS = {
    "coload_threads": ("coload vision::ImagePipeline + DataLoader, worker threads", "coload"),
    "coload_processes": ("the same, worker processes (persistent)", "coload"),
    "coload_python": ("the same from Python: coload.DataLoader, worker threads", "coload_python"),
    "torch2_default": ("PyTorch 2.x DataLoader + ImageFolder, defaults", "venv"),
    "torch2_tuned": ("PyTorch 2.x, persistent_workers, prefetch_factor, 1 thread", "venv"),
    "torch113_default": ("Debian's PyTorch 1.13 DataLoader + ImageFolder, defaults", "system"),
    "dali_cpu": ("NVIDIA DALI CPU pipeline (device_id=None), --workers threads", "venv"),
    "spdl": ("SPDL pipeline, FFmpeg decode + filter, --workers threads", "venv"),
    "tfdata": ("tf.data, decode_and_crop_jpeg, AUTOTUNE, --workers threads", "venv"),
    "coload_shards": ("coload ShardImagePipeline over plain shards of ROOT, worker threads",
                      "coload"),
    "coload_shards_fast": ("the same over --fast-crop shards (restart markers)", "coload"),
    "decode_full": ("bare full-size TurboJPEG decode of every file, --workers threads", "coload"),
    "decode_entropy": ("bare entropy decoding of every file (libjpeg), --workers threads",
                       "coload"),
}
# The issue's targets. (name, numerator row, denominator row(s), field, comparison, target)
# "ratio" fields: images/s of the first over the second (>= target), or the first's value over
# the second's for CPU, first batch and PSS (<= target). A tuple of rows means the best of them.
TARGETS = [
    ("images/s: coload_threads / torch2_tuned", "coload_threads", "torch2_tuned",
     "images_per_s", ">=", 3.5),
    ("images/s: coload_threads / best of dali_cpu, spdl, tfdata", "coload_threads",
     ("dali_cpu", "spdl", "tfdata"), "images_per_s", ">=", 1.0),
    ("CPU ms/image: coload_threads / decode_full", "coload_threads", "decode_full",
     "cpu_ms_per_image", "<=", 0.85),
    ("first batch: coload_threads / torch2_tuned", "coload_threads", "torch2_tuned",
     "first_batch_s", "<=", 0.1),
    ("first batch: coload_processes / torch2_tuned", "coload_processes", "torch2_tuned",
     "first_batch_s", "<=", 0.1),
    ("peak PSS: coload_threads / torch2_tuned", "coload_threads", "torch2_tuned",
     "peak_pss_mib", "<=", 0.5),
    ("peak PSS: coload_processes / torch2_tuned", "coload_processes", "torch2_tuned",
     "peak_pss_mib", "<=", 0.5),
    # issue 36: crops decoding only their restart intervals
    ("CPU ms/image: coload_shards_fast / decode_full", "coload_shards_fast", "decode_full",
     "cpu_ms_per_image", "<=", 0.7),
    ("images/s: coload_shards_fast / coload_shards", "coload_shards_fast", "coload_shards",
     "images_per_s", ">=", 1.3),
]
AIMS = {TARGETS[0][0]: 4.0, TARGETS[1][0]: 1.3}
# --recipe resnet50's targets (issue 31), in place of TARGETS: every row then runs its own
# equivalent of torchvision's ResNet-50 recipe (SPDL has none: it says so in its row).
RESNET50_TARGETS = [
    ("resnet50 images/s: coload_threads / torch2_tuned", "coload_threads", "torch2_tuned",
     "images_per_s", ">=", 3.5),
    ("resnet50 images/s: coload_threads / best of dali_cpu, tfdata", "coload_threads",
     ("dali_cpu", "tfdata"), "images_per_s", ">=", 1.5),
]


def targets_for(recipe):
    """The targets a run with --recipe `recipe` is judged by."""
    return RESNET50_TARGETS if recipe == "resnet50" else TARGETS


# --- /proc: the process tree, its PSS and its CPU ------------------------------------------------
def read_stat(pid):
    """(ppid, utime + stime + cutime + cstime in seconds) of `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) S ppid ...": comm may hold spaces and parentheses; split at the last ')'.
    fields = data[data.rfind(")") + 2:].split()
    # fields[0] is the state (field 3); utime..cstime are fields 14..17.
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / TICKS


def process_tree(root):
    """`root` and every live descendant of it (a /proc scan: this kernel may lack the
    task/*/children files)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = read_stat(int(entry))
            if st is not None:
                parents[int(entry)] = st[0]
    tree, frontier = {root}, [root]
    children = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        pid = frontier.pop()
        for c in children.get(pid, ()):
            if c not in tree:
                tree.add(c)
                frontier.append(c)
    return sorted(tree) if root in parents else []


def read_pss_kib(pid):
    """The `Pss:` line of /proc/PID/smaps_rollup in KiB; 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_pss_kib(root):
    """PSS summed over `root` and its descendants, in KiB, and how many processes."""
    pids = process_tree(root)
    return sum(read_pss_kib(p) for p in pids), len(pids)


def tree_cpu_seconds(root):
    """CPU seconds of `root` and its live descendants, each with its reaped children's."""
    total = 0.0
    for pid in process_tree(root):
        st = read_stat(pid)
        if st is not None:
            total += st[1]
    return total


class PssSampler(threading.Thread):
    """Samples the tree's summed PSS every `interval` seconds until stop(); keeps the peak."""

    def __init__(self, root, interval):
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak_kib, self.peak_processes, self.samples = 0, 0, 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def sample(self):
        kib, n = tree_pss_kib(self.root)
        with self._lock:
            self.samples += 1
            if kib > self.peak_kib:
                self.peak_kib, self.peak_processes = kib, n

    def run(self):
        while not self._halt.wait(self.interval):
            self.sample()

    def stop(self):
        self._halt.set()
        self.join()


# --- running one peer ---------------------------------------------------------------------------
def run_peer(name, command, cpus=None, interval=0.1, timeout=900, env=None, pss=True):
    """Runs `command` (a list) speaking the peers protocol (see peerlib.py) and measures it.
    Returns a row: {"images_per_s", "epochs_images_per_s", "cpu_ms_per_image",
    "first_batch_s", "peak_pss_mib", "processes", "version"} or {"error": why}. With `pss`
    false nothing samples the PSS (peak_pss_mib and processes are None), so the timing is the
    peer's alone."""
    def pin():
        if cpus:
            os.sched_setaffinity(0, cpus)

    try:
        # stdin is closed only once stdout ends: a peer may wait for that to exit (the test's
        # fake peer does, so that its last "@mark" is measured while it still runs).
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=pin, env=env)
    except OSError as e:
        return {"error": f"cannot start {shlex.join(command)}: {e}"}
    sampler = PssSampler(proc.pid, interval)
    if pss:
        sampler.start()
    stderr_lines = []
    drain = threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True)
    drain.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    marks, first, last = [], {}, ""
    for line in proc.stdout:
        if line.startswith("@start") or line.startswith("@first"):
            first[line.strip()] = tree_cpu_seconds(proc.pid)
        elif line.startswith("@mark"):
            marks.append(tree_cpu_seconds(proc.pid))
            if pss:
                sampler.sample()  # the PSS at each epoch's end too, whatever the interval
        elif line.strip():
            last = line.strip()
    proc.stdin.close()
    status = proc.wait()
    killer.cancel()
    if pss:
        sampler.stop()
    drain.join()
    try:
        result = json.loads(last) if last else {}
    except json.JSONDecodeError:
        result = {}
    if not isinstance(result, dict):
        result = {}
    if status != 0 or "error" in result or "images" not in result:
        why = result.get("error")
        if not why:
            tail = [l.strip() for l in stderr_lines if l.strip()]
            why = tail[-1][:300] if tail else "no output"
            why = f"exit status {status}: {why}"
        return {"error": why}
    images = result["images"]
    seconds = result.get("epoch_seconds") or []
    if not seconds or images <= 0 or len(marks) != len(seconds) + 1:
        return {"error": f"malformed result ({len(marks)} marks, {len(seconds)} epochs)"}
    cpu = [(b - a) for a, b in zip(marks, marks[1:])]
    rates = [images / s for s in seconds]
    return {
        "images_per_s": statistics.median(rates),
        "epochs_images_per_s": rates,
        "cpu_ms_per_image": 1e3 * statistics.median(cpu) / images,
        "first_batch_s": result.get("first_batch_s"),
        "first_batch_cpu_s": (first["@first"] - first["@start"]
                              if "@first" in first and "@start" in first else None),
        "peak_pss_mib": sampler.peak_kib / 1024 if pss else None,
        "processes": sampler.peak_processes if pss else None,
        "pss_samples": sampler.samples,
        "images": images,
        "version": result.get("version", ""),
    }


def merge_rounds(runs, pss_runs=()):
    """The rows of several timed rounds of one peer, and of its PSS runs, as one: each timing
    the median of the timed rounds that ran, the peak PSS the median of the PSS runs' (of the
    timed rounds' where those sampled it); an error only when no timed round ran (then the
    last round's)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return dict(runs[-1], rounds=len(runs))
    row = {"rounds": len(runs), "rounds_ok": len(ok)}
    for key in ("images_per_s", "cpu_ms_per_image", "first_batch_s", "first_batch_cpu_s"):
        values = [r[key] for r in ok if r.get(key) is not None]
        row[key] = statistics.median(values) if values else None
    sampled = [r for r in pss_runs if "error" not in r and r.get("peak_pss_mib") is not None]
    sampled = sampled or [r for r in ok if r.get("peak_pss_mib") is not None]
    row["peak_pss_mib"] = statistics.median(r["peak_pss_mib"] for r in sampled) if sampled else None
    row["pss_runs"] = len(sampled)
    failed = [r["error"] for r in pss_runs if "error" in r]
    if not sampled and failed:
        row["pss_error"] = failed[-1]  # why the peak is missing
    row["rounds_images_per_s"] = [r["images_per_s"] for r in ok]
    row["processes"] = max((r["processes"] for r in sampled), default=None)
    row["images"] = ok[0]["images"]
    row["version"] = ok[0]["version"]
    return row


# --- ratios and the report ----------------------------------------------------------------------
def value(rows, name, field):
    row = rows.get(name)
    if not row or "error" in row:
        return None
    return row.get(field)


def compute_targets(rows, recipe=None):
    out = []
    for label, num, den, field, op, target in targets_for(recipe):
        a = value(rows, num, field)
        dens = den if isinstance(den, tuple) else (den,)
        vals = [(value(rows, d, field), d) for d in dens]
        vals = [(v, d) for v, d in vals if v is not None]
        ratio, against = None, None
        if a is not None and vals:
            # the strongest peer: fastest for images/s, smallest for the others
            v, against = (max if op == ">=" else min)(vals)
            if v > 0:
                ratio = a / v
        met = None if ratio is None else (ratio >= target if op == ">=" else ratio <= target)
        out.append({"name": label, "against": against, "value": ratio,
                    "target": f"{op} {target:g}", "aim": AIMS.get(label), "met": met})
    return out


def ratios_to(rows, base="coload_threads"):
    """images/s of `base` over each row's, and each row's CPU per image over `base`'s."""
    out = {}
    b = value(rows, base, "images_per_s")
    bc = value(rows, base, "cpu_ms_per_image")
    for name in rows:
        r = value(rows, name, "images_per_s")
        c = value(rows, name, "cpu_ms_per_image")
        out[name] = {"speed": b / r if b and r else None,
                     "cpu": c / bc if bc and c else None}
    return out


def report_json(rows, meta):
    return {"meta": meta, "rows": rows, "ratios_to_coload_threads": ratios_to(rows),
            "targets": compute_targets(rows, meta.get("recipe"))}


RECIPE_WORDS = {
    None: "RandomResizedCrop 224 + flip + normalise",
    "classic": "the classic recipe (RandomResizedCrop 224 + flip + normalise)",
    "resnet50": "the resnet50 recipe (RandomResizedCrop 176, flip, TrivialAugmentWide, "
                "normalise, RandomErasing 0.1, MixUp 0.2 / CutMix 1.0)",
}


def fmt(v, spec):
    """`v` formatted by `spec`, or "-" right-aligned to the same width."""
    if v is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width) if width.isdigit() else 0)
    return format(v, spec)


def report_table(rows, meta):
    lines = [
        f"peers: {meta['images']} images under {meta['root']} ({meta['folder_mib']:.1f} MiB, "
        f"page cache warm), {RECIPE_WORDS[meta.get('recipe')]}, batch 64, "
        f"{meta['workers']} workers/threads, CPUs {meta['cpus']}",
        f"{meta['rounds']} round(s) x (1 warm-up + {meta['epochs']} timed epochs), medians; "
        + (f"peak PSS from {meta['pss_runs']} more run(s) per peer; "
           if meta.get("pss_runs") else "PSS sampled in the timed rounds; ")
        + f"load average {meta['loadavg_before']} before, {meta['loadavg_after']} after; "
        f"{meta['date']}, {meta['machine']}",
        "",
        f"{'peer':<17} {'images/s':>9} {'CPU ms/img':>10} {'coload x':>9} {'CPU x':>6} "
        f"{'1st batch s':>11} {'(CPU s)':>7} {'peak PSS MiB':>12}  note",
    ]
    ratio = ratios_to(rows)
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"{name:<17} {'-':>9} {'-':>10} {'-':>9} {'-':>6} {'-':>11} {'-':>7} "
                         f"{'-':>12}  "
                         f"FAILED: {row['error']}")
            continue
        lines.append(
            f"{name:<17} {fmt(row['images_per_s'], '9.1f')} "
            f"{fmt(row['cpu_ms_per_image'], '10.2f')} {fmt(ratio[name]['speed'], '9.2f')} "
            f"{fmt(ratio[name]['cpu'], '6.2f')} {fmt(row['first_batch_s'], '11.3f')} "
            f"{fmt(row.get('first_batch_cpu_s'), '7.2f')} "
            f"{fmt(row['peak_pss_mib'], '12.0f')}  {row.get('version', '')}")
    lines += ["", "coload x: coload_threads' images/s over the row's; CPU x: the row's CPU per "
              "image over coload_threads'; (CPU s): CPU seconds of the peer's processes from "
              "constructing the loader to the first batch", "", f"{'target':<58} {'value':>7} {'target':>7}  status"]
    for t in compute_targets(rows, meta.get("recipe")):
        status = "unknown" if t["met"] is None else "met" if t["met"] else "MISSED"
        if t["met"] and t["aim"] and t["value"] < t["aim"]:
            status += f" (aim {t['aim']:g})"
        against = f" [{t['against']}]" if t["against"] and "best" in t["name"] else ""
        lines.append(f"{t['name']:<58} {fmt(t['value'], '7.3f')} {t['target']:>7}  {status}"
                     f"{against}")
    return "\n".join(lines)


# --- setup --------------------------------------------------------------------------------------
def ensure_venv(log):
    python = os.path.join(VENV, "bin", "python")
    script = os.path.join(HERE, "setup_venv.sh")
    log(f"peers: setting up {VENV} (setup_venv.sh; quick once done)")
    r = subprocess.run(["sh", script], stdout=sys.stderr, stderr=sys.stderr)
    return python if r.returncode == 0 and os.access(python, os.X_OK) else None


def ensure_coload(build, log):
    exe = os.path.join(build, "tools", "bench", "peers", "coload_peer")
    r = subprocess.run(["ninja", "-C", build, "tools/bench/peers/coload_peer"],
                       stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode != 0 or not os.access(exe, os.X_OK):
        return None
    return exe


def make_folder(build, out, log):
    exe = os.path.join(build, "tools", "gen", "make_image_folder")
    if not os.path.isdir(out):
        subprocess.run(["ninja", "-C", build, "tools/gen/make_image_folder"], check=True,
                       stdout=sys.stderr, stderr=sys.stderr)
        log(f"peers: generating {out} (tools/gen/make_image_folder, 10 x 100 synthetic JPEGs)")
        subprocess.run([exe, out, "--classes", "10", "--per-class", "100"], check=True,
                       stdout=sys.stderr, stderr=sys.stderr)
    return out


def make_shards(build, root, log):
    """Plain and --fast-crop shards of ROOT (coload-shard, the same order), written once under
    ~/.cache/coload/peers-shards: {"plain": dir, "fast": dir}."""
    exe = os.path.join(build, "tools", "shard", "coload-shard")
    subprocess.run(["ninja", "-C", build, "tools/shard/coload-shard"], check=True,
                   stdout=sys.stderr, stderr=sys.stderr)
    tag = os.path.realpath(root).strip("/").replace("/", "_")
    out = {}
    for kind, extra in (("plain", []), ("fast", ["--fast-crop"])):
        d = os.path.expanduser(f"~/.cache/coload/peers-shards/{tag}-{kind}")
        if not os.path.isfile(os.path.join(d, "shards.txt")):
            log(f"peers: writing {kind} shards of {root} into {d}")
            subprocess.run([exe, root, d, "--seed", "0"] + extra, check=True,
                           stdout=sys.stderr, stderr=sys.stderr)
        out[kind] = d
    return out


def shards_mib(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
               if f.endswith(".tar")) / 2**20


def warm_cache(root):
    total, count = 0, 0
    for dirpath, _, files in os.walk(root, followlinks=True):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                total += len(fh.read())
            count += 1
    return total, count


def torch_recipe(args):
    """The PyTorch peers' flag for --recipe resnet50 (transforms.v2's equivalent)."""
    return ["--recipe", "resnet50"] if getattr(args, "recipe", None) == "resnet50" else []


def resnet50_missing(args, name):
    """Why a peer has no row for --recipe resnet50, or None. The PyTorch peers run
    transforms.v2's equivalent, DALI its auto_aug.trivial_augment_wide, fn.erase and v2's
    MixUp/CutMix on the batch, tf.data tf_recipes.py's ops; SPDL has no image augmentation of
    its own (FFmpeg filters: no TrivialAugmentWide). The decode-only rows time no transform,
    as always."""
    if getattr(args, "recipe", None) != "resnet50" or name.startswith(("coload_", "torch",
                                                                       "decode_", "dali_",
                                                                       "tfdata")):
        return None
    return ("no resnet50 equivalent for this peer (SPDL decodes through FFmpeg filters: no "
            "TrivialAugmentWide, RandomErasing or MixUp/CutMix): its row would time a "
            "different recipe")


# The coload package's venv (tools/ci/python.sh builds it there); COLOAD_PYTHON overrides it.
COLOAD_PYTHON = os.path.expanduser(os.environ.get(
    "COLOAD_PYTHON", "~/.cache/coload/venv-torch-2.11.0/bin/python"))


def coload_python_command(args, common, script):
    """coload_python's command, or why it cannot run (no venv yet, or no package in it)."""
    if not os.access(COLOAD_PYTHON, os.X_OK):
        return f"no {COLOAD_PYTHON} (tools/ci/python.sh makes that venv and installs coload in it)"
    check = subprocess.run([COLOAD_PYTHON, "-c", "import coload"], capture_output=True)
    if check.returncode != 0:
        return (f"the coload package does not import in {COLOAD_PYTHON} "
                "(tools/ci/python.sh installs it)")
    recipe = ["--recipe", args.recipe] if getattr(args, "recipe", None) else []
    return [COLOAD_PYTHON, script("peer_coload_python.py")] + common + recipe


def commands(args, coload_exe, venv_python):
    """name -> the command list, or a string saying why it cannot run."""
    common = [args.root, "--epochs", str(args.epochs)]
    workers = ["--workers", str(args.workers)]
    threads = ["--threads", str(args.workers)]
    script = lambda s: os.path.join(HERE, s)  # noqa: E731
    cmds = {}
    for name, (_, kind) in PEERS.items():
        if kind == "coload" and not coload_exe:
            cmds[name] = "coload_peer is not built (ninja -C BUILD tools/bench/peers/coload_peer)"
            continue
        if kind == "venv" and not venv_python:
            cmds[name] = f"the peers' venv ({VENV}) could not be set up: see setup_venv.sh's output"
            continue
        if kind == "coload_python":
            cmds[name] = coload_python_command(args, common + workers, script)
            continue
        if name in ("coload_shards", "coload_shards_fast"):
            shards = getattr(args, "shards", None)
            if not shards:
                cmds[name] = "no shards were written (coload-shard)"
                continue
            d = shards["fast" if name.endswith("_fast") else "plain"]
            recipe = ["--recipe", args.recipe] if getattr(args, "recipe", None) else []
            cmds[name] = ([coload_exe, d, "--epochs", str(args.epochs)] + workers +
                          ["--mode", "shards"] + recipe)
            continue
        if resnet50_missing(args, name):
            cmds[name] = resnet50_missing(args, name)
        elif name.startswith("coload_"):
            recipe = ["--recipe", args.recipe] if getattr(args, "recipe", None) else []
            cmds[name] = [coload_exe] + common + workers + ["--mode", name.split("_")[1]] + recipe
        elif name == "decode_full":
            cmds[name] = [coload_exe] + common + workers + ["--mode", "decode"]
        elif name == "decode_entropy":
            cmds[name] = [coload_exe] + common + workers + ["--mode", "entropy"]
        elif name == "torch2_default":
            cmds[name] = [venv_python, script("peer_torch.py")] + common + workers + [
                "--config", "default"] + torch_recipe(args)
        elif name == "torch2_tuned":
            cmds[name] = [venv_python, script("peer_torch.py")] + common + workers + [
                "--config", "tuned", "--prefetch-factor", str(args.prefetch_factor)] + torch_recipe(args)
        elif name == "torch113_default":
            cmds[name] = ["/usr/bin/python3", script("peer_torch.py")] + common + workers + [
                "--config", "default"] + torch_recipe(args)
        else:
            # DALI and tf.data take the recipe; SPDL has only the classic one (its default).
            recipe = (["--recipe", args.recipe] if getattr(args, "recipe", None) and
                      name in ("dali_cpu", "tfdata") else [])
            cmds[name] = ([venv_python, script(f"peer_{name.replace('_cpu', '')}.py")] + common +
                          threads + recipe)
    return cmds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", nargs="?", help="an ImageFolder tree (default: a generated 10 x 100 "
                   "one under ~/.cache/coload/peers-folder)")
    p.add_argument("--peers", help="comma-separated peers to run (default all): " +
                   ", ".join(PEERS))
    # NOTE: every peer's default transform is the classic preset's equivalent
    # (RandomResizedCrop 224, flip, ToTensor, Normalize); --recipe classic runs coload's peers
    # through vision::Recipe instead of the fixed TrainTransform. --recipe resnet50 runs every
    # peer with its own equivalent of torchvision's ResNet-50 recipe (SPDL's row says it has
    # none) and judges coload by RESNET50_TARGETS.
    p.add_argument("--recipe", choices=["classic", "resnet50"],
                   help="coload's peers run this preset's train Recipe (default: TrainTransform)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per run (default 3)")
    p.add_argument("--quick", action="store_true", help="1 round of 1 timed epoch")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--cpus", default="0,1", help="CPUs every peer is pinned to (default 0,1)")
    p.add_argument("--workers", type=int, default=2,
                   help="worker threads or processes of every peer (default 2); the issue's "
                   "figures are at 2, more shows how each start grows with its workers")
    p.add_argument("--prefetch-factor", type=int, default=2,
                   help="torch2_tuned's prefetch_factor (default 2, the best of 2/4/8 here "
                   "with torch 2.15: see docs/performance.md)")
    p.add_argument("--sample-interval", type=float, default=0.1,
                   help="seconds between PSS samples (default 0.1)")
    p.add_argument("--pss-runs", type=int, default=1,
                   help="runs of each peer that sample its PSS, after the timed rounds, which "
                   "do not (default 1; 0 samples during the timed rounds instead)")
    p.add_argument("--build", default=os.path.join(REPO, "build"), help="coload's build folder")
    p.add_argument("--no-setup", action="store_true",
                   help="do not set up the venv (its peers fail if it is missing)")
    p.add_argument("--peer-command", action="append", default=[], metavar="NAME=CMD",
                   help="add (or replace) a peer run by this shell command (used by the test)")
    args = p.parse_args(argv)
    if args.workers < 1 or args.rounds < 1:
        p.error("--workers and --rounds must be at least 1")
    if args.quick:
        args.rounds, args.epochs = 1, 1
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    extra = {}
    for spec in args.peer_command:
        name, sep, cmd = spec.partition("=")
        if not sep or not name:
            p.error(f"--peer-command {spec!r}: expected NAME=CMD")
        extra[name] = shlex.split(cmd)
    selected = args.peers.split(",") if args.peers else list(PEERS) + list(extra)
    unknown = [n for n in selected if n not in PEERS and n not in extra]
    if unknown:
        p.error(f"--peers: unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    cpus = {int(c) for c in args.cpus.split(",")} if args.cpus else None
    if cpus:
        cpus &= os.sched_getaffinity(0)

    needs = {PEERS[n][1] for n in selected if n in PEERS}
    if args.root is None:
        args.root = make_folder(args.build, os.path.expanduser(
            "~/.cache/coload/peers-folder/gen-10x100"), log)
    if not os.path.isdir(args.root):
        p.error(f"ROOT {args.root!r} is not a directory")
    coload_exe = ensure_coload(args.build, log) if "coload" in needs else None
    venv_python = None
    if "venv" in needs:
        venv_python = None if args.no_setup else ensure_venv(log)
        if args.no_setup and os.access(os.path.join(VENV, "bin", "python"), os.X_OK):
            venv_python = os.path.join(VENV, "bin", "python")
    if coload_exe and {"coload_shards", "coload_shards_fast"} & set(selected):
        args.shards = make_shards(args.build, args.root, log)
        for d in args.shards.values():
            warm_cache(d)  # as the folder: every peer finds the page cache warm
    cmds = commands(args, coload_exe, venv_python)
    cmds.update(extra)

    folder_bytes, images = warm_cache(args.root)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs = {n: [] for n in selected}
    pss_runs = {n: [] for n in selected}
    timed_sampling = args.pss_runs <= 0
    for r in range(args.rounds + max(args.pss_runs, 0)):
        timed = r < args.rounds
        for name in selected:
            cmd = cmds[name]
            if isinstance(cmd, str):
                (runs if timed else pss_runs)[name].append({"error": cmd})
                continue
            if not timed and all("error" in x for x in runs[name]):
                continue  # it never ran: no PSS run (it could cost the whole timeout again)
            what = (f"round {r + 1}/{args.rounds}" if timed
                    else f"PSS run {r - args.rounds + 1}/{args.pss_runs}")
            log(f"peers: {what}: {name}: {shlex.join(cmd)}")
            row = run_peer(name, cmd, cpus, args.sample_interval, pss=not timed or timed_sampling)
            log(f"peers:   -> {json.dumps(row)}")
            (runs if timed else pss_runs)[name].append(row)
    rows = {n: merge_rounds(runs[n], pss_runs[n]) for n in selected}
    for n, row in rows.items():
        row["what"] = PEERS[n][0] if n in PEERS else "extra peer (--peer-command)"
    meta = {
        "root": args.root, "images": images, "folder_mib": folder_bytes / 2**20,
        "rounds": args.rounds, "pss_runs": max(args.pss_runs, 0), "epochs": args.epochs,
        "batch_size": 64, "workers": args.workers, "recipe": args.recipe,
        "cpus": ",".join(map(str, sorted(cpus))) if cpus else "all",
        "loadavg_before": load_before,
        "loadavg_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.release()}",
        "page_cache": "warm (every file read once before timing)",
    }
    if getattr(args, "shards", None):
        for kind, d in args.shards.items():
            meta[f"shards_{kind}_mib"] = shards_mib(d)
        meta["shards_fast_over_plain"] = meta["shards_fast_mib"] / meta["shards_plain_mib"]
    if args.json:
        print(json.dumps(report_json(rows, meta)))
    else:
        print(report_table(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
