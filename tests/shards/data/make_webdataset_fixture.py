#!/usr/bin/env python3
"""Writes webdataset-1.0.2.tar, the shard tests/shards/tar_test.cpp reads as the webdataset
package writes it (the file is committed: CI has no webdataset; re-make it only to follow a
new webdataset release, and keep the expectations in the test in step).

    python make_webdataset_fixture.py OUT.tar     # in a venv with webdataset (tools/bench/shards/setup_venv.sh)

Five samples through webdataset.TarWriter, which encodes each field by its extension: `cls` an
int, `json` a dict, `txt` a str, `jpg` raw bytes. Sample 3's key is 150 characters under a
folder, past ustar's name field, so tarfile writes a pax header for each of its members;
sample 4 has a field (`seg.png`) with a dot in its extension.
"""
import sys

import webdataset as wds


def sample(i):
    key = ("dir/" + "k" * 150 + "_%d" % i) if i == 3 else "sample_%04d" % i
    s = {"__key__": key, "cls": i * 7, "json": {"index": i, "name": "n%d" % i},
         "txt": "caption %d: \u00e9t\u00e9" % i, "jpg": bytes((i + k) % 256 for k in range(100 + 37 * i))}
    if i == 4:
        s["seg.png"] = b"\x89PNG-not-really-%d" % i
    return s


def main():
    with wds.TarWriter(sys.argv[1]) as w:
        for i in range(5):
            w.write(sample(i))


if __name__ == "__main__":
    main()
