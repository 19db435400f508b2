"""Times torchvision.datasets.ImageFolder's constructor for tools/bench/vision/folder_index.

usage: folder_index_torchvision.py ROOT REPEAT

Builds the dataset once untimed (to warm the same caches coload's warm-up warms), then REPEAT
times timed, and prints one JSON object: {"best": s, "median": s, "cpu_best": s, "samples": n}
(wall-clock seconds, and the least CPU seconds of one run).
"""
import json
import statistics
import sys
import time

from torchvision.datasets import ImageFolder


def main() -> None:
    root, repeat = sys.argv[1], int(sys.argv[2])
    samples = len(ImageFolder(root).samples)
    times, cpu_times = [], []
    for _ in range(repeat):
        start, cpu_start = time.perf_counter(), time.process_time()
        ImageFolder(root)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    print(json.dumps({"best": min(times), "median": statistics.median(times),
                      "cpu_best": min(cpu_times), "samples": samples}))


if __name__ == "__main__":
    main()
