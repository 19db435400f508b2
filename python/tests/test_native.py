"""Native datasets from Python: image folders through a preset recipe, and tar shards."""
import gc
import io
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

import coload


def make_folder(root):
    tool = os.environ.get("COLOAD_MAKE_IMAGE_FOLDER") or shutil.which("make_image_folder")
    if not tool:
        pytest.skip("make_image_folder not found (set COLOAD_MAKE_IMAGE_FOLDER)")
    subprocess.run([tool, str(root), "--classes", "3", "--per-class", "4", "--threads", "1"],
                   check=True, capture_output=True)


def test_image_folder_batches(tmp_path):
    make_folder(tmp_path)
    ds = coload.vision.ImageFolder(tmp_path, recipe="classic", train=False)
    assert len(ds) == 12 and len(ds.classes) == 3
    loader = coload.DataLoader(ds, batch_size=5, num_workers=2)
    batches = list(loader)
    assert [b[0].shape[0] for b in batches] == [5, 5, 2]
    images, labels = batches[0]
    assert images.dtype == torch.float32 and tuple(images.shape[1:]) == (3, 224, 224)
    assert torch.cat([b[1] for b in batches]).tolist() == ds.targets
    again = list(coload.DataLoader(ds, batch_size=5))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))  # eval: deterministic
    train = coload.vision.ImageFolder(tmp_path, train=True)
    a = list(coload.DataLoader(train, batch_size=12, seed=3))[0][0]
    b = list(coload.DataLoader(train, batch_size=12, seed=3))[0][0]
    assert torch.equal(a, b)  # the same seed, the same augmentation


def test_jpeg_checkpoints(tmp_path):
    # A train epoch's crops leave checkpoints; the next epoch's crops start from them and give
    # the same pixels as without (the same seed, the same crops).
    make_folder(tmp_path)
    budget = coload.vision.jpeg_checkpoint_budget()
    assert budget > 0
    try:
        coload.vision.set_jpeg_checkpoint_budget(0)
        assert coload.vision.jpeg_checkpoint_bytes() == 0
        ds = coload.vision.ImageFolder(tmp_path, recipe="classic", train=True)
        without = list(coload.DataLoader(ds, batch_size=12, seed=5))[0][0]
        assert coload.vision.jpeg_checkpoint_bytes() == 0
        assert coload.vision.set_jpeg_checkpoint_budget(budget) == 0
        first = list(coload.DataLoader(ds, batch_size=12, seed=5))[0][0]
        kept = coload.vision.jpeg_checkpoint_bytes()
        assert 0 < kept <= budget
        second = list(coload.DataLoader(ds, batch_size=12, seed=5))[0][0]
        assert torch.equal(first, without) and torch.equal(second, without)
        for bad in (-1, 1.5, True, "64", 2**63):
            with pytest.raises(ValueError, match="set_jpeg_checkpoint_budget: nbytes"):
                coload.vision.set_jpeg_checkpoint_budget(bad)
        assert coload.vision.jpeg_checkpoint_budget() == budget
    finally:
        coload.vision.set_jpeg_checkpoint_budget(budget)


def test_shard_dataset(tmp_path):
    path = tmp_path / "shard-000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(7):
            for ext, payload in (("cls", str(i % 3).encode()), ("txt", f"sample {i}".encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    ds = coload.shards.ShardDataset(path)
    assert len(ds) == 7
    batches = list(coload.DataLoader(ds, batch_size=3, num_workers=2))
    assert [len(b) for b in batches] == [3, 3, 1]
    first = batches[0][0]
    assert first["__key__"] == "s000" and first["cls"] == b"0" and first["txt"] == b"sample 0"
    assert [s["__key__"] for b in batches for s in b] == [f"s{i:03d}" for i in range(7)]
    # A list of shards, in its order (a file:// URL among them); a name not there is named.
    other = tmp_path / "b" / "shard-001.tar"
    other.parent.mkdir()
    other.write_bytes(path.read_bytes())
    both = coload.shards.ShardDataset([other.as_uri(), path])
    assert len(both) == 14
    keys = [s["__url__"] for b in coload.DataLoader(both, batch_size=7) for s in b]
    assert keys == [str(other)] * 7 + [str(path)] * 7
    with pytest.raises(Exception, match="missing.tar"):
        coload.shards.ShardDataset([path, tmp_path / "missing.tar"])


def served_shard(tmp_path, size):
    """A folder holding shard-000.tar of 9 samples of `size` + i bytes each, indexed, and
    serve.py's ports serving it (nginx, then the fault-injecting proxy), as a context."""
    served = tmp_path / "served"
    served.mkdir()
    with tarfile.open(served / "shard-000.tar", "w") as tar:
        for i in range(9):
            payload = bytes([i]) * (size + i)
            info = tarfile.TarInfo(f"s{i:03d}.bin")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    assert len(coload.shards.ShardDataset(served / "shard-000.tar")) == 9  # writes its .idx
    serve = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "shards", "serve.py")
    server = subprocess.Popen([sys.executable, serve, str(served)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)

    class Served:
        def __enter__(self):
            first = server.stdout.readline().split()
            if first[:1] != ["PORTS"]:
                self.__exit__()
                pytest.skip(" ".join(first[1:]) or "serve.py did not start")
            return int(first[1]), int(first[2])

        def __exit__(self, *exc):
            server.stdin.close()
            server.wait()

    return Served()


def test_shard_cache_by_url(tmp_path):
    # A shard served by nginx (tests/shards/serve.py): the first epoch's reads fill the cache
    # behind them, and once they are in, the epochs read from disk, the server gone.
    with served_shard(tmp_path, 1000) as (nginx, _):
        url = f"http://127.0.0.1:{nginx}/shard-000.tar"
        cache = tmp_path / "cache"
        ds = coload.shards.ShardDataset(url, cache_dir=cache)  # 10 GiB
        want = [bytes([i]) * (1000 + i) for i in range(9)]

        def epoch():
            return [s["bin"] for b in coload.DataLoader(ds, batch_size=4, num_workers=2) for s in b]

        assert epoch() == want
        assert ds.cache_wait() is True
        assert ds.cache_wait(timeout=0) is True
        assert [p.name.endswith("-shard-000.tar") for p in cache.iterdir()] == [True]
    assert epoch() == want  # the server is gone


def test_shard_cache_fill(tmp_path):
    # cache_fill() queues the shard before any read; once it is in, the epochs read from
    # disk, the server gone.
    with served_shard(tmp_path, 1000) as (nginx, _):
        url = f"http://127.0.0.1:{nginx}/shard-000.tar"
        cache = tmp_path / "cache"
        ds = coload.shards.ShardDataset(url, cache_dir=cache)
        assert not cache.exists() or not any(cache.iterdir())
        assert ds.cache_fill() is None
        assert ds.cache_wait() is True
        assert [p.name.endswith("-shard-000.tar") for p in cache.iterdir()] == [True]
        # Without a cache there is nothing to fill, and nothing to wait for.
        plain = coload.shards.ShardDataset(url)
        plain.cache_fill()
        assert plain.cache_wait(timeout=0) is True
    want = [bytes([i]) * (1000 + i) for i in range(9)]
    assert [s["bin"] for b in coload.DataLoader(ds, batch_size=4) for s in b] == want


def test_shard_cache_wait_bounded_and_interrupted(tmp_path):
    # The whole shard (900 KB) comes at 200 KiB/s through the proxy: its fetch behind one
    # sample's read takes over 4 s, so each bounded wait below ends first, and says so.
    import signal

    class Interrupted(Exception):
        pass

    with served_shard(tmp_path, 100_000) as (_, proxy):
        ds = coload.shards.ShardDataset(f"http://127.0.0.1:{proxy}/bw200/shard-000.tar",
                                        cache_dir=tmp_path / "cache")
        assert ds.cache_wait(timeout=0) is True  # nothing asked for yet
        it = iter(coload.DataLoader(ds, batch_size=1))
        assert next(it)[0]["bin"] == bytes([0]) * 100_000
        del it
        assert ds.cache_wait(timeout=0) is False
        assert ds.cache_wait(timeout=0.05) is False
        for bad in (-1, float("nan")):
            with pytest.raises(ValueError, match="timeout should be None or a number"):
                ds.cache_wait(timeout=bad)
        # A signal's handler runs during the wait (Ctrl-C's KeyboardInterrupt alike), and its
        # exception ends it; the fetch goes on.
        def alarm(signum, frame):
            raise Interrupted()

        previous = signal.signal(signal.SIGALRM, alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(Interrupted):
                ds.cache_wait()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert ds.cache_wait(timeout=0) is False
        # Let go of mid-fetch: the fetch is cancelled, and no part file stays.
        del ds
        gc.collect()
        assert list((tmp_path / "cache").iterdir()) == []
