#!/usr/bin/python3
"""Golden values for coload's samplers, from PyTorch's own torch.utils.data samplers.

Writes one line per case to stdout:

    <id> | count=<C> sum=<S> wsum=<W> | <indices...>

<id> is the sampler's kind followed by key=value parameters; C is the number of indices the
pass yields, S their sum and W the sum of (position + 1) * index over the pass (catches a
reordering). The indices are all of them when C <= 64, otherwise the first 32.

With --check PATH it regenerates the cases in memory and compares them with PATH: exit status 0
when they are identical, 1 (naming the first differing case) otherwise, 2 when PATH is missing.

Case parameters:
  random       RandomSampler(range(n), replacement, num_samples, generator=manual_seed(seed)),
               iterated epoch + 1 times; the line holds pass number `epoch` (counting from 0).
  subset       SubsetRandomSampler([(k * 7919) % 10007 for k in range(n)], generator seed),
               pass `epoch` as above.
  weighted     WeightedRandomSampler([((k * 37) % 11 + 1) * 0.25 for k in range(n)],
               num_samples, replacement, generator seed), pass `epoch` as above.
  distributed  DistributedSampler(range(n), num_replicas, rank, shuffle, seed, drop_last)
               after set_epoch(epoch), one pass (without shuffle only epoch 2: the order does not
               depend on it).
"""

import argparse
import sys

import torch
from torch.utils.data import RandomSampler, SubsetRandomSampler, WeightedRandomSampler
from torch.utils.data.distributed import DistributedSampler

SIZES = [1, 7, 100, 1000]
SEEDS = [0, 1, 12345]
EPOCHS = [0, 1, 2]
FULL_LIMIT = 64
HEAD = 32


def subset_indices(n):
    return [(k * 7919) % 10007 for k in range(n)]


def weights_of(n):
    return [((k * 37) % 11 + 1) * 0.25 for k in range(n)]


def generator(seed):
    return torch.Generator().manual_seed(seed)


def line(case_id, indices):
    indices = [int(i) for i in indices]
    wsum = sum((k + 1) * i for k, i in enumerate(indices))
    shown = indices if len(indices) <= FULL_LIMIT else indices[:HEAD]
    return "{} | count={} sum={} wsum={} | {}".format(
        case_id, len(indices), sum(indices), wsum, " ".join(map(str, shown)))


def passes(sampler, count):
    """The first `count` passes of a sampler reused across epochs."""
    return [list(sampler) for _ in range(count)]


def num_samples_key(num_samples):
    return "none" if num_samples is None else str(num_samples)


def random_cases():
    for n in SIZES:
        configs = [(False, None), (False, 2 * n + 3), (True, None), (True, 5), (True, 3 * n + 1)]
        if n > 1:
            configs.insert(1, (False, n // 2 + 1))
        for seed in SEEDS:
            for replacement, num_samples in configs:
                sampler = RandomSampler(range(n), replacement=replacement,
                                        num_samples=num_samples, generator=generator(seed))
                for epoch, indices in enumerate(passes(sampler, len(EPOCHS))):
                    yield line("random n={} seed={} replacement={} num_samples={} epoch={}".format(
                        n, seed, int(replacement), num_samples_key(num_samples), epoch), indices)


def subset_cases():
    for n in SIZES:
        for seed in SEEDS:
            sampler = SubsetRandomSampler(subset_indices(n), generator=generator(seed))
            for epoch, indices in enumerate(passes(sampler, len(EPOCHS))):
                yield line("subset n={} seed={} epoch={}".format(n, seed, epoch), indices)


def weighted_cases():
    for n in SIZES:
        configs = [(True, 5), (True, 2 * n + 1), (False, n)]
        if n > 1:
            configs.append((False, n // 2 + 1))
        for seed in SEEDS:
            for replacement, num_samples in configs:
                sampler = WeightedRandomSampler(weights_of(n), num_samples,
                                                replacement=replacement, generator=generator(seed))
                for epoch, indices in enumerate(passes(sampler, len(EPOCHS))):
                    yield line("weighted n={} seed={} replacement={} num_samples={} epoch={}".format(
                        n, seed, int(replacement), num_samples, epoch), indices)


def distributed_cases():
    # (num_replicas, rank); 16 replicas over 7 (or 1) indices pads by more than the dataset.
    layouts = [(1, 0), (3, 0), (3, 2), (4, 3), (16, 9)]
    combo = 0
    for n in SIZES:
        for replicas, rank in layouts:
            for drop_last in (False, True):
                for shuffle in (False, True):
                    seed = SEEDS[combo % len(SEEDS)] if shuffle else 0
                    combo += shuffle
                    sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank,
                                                 shuffle=shuffle, seed=seed, drop_last=drop_last)
                    for epoch in EPOCHS if shuffle else [2]:
                        sampler.set_epoch(epoch)
                        yield line(
                            "distributed n={} num_replicas={} rank={} shuffle={} seed={} "
                            "drop_last={} epoch={}".format(n, replicas, rank, int(shuffle), seed,
                                                           int(drop_last), epoch),
                            list(sampler))


def all_lines():
    for cases in (random_cases, subset_cases, weighted_cases, distributed_cases):
        yield from cases()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="PATH", help="compare with PATH instead of writing")
    args = parser.parse_args()
    lines = list(all_lines())
    if args.check is None:
        sys.stdout.write("".join(l + "\n" for l in lines))
        return 0
    try:
        with open(args.check) as f:
            stored = [l.rstrip("\n") for l in f if l.strip()]
    except OSError as e:
        print("cannot read {}: {}".format(args.check, e))
        return 2
    for k, (want, have) in enumerate(zip(lines, stored)):
        if want != have:
            print("{}: line {} differs from what PyTorch {} yields now".format(
                args.check, k + 1, torch.__version__))
            print("  stored: " + have)
            print("  now:    " + want)
            return 1
    if len(lines) != len(stored):
        print("{}: {} cases stored, {} generated now".format(args.check, len(stored), len(lines)))
        return 1
    print("{}: all {} cases match PyTorch {}".format(args.check, len(lines), torch.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
