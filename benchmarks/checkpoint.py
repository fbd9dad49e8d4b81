"""Checkpoint bandwidth: hpc_c10d.checkpoint at N ranks vs one process writing the same array with h5py.

    mpiexec -n 2 python benchmarks/checkpoint.py --mib 512
    mpiexec -n 4 python benchmarks/checkpoint.py --mib 512 --dir /scratch/me

Each round, interleaved: rank 0 alone writes (then reads) the whole global float64 array with
plain h5py; then every rank saves (then loads) its uneven slab with hpc_c10d.checkpoint, into a
file of the same global shape. Times include opening, writing and closing the file (and the
rename); the page cache is not dropped, so both sides see the same cache. Median of the rounds.
"""
import argparse
import os
import statistics
import time

import numpy as np

from _library import load as load_library


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=256, help="global array size in MiB (default 256)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=".", help="where the files go (default: the current directory)")
    args = parser.parse_args()

    dist = load_library()
    import h5py

    from hpc_c10d.checkpoint import Shard, load, save

    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = int(args.mib * 2**20 / 8 / 1024)
    extents = [len(part) for part in np.array_split(np.arange(rows), size)]
    extents[0] += extents[-1] // 3 if size > 1 else 0  # uneven, as real shards often are
    extents[-1] -= extents[-1] // 3 if size > 1 else 0
    mine = np.random.default_rng(rank).standard_normal((extents[rank], 1024))
    whole = np.random.default_rng(9).standard_normal((rows, 1024)) if rank == 0 else None
    plain, ours = os.path.join(args.dir, f"bench-plain-{size}.h5"), os.path.join(args.dir, f"bench-ours-{size}.h5")

    times = {"h5py write": [], "ours write": [], "h5py read": [], "ours read": []}

    def timed(name, work):
        start = time.perf_counter()
        work()
        times[name].append(time.perf_counter() - start)

    def write_plain():
        with h5py.File(plain, "w") as f:
            f.create_dataset("x", data=whole)

    def read_plain():
        with h5py.File(plain, "r") as f:
            f["x"].read_direct(whole)

    for _ in range(args.rounds):
        for what, plain_io, ours_io in (("write", write_plain, lambda: save({"x": Shard(mine)}, ours)),
                                        ("read", read_plain, lambda: load({"x": Shard(mine)}, ours))):
            if rank == 0:  # one process alone, as a user of plain h5py would
                timed(f"h5py {what}", plain_io)
            dist.barrier()
            timed(f"ours {what}", ours_io)

    if rank == 0:
        gib = rows * 1024 * 8 / 2**30
        rate = {name: gib / statistics.median(values) for name, values in times.items()}
        print(f"{size} ranks, {gib * 1024:.0f} MiB global float64, {args.rounds} rounds, median:")
        print("| | h5py, 1 process | hpc_c10d, all ranks | ratio |\n|---|---|---|---|")
        for what in ("write", "read"):
            print(f"| {what} | {rate[f'h5py {what}']:.2f} GiB/s | {rate[f'ours {what}']:.2f} GiB/s | "
                  f"{rate[f'ours {what}'] / rate[f'h5py {what}']:.2f}x |")
        for path in (plain, ours):
            os.remove(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
