#!/bin/sh
# coload-shard packs a generated image folder; tar -tf and Python's tarfile read the shards and
# find every image's bytes under its key; image_folder --shards trains from them, its loss
# falling. Skips (77) without the example or /usr/bin/python3.
# Then image_folder --shards http://127.0.0.1:PORT/shards trains over the same 96 images served
# by nginx (serve.py; that part is left out when nginx is not installed).
#   coload_shard_test.sh COLOAD_SHARD MAKE_IMAGE_FOLDER IMAGE_FOLDER
set -eu
shard=$1 make_folder=$2 image_folder=$3
[ -x "$image_folder" ] && [ -x /usr/bin/python3 ] || exit 77
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$make_folder" "$tmp/folder" --classes 4 --per-class 24 --seed 1 >/dev/null
"$shard" "$tmp/folder" "$tmp/shards" --shard-size 1MiB --seed 3
n=$(ls "$tmp/shards"/*.tar | wc -l)
[ "$n" -ge 3 ] || { echo "expected several shards, got $n"; exit 1; }
[ "$(wc -l < "$tmp/shards/classes.txt")" -eq 4 ] || { echo "classes.txt"; exit 1; }
members=0
for t in "$tmp/shards"/*.tar; do
  [ -f "$t.idx" ] || { echo "no index beside $t"; exit 1; }
  members=$((members + $(tar -tf "$t" | wc -l)))
done
[ "$members" -eq 192 ] || { echo "tar -tf lists $members members, not 192"; exit 1; }
/usr/bin/python3 - "$tmp/folder" "$tmp/shards" <<'PY'
import glob, os, sys, tarfile
folder, shards = sys.argv[1], sys.argv[2]
classes = sorted(os.listdir(folder))
files = [(os.path.join(folder, c, f), i) for i, c in enumerate(classes)
         for f in sorted(os.listdir(os.path.join(folder, c)))]
seen, order = {}, []
for p in sorted(glob.glob(os.path.join(shards, "*.tar"))):
    with tarfile.open(p) as t:
        for m in t:
            key, field = m.name.split(".", 1)
            seen.setdefault(key, {})[field] = t.extractfile(m).read()
            if field == "cls": order.append(int(key))
# Explicit checks, not `assert`: PYTHONOPTIMIZE would remove those.
def check(ok, what):
    if not ok:
        sys.exit(f"FAIL: {what}")
check(len(seen) == len(files) == 96, f"{len(seen)} samples in the shards, {len(files)} files, not 96")
for k, (path, cls) in enumerate(files):
    s = seen.get("%09d" % k, {})
    check(s.get("jpg") == open(path, "rb").read(), f"{path}: its .jpg in the shards differs")
    check(s.get("cls") is not None and int(s["cls"]) == cls, f"{path}: .cls {s.get('cls')}, not {cls}")
check(order != sorted(order), "--seed did not shuffle")
print("tarfile: all", len(files), "images and labels match")
PY
# A file named ".jpg" is an image, as torchvision's suffix test has it (its extension was taken
# from a dot file's empty one, and the run aborted); a --shard-size past 2^64 bytes is refused,
# naming the flag (its cast was undefined).
mkdir -p "$tmp/dot/a"
cp "$(ls "$tmp/folder"/*/*.jpg | head -n 1)" "$tmp/dot/a/.jpg"
"$shard" "$tmp/dot" "$tmp/dot-shards" > /dev/null
listed=$(tar -tf "$tmp/dot-shards/shard-000000.tar" | tr '\n' ' ')
[ "$listed" = "000000000.jpg 000000000.cls " ] || { echo "a file named .jpg: $listed"; exit 1; }
for bad in inf 1e20; do
  if "$shard" "$tmp/dot" "$tmp/bad" --shard-size $bad 2> "$tmp/bad.err"; then
    echo "--shard-size $bad was taken"; exit 1
  fi
  grep -q "shard-size: not a size: '$bad'" "$tmp/bad.err" || { cat "$tmp/bad.err"; exit 1; }
done
"$image_folder" --shards "$tmp/shards" --epochs 4 --batch-size 16 --workers 2 --json > "$tmp/run.json"
/usr/bin/python3 - "$tmp/run.json" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
# Explicit checks, not `assert`: PYTHONOPTIMIZE would remove those.
if not (len(runs) == 4 and all(r["images"] == 96 for r in runs)):
    sys.exit(f"FAIL: expected 4 epochs of 96 images: {runs}")
if not runs[-1]["loss"] < runs[0]["loss"]:
    sys.exit(f"FAIL: the loss did not fall: {[r['loss'] for r in runs]}")
print("image_folder --shards: loss", [r["loss"] for r in runs])
PY
# --fast-crop: the same folder in the same order with restart markers; image_folder --shards
# gives the digests of the plain shards, epoch by epoch (the crops decode only their intervals).
"$shard" "$tmp/folder" "$tmp/fast" --shard-size 1MiB --seed 3 --fast-crop > "$tmp/fast.txt"
grep -q "; marked 96$" "$tmp/fast.txt" || { echo "--fast-crop: $(cat "$tmp/fast.txt")"; exit 1; }
# Version 3 (a checksum), and members with restart intervals (a fifth field).
head -1 "$tmp/fast"/shard-000000.tar.idx | grep -q "	3$" || { echo "--fast-crop: no version 3 index"; exit 1; }
grep -Eq "^[0-9]+	[0-9]+	[^	]+	jpg	[0-9]+:[0-9]" "$tmp/fast"/shard-000000.tar.idx || { echo "--fast-crop: no restart intervals in the index"; exit 1; }
"$image_folder" --shards "$tmp/fast" --epochs 4 --batch-size 16 --workers 2 --json > "$tmp/fast.json"
/usr/bin/python3 - "$tmp/run.json" "$tmp/fast.json" <<'PY'
import json, sys
plain, fast = ([json.loads(l)["digest"] for l in open(p) if l.startswith("{")] for p in sys.argv[1:])
if not (len(plain) == 4 and plain == fast):
    sys.exit(f"FAIL: --fast-crop shards' digests {fast} are not the plain shards' {plain}")
print("image_folder --shards over --fast-crop shards: the plain shards' digests, epoch by epoch")
PY
# --recipe resnet50 over shards: its MixUp/CutMix takes the class count from classes.txt (the
# shards carry none; without it the first batch failed "num_classes is 0").
"$image_folder" --shards "$tmp/fast" --epochs 2 --batch-size 16 --workers 2 --json \
  --recipe resnet50 > "$tmp/resnet50.json"
/usr/bin/python3 - "$tmp/resnet50.json" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if not (len(runs) == 2 and all(r["images"] == 96 for r in runs)):
    sys.exit(f"FAIL: --recipe resnet50 over shards: expected 2 epochs of 96 images: {runs}")
print("image_folder --shards --recipe resnet50: loss", [r["loss"] for r in runs])
PY
# The same shards by URL: nginx on 127.0.0.1 serves $tmp; serve.py runs until fd 3 closes.
mkfifo "$tmp/ctl" "$tmp/out"
/usr/bin/python3 "$(dirname "$0")/serve.py" "$tmp" < "$tmp/ctl" > "$tmp/out" &
server=$!
exec 3> "$tmp/ctl"
read -r word nginx _ < "$tmp/out"
if [ "$word" = PORTS ]; then
  # Thread workers, and process workers (each forked worker makes its own HTTP client).
  for executor in threads processes; do
    "$image_folder" --shards "http://127.0.0.1:$nginx/shards" --epochs 2 --batch-size 16 \
      --workers 2 --executor $executor --json > "$tmp/http.json"
    /usr/bin/python3 - "$tmp/http.json" $executor <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(runs) == 2 and all(r["images"] == 96 for r in runs), runs
print("image_folder --shards http://... with", sys.argv[2], ": 96 images an epoch, loss",
      [r["loss"] for r in runs])
PY
  done
  # --cache-dir: the shards kept on disk behind the reads; a second run reads them from there
  # (wholly, or where a fetch had not ended with the first run) and trains on the same bytes.
  for run in 1 2; do
    "$image_folder" --shards "http://127.0.0.1:$nginx/shards" --epochs 2 --batch-size 16 \
      --workers 2 --cache-dir "$tmp/cache" --cache-mib 64 --json > "$tmp/cached$run.json"
  done
  /usr/bin/python3 - "$tmp/http.json" "$tmp/cached1.json" "$tmp/cached2.json" "$tmp/cache" <<'PY'
import json, os, sys
digests = [[json.loads(l)["digest"] for l in open(f) if l.startswith("{")] for f in sys.argv[1:4]]
assert digests[0] == digests[1] == digests[2] and len(digests[0]) == 2, digests
entries = os.listdir(sys.argv[4])
assert entries and all(".coload-part" not in e and e.endswith(".tar") for e in entries), entries
print("image_folder --shards http://... --cache-dir: the same digests,", len(entries),
      "shards cached")
PY
  # With worker processes, whose reads fill nothing, the parent queues every shard
  # (ShardDataset::cache_fill) before they start: the shards are cached, and no worker warns.
  "$image_folder" --shards "http://127.0.0.1:$nginx/shards" --epochs 2 --batch-size 16 \
    --workers 2 --executor processes --cache-dir "$tmp/cache-p" --cache-mib 64 --json \
    > "$tmp/cachedp.json" 2> "$tmp/cachedp.err"
  /usr/bin/python3 - "$tmp/http.json" "$tmp/cachedp.json" "$tmp/cache-p" "$tmp/cachedp.err" <<'PY'
import json, os, sys
digests = [[json.loads(l)["digest"] for l in open(f) if l.startswith("{")] for f in sys.argv[1:3]]
assert digests[0] == digests[1] and len(digests[0]) == 2, digests
entries = os.listdir(sys.argv[3])
assert entries and all(".coload-part" not in e and e.endswith(".tar") for e in entries), entries
err = open(sys.argv[4]).read()
assert "not filled behind reads in worker processes" not in err, err
print("image_folder --shards http://... --executor processes --cache-dir: the same digests,",
      len(entries), "shards cached, no worker's warning")
PY
else
  echo "image_folder by URL left out: $word $nginx"
fi
exec 3>&-
wait "$server"
