#!/usr/bin/env python3
"""tools/bench/peers' own logic, with fake peers (no venv, no coload build, no images decoded):

- the PSS sum: a tree of 3 processes, each holding its own touched private memory, plus a
  shared mapping all three touch, sums to the private memory plus the shared mapping once
  (PSS, not RSS, which would count it three times), over exactly those 3 processes;
- a peer's row: images/s from the epochs it reports (median), CPU per image counting a worker
  process that has exited and been reaped, the peak PSS seen at its marks, first batch passed
  through;
- failures: a peer's own {"error": ...} is its row's note, a crash gives its exit status and
  last stderr line, a missing program says it cannot start;
- the report: --json prints one object with meta, rows, ratios and every target; rounds merge
  into medians; the table names a failed peer.

usage: peers_test.py PEERS_PY
"""
import argparse
import contextlib
import importlib.util
import io
import json
import mmap
import os
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def load(path):
    spec = importlib.util.spec_from_file_location("peers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MIB = 1 << 20

# A tree: parent (40 MiB private) -> child (24 MiB) -> grandchild (16 MiB), all touching one
# 32 MiB shared mapping made before the forks. Each says "ready" once it has touched its memory,
# then all wait for stdin to close.
TREE = r"""
import mmap, os, sys
MIB = 1 << 20
shared = mmap.mmap(-1, 32 * MIB, flags=mmap.MAP_SHARED)
def touch(buf):
    for i in range(0, len(buf), 4096):
        buf[i] = 1
touch(shared)
r, w = os.pipe()
held = []
def hold(mib):
    b = bytearray(mib * MIB)
    touch(b)
    held.append(b)
    for i in range(0, len(shared), 4096):  # map every shared page in this process too
        _ = shared[i]
pid = os.fork()
if pid == 0:
    pid2 = os.fork()
    if pid2 == 0:
        hold(16)
        os.write(w, b"g")
        os._exit(0 if sys.stdin.read() == "" else 1)
    hold(24)
    os.write(w, b"c")
    sys.stdin.read()
    os.waitpid(pid2, 0)
    os._exit(0)
hold(40)
got = b""
while len(got) < 2:
    got += os.read(r, 2)
print("ready", flush=True)
sys.stdin.read()
os.waitpid(pid, 0)
"""

# A peer speaking the protocol: 48 MiB held through the run, a worker process that burns
# 0.3 s of CPU and is reaped inside the first timed epoch, fixed epoch times.
FAKE_PEER = r"""
import json, os, sys, time
buf = bytearray(48 << 20)
for i in range(0, len(buf), 4096):
    buf[i] = 1
print("@mark", flush=True)
pid = os.fork()
if pid == 0:
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    os._exit(0)
os.waitpid(pid, 0)
print("@mark", flush=True)
print("@mark", flush=True)
print("@mark", flush=True)
print(json.dumps({"images": 100, "epoch_seconds": [2.0, 1.0, 4.0], "first_batch_s": 0.125,
                  "version": "fake 1.0"}), flush=True)
sys.stdout.flush()
os.close(1)  # sys.stdout.close() would leave fd 1 open
sys.stdin.read()  # until the bench has read everything
"""

REFUSING_PEER = r"""
import json, sys
print(json.dumps({"error": "no GPU here"}), flush=True)
sys.exit(1)
"""

CRASHING_PEER = r"""
import sys
print("@mark", flush=True)
print("something went wrong in the loader", file=sys.stderr, flush=True)
sys.exit(3)
"""


def main():
    peers = load(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="peers_test_")
    scripts = {}
    for name, text in [("tree", TREE), ("fake", FAKE_PEER), ("refusing", REFUSING_PEER),
                       ("crashing", CRASHING_PEER)]:
        scripts[name] = os.path.join(tmp, name + ".py")
        with open(scripts[name], "w") as f:
            f.write(text)
    py = sys.executable

    # 1. The PSS sum over a process tree.
    proc = subprocess.Popen([py, scripts["tree"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    check(proc.stdout.readline().strip() == "ready", "the tree came up")
    pids = peers.process_tree(proc.pid)
    kib, n = peers.tree_pss_kib(proc.pid)
    proc.stdin.close()
    proc.wait()
    check(n == 3 and len(pids) == 3 and proc.pid in pids,
          f"the tree has 3 processes, got {n}: {pids}")
    mib = kib / 1024
    # 80 MiB private + 32 MiB shared counted once = 112; each interpreter adds ~5-15 MiB.
    check(112 <= mib < 112 + 60, f"tree PSS {mib:.1f} MiB, expected 112 to 172")
    check(peers.tree_pss_kib(proc.pid) == (0, 0), "a gone process has no tree")
    check(peers.read_pss_kib(proc.pid) == 0, "a gone process's PSS is 0")

    # 2. One peer's row.
    row = peers.run_peer("fake", [py, scripts["fake"]], cpus=None, interval=60)
    check("error" not in row, f"fake peer ran: {row}")
    if "error" not in row:
        check(row["images_per_s"] == 50.0, f"median of 50, 100, 25 images/s: {row['images_per_s']}")
        check(row["epochs_images_per_s"] == [50.0, 100.0, 25.0], f"rates {row['epochs_images_per_s']}")
        check(row["first_batch_s"] == 0.125, f"first batch {row['first_batch_s']}")
        check(row["version"] == "fake 1.0", f"version {row['version']}")
        check(48 <= row["peak_pss_mib"] < 48 + 30, f"peak PSS {row['peak_pss_mib']:.1f} MiB")
        check(row["processes"] in (1, 2), f"processes {row['processes']}")  # the worker may be seen
    row = peers.run_peer("fake", [py, scripts["fake"]], cpus=None, interval=0.01, pss=False)
    check("error" not in row and row.get("images_per_s") == 50.0, f"unsampled run: {row}")
    check(row.get("peak_pss_mib") is None and row.get("processes") is None
          and row.get("pss_samples") == 0, f"pss=False samples nothing: {row}")
    marks_cpu = []
    orig = peers.tree_cpu_seconds
    peers.tree_cpu_seconds = lambda pid: marks_cpu.append(orig(pid)) or marks_cpu[-1]
    peers.run_peer("fake", [py, scripts["fake"]], cpus=None, interval=60)
    peers.tree_cpu_seconds = orig
    check(len(marks_cpu) == 4 and marks_cpu[1] - marks_cpu[0] >= 0.28,
          f"the reaped worker's 0.3 s CPU is counted between marks 1 and 2: {marks_cpu}")

    # 3. Failures.
    row = peers.run_peer("refusing", [py, scripts["refusing"]])
    check(row == {"error": "no GPU here"}, f"a peer's own error is its note: {row}")
    row = peers.run_peer("crashing", [py, scripts["crashing"]])
    check(row.get("error") == "exit status 3: something went wrong in the loader",
          f"a crash names its status and stderr: {row}")
    row = peers.run_peer("missing", [os.path.join(tmp, "no-such-program")])
    check("cannot start" in row.get("error", ""), f"a missing program: {row}")

    # 4. The report, through main(): JSON and table.
    root = os.path.join(tmp, "folder", "a")
    os.makedirs(root)
    with open(os.path.join(root, "x.jpg"), "wb") as f:
        f.write(b"\xff\xd8")
    argv = [os.path.join(tmp, "folder"), "--no-setup", "--rounds", "2", "--cpus", "",
            "--peers", "fake,refusing", "--peer-command", f"fake={py} {scripts['fake']}",
            "--peer-command", f"refusing={py} {scripts['refusing']}"]
    # The timed rounds run unsampled; one more run per peer gives the PSS.
    calls = []
    orig_run_peer = peers.run_peer
    peers.run_peer = lambda *a, **k: calls.append(k.get("pss")) or orig_run_peer(*a, **k)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        peers.main(argv + ["--json"])
    peers.run_peer = orig_run_peer
    check(calls == [False, False, False, False, True],
          f"2 timed rounds of 2 peers unsampled, then 1 sampled run of the one that ran: {calls}")
    merged = peers.merge_rounds([{"images_per_s": 1.0, "cpu_ms_per_image": 1.0,
                                  "first_batch_s": 0.1, "first_batch_cpu_s": 0.1,
                                  "peak_pss_mib": None, "processes": None, "images": 1,
                                  "version": "v"}], [{"error": "killed"}])
    check(merged["peak_pss_mib"] is None and merged.get("pss_error") == "killed",
          f"a failed PSS run says why the peak is missing: {merged}")
    text = out.getvalue()
    check(text.count("\n") == 1, "--json prints one line")
    try:
        j = json.loads(text)
    except json.JSONDecodeError:
        j = {}
        check(False, f"--json prints JSON: {text[:200]}")
    if j:
        check(list(j) == ["meta", "rows", "ratios_to_coload_threads", "targets"], f"keys {list(j)}")
        check(list(j["rows"]) == ["fake", "refusing"], f"rows {list(j['rows'])}")
        check(j["rows"]["fake"]["rounds"] == 2 and j["rows"]["fake"]["rounds_ok"] == 2,
              f"rounds {j['rows']['fake']}")
        check(j["rows"]["fake"]["images_per_s"] == 50.0, "merged median")
        fake = j["rows"]["fake"]
        check(fake["pss_runs"] == 1 and fake["peak_pss_mib"] is not None
              and 48 <= fake["peak_pss_mib"] < 48 + 30,
              f"the peak PSS comes from the sampled run: {fake}")
        check(j["rows"]["refusing"]["error"] == "no GPU here", "the failed row in JSON")
        check(len(j["targets"]) == len(peers.TARGETS) and
              all(t["met"] is None for t in j["targets"]),
              "every target, unknown without coload's rows")
        check(j["meta"]["images"] == 1 and j["meta"]["rounds"] == 2 and j["meta"]["pss_runs"] == 1,
              f"meta {j['meta']}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        peers.main(argv)
    table = out.getvalue()
    check("FAILED: no GPU here" in table, "the table names the failed peer's reason")
    check(any(l.startswith("fake ") and " 50.0 " in l for l in table.splitlines()),
          "the table has the fake peer's rate")

    # 5. --workers reaches every peer: workers for coload and PyTorch, threads for the others.
    ns = argparse.Namespace(root="R", epochs=1, workers=4, prefetch_factor=4,
                            shards={"plain": "S-plain", "fast": "S-fast"})
    # coload_python's row needs an interpreter that imports coload: a stand-in that says yes (a
    # fresh machine has no package venv before CI's Python stage makes it).
    fake_python = os.path.join(tmp, "fake-python")
    with open(fake_python, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(fake_python, 0o755)
    real_python, peers.COLOAD_PYTHON = peers.COLOAD_PYTHON, fake_python
    cmds = peers.commands(ns, "coload_peer", "venv-python")
    peers.COLOAD_PYTHON = real_python
    check(cmds["coload_python"][0] == fake_python, f"coload_python runs in COLOAD_PYTHON: {cmds['coload_python']}")
    peers.COLOAD_PYTHON = os.path.join(tmp, "no-such-python")
    why = peers.commands(ns, "coload_peer", "venv-python")["coload_python"]
    peers.COLOAD_PYTHON = real_python
    check(isinstance(why, str) and why.startswith(f"no {tmp}/no-such-python (tools/ci/python.sh"),
          f"without the package's venv, coload_python's row says why: {why}")
    for name in peers.PEERS:
        flag = "--threads" if name in ("dali_cpu", "spdl", "tfdata") else "--workers"
        check(flag in cmds[name] and cmds[name][cmds[name].index(flag) + 1] == "4",
              f"{name} runs with 4 workers: {cmds[name]}")
    # coload_peer's rows: each its own mode (a row that ran another's would time the wrong thing).
    modes = {"coload_threads": "threads", "coload_processes": "processes", "decode_full": "decode",
             "decode_entropy": "entropy"}
    for name, mode in modes.items():
        check(cmds[name][0] == "coload_peer" and
              cmds[name][cmds[name].index("--mode") + 1] == mode, f"{name} runs --mode {mode}")
    # The shards rows read the shards the bench wrote, plain and --fast-crop.
    for name, folder in (("coload_shards", "S-plain"), ("coload_shards_fast", "S-fast")):
        check(cmds[name][:2] == ["coload_peer", folder] and
              cmds[name][cmds[name].index("--mode") + 1] == "shards", f"{name}: {cmds[name]}")

    # --recipe resnet50: every peer runs its own equivalent but SPDL, which says it has none;
    # the decode rows time no transform; --recipe classic reaches coload's rows, DALI and tf.data.
    ns.recipe = "resnet50"
    cmds = peers.commands(ns, "coload_peer", "venv-python")
    for name in ("coload_threads", "coload_processes", "coload_shards", "torch2_tuned",
                 "torch2_default", "torch113_default", "dali_cpu", "tfdata"):
        check(isinstance(cmds[name], list) and
              cmds[name][cmds[name].index("--recipe") + 1] == "resnet50",
              f"{name} runs the resnet50 recipe: {cmds[name]}")
    check(isinstance(cmds["spdl"], str) and "no resnet50 equivalent" in cmds["spdl"],
          f"spdl says it has no resnet50 equivalent: {cmds['spdl']}")
    check("--recipe" not in cmds["decode_full"], f"decode_full: {cmds['decode_full']}")
    ns.recipe = "classic"
    cmds = peers.commands(ns, "coload_peer", "venv-python")
    check("--recipe" not in cmds["spdl"] and cmds["dali_cpu"][-2:] == ["--recipe", "classic"],
          f"classic: spdl takes no --recipe, dali does: {cmds['spdl']} {cmds['dali_cpu']}")

    # 6. The targets' arithmetic, on made-up rows.
    rows = {"coload_threads": {"images_per_s": 800.0, "cpu_ms_per_image": 0.8,
                               "first_batch_s": 0.05, "peak_pss_mib": 300.0},
            "torch2_tuned": {"images_per_s": 200.0, "cpu_ms_per_image": 4.0,
                             "first_batch_s": 1.0, "peak_pss_mib": 800.0},
            "dali_cpu": {"images_per_s": 300.0}, "spdl": {"error": "x"},
            "tfdata": {"images_per_s": 500.0}, "decode_full": {"cpu_ms_per_image": 1.0}}
    t = {x["name"]: x for x in peers.compute_targets(rows)}
    check(t[peers.TARGETS[0][0]]["value"] == 4.0 and t[peers.TARGETS[0][0]]["met"], "x tuned")
    best = t[peers.TARGETS[1][0]]
    check(best["against"] == "tfdata" and best["value"] == 1.6 and best["met"],
          f"against the fastest other peer: {best}")
    check(abs(t[peers.TARGETS[2][0]]["value"] - 0.8) < 1e-12 and t[peers.TARGETS[2][0]]["met"],
          "CPU vs decode")
    check(t[peers.TARGETS[3][0]]["value"] == 0.05 and t[peers.TARGETS[3][0]]["met"], "first batch")
    check(t[peers.TARGETS[4][0]]["met"] is None, "no processes row: unknown")
    check(t[peers.TARGETS[5][0]]["value"] == 0.375 and t[peers.TARGETS[5][0]]["met"] is True,
          "PSS ratio")
    # Rows that miss every target they have figures for, each on its own side of the bound
    # (">=" under it, "<=" over it): a compute_targets that always says "met" fails here.
    rows = {"coload_threads": {"images_per_s": 600.0, "cpu_ms_per_image": 0.9,
                               "first_batch_s": 0.2, "peak_pss_mib": 600.0},
            "coload_processes": {"first_batch_s": 0.15, "peak_pss_mib": 500.0},
            "torch2_tuned": {"images_per_s": 200.0, "first_batch_s": 1.0,
                             "peak_pss_mib": 800.0},
            "dali_cpu": {"images_per_s": 700.0}, "decode_full": {"cpu_ms_per_image": 1.0}}
    t = {x["name"]: x for x in peers.compute_targets(rows)}
    expected = [3.0, 600.0 / 700.0, 0.9, 0.2, 0.15, 0.75, 0.625]
    for (label, *_), value in zip(peers.TARGETS, expected):
        check(t[label]["met"] is False and abs(t[label]["value"] - value) < 1e-12,
              f"{label}: {value:g} misses its target: {t[label]}")
    # Exactly at a target meets it, from either side.
    rows = {"coload_threads": {"images_per_s": 700.0, "first_batch_s": 0.1},
            "torch2_tuned": {"images_per_s": 200.0, "first_batch_s": 1.0}}
    t = {x["name"]: x for x in peers.compute_targets(rows)}
    check(t[peers.TARGETS[0][0]]["met"] is True, f"3.5 meets >= 3.5: {t[peers.TARGETS[0][0]]}")
    check(t[peers.TARGETS[3][0]]["met"] is True, f"0.1 meets <= 0.1: {t[peers.TARGETS[3][0]]}")

    # --recipe resnet50 is judged by its own targets: 3.5x torch2_tuned and 1.5x the best of
    # DALI and tf.data (SPDL, which has no equivalent, is not among them).
    rows = {"coload_threads": {"images_per_s": 600.0}, "torch2_tuned": {"images_per_s": 150.0},
            "dali_cpu": {"images_per_s": 350.0}, "tfdata": {"images_per_s": 450.0},
            "spdl": {"images_per_s": 900.0}}
    t = peers.compute_targets(rows, "resnet50")
    check([x["name"] for x in t] == [x[0] for x in peers.RESNET50_TARGETS],
          f"resnet50's targets: {[x['name'] for x in t]}")
    check(t[0]["value"] == 4.0 and t[0]["met"] is True, f"resnet50 x tuned: {t[0]}")
    check(t[1]["against"] == "tfdata" and abs(t[1]["value"] - 600.0 / 450.0) < 1e-12 and
          t[1]["met"] is False, f"resnet50 against the best of DALI and tf.data: {t[1]}")
    check(len(peers.compute_targets(rows, "classic")) == len(peers.TARGETS),
          "classic keeps the default targets")

    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
