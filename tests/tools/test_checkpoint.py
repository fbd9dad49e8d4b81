"""HDF5 checkpoints: uneven shards, replicated and nested state, scalars, resharding across group
sizes, wrong inputs on load, and a save killed midway leaving the previous file valid."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hpc_c10d as dist
from support.launch import fresh_env, mpiexec_command, outer_world_size
from support.reference import assert_in_sync
from hpc_c10d.arrays import bfloat16_dtype
from hpc_c10d.checkpoint import Shard, load, save

h5py = pytest.importorskip("h5py", reason="h5py is not installed (pip install h5py)")

try:
    import torch
except ImportError:
    torch = None

DTYPES = [np.float32, np.float64, np.int64, np.int8, np.uint16, np.complex64, np.bool_, bfloat16_dtype()]


def _global(dtype, rows, cols=3, seed=0):
    """A global array whose every element is distinct (and exact in every dtype used)."""
    values = (np.arange(rows * cols).reshape(rows, cols) * 7 + seed) % 97
    return values.astype(dtype) if dtype is not np.bool_ else (values % 2).astype(bool)


def _split(total, parts, skew):
    """Uneven extents adding up to ``total``: a skewed split, empty slabs allowed."""
    base = [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
    if parts > 1 and skew:
        moved = base[-1]
        base[0], base[-1] = base[0] + moved, 0  # the last rank holds nothing
    return base


def _slab_of(full, extents, rank, axis=0):
    start = sum(extents[:rank])
    return np.take(full, range(start, start + extents[rank]), axis=axis)


@pytest.fixture
def shared_path(world, tmp_path_factory):
    """One file path that every rank agrees on (rank 0's temporary directory)."""
    paths = [str(tmp_path_factory.mktemp("ckpt") / "state.h5")]
    dist.broadcast_object_list(paths, src=0)
    yield paths[0]
    assert_in_sync()


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_uneven_shards_and_replicated_nested_state_round_trip(shared_path, rank, size, dtype):
    rows = [r + 1 for r in range(size)]  # rank r holds r + 1 rows
    full = _global(dtype, sum(rows))
    cols = _global(dtype, 4, size * 2, seed=5)  # split along axis 1, two columns per rank
    state = {"model": {"w": Shard(_slab_of(full, rows, rank)), "c": Shard(cols[:, 2 * rank:2 * rank + 2], axis=1),
                       "bias": _global(dtype, 2, 2, seed=3)},
             "optim": {"step": 12, "lr": 0.25, "betas": 0.9 + 0j, "warm": True, "name": "adam", "tag": b"\x00\x01\x00",
                       "empty": "", "nul": "a\0", "none": b"",
                       "scale": np.float32(2.5)}}
    save(state, shared_path)

    with h5py.File(shared_path, "r") as f:  # plain h5py sees global shapes
        assert f["model/w"].shape == full.shape and f["model/c"].shape == cols.shape
        assert f.attrs["world_size"] == size and f.attrs["format"] == "hpc_c10d-checkpoint-1"
        assert list(f["model/w"].attrs["extents"]) == rows
        np.testing.assert_array_equal(f["model/w"][()].view(full.dtype), full)

    back = {"model": {"w": Shard(np.zeros_like(_slab_of(full, rows, rank))),
                      "c": Shard(np.zeros((4, 2), dtype), axis=1), "bias": np.zeros((2, 2), dtype)},
            "optim": {"step": 0, "lr": 0.0, "betas": 0j, "warm": False, "name": "", "tag": b"", "scale": np.float32(0),
                      "empty": "x", "nul": "", "none": b"x"}}
    assert load(back, shared_path) is back
    np.testing.assert_array_equal(back["model"]["w"].array, _slab_of(full, rows, rank))
    np.testing.assert_array_equal(back["model"]["c"].array, cols[:, 2 * rank:2 * rank + 2])
    np.testing.assert_array_equal(back["model"]["bias"], _global(dtype, 2, 2, seed=3))
    assert back["optim"] == state["optim"]
    assert {k: type(v) for k, v in back["optim"].items()} == {k: type(v) for k, v in state["optim"].items()}


@pytest.mark.mpi
@pytest.mark.parametrize("skew", [False, True], ids=["even", "skewed"])
def test_load_reshards_across_group_sizes(shared_path, rank, size, skew):
    """Save on the first `a` ranks, load on the first `b`, for every a, b up to the world size
    (4 -> 2 and 2 -> 3 among them)."""
    full = _global(np.float64, 11, 4, seed=1)
    for a in range(1, size + 1):
        saver = dist.new_group(list(range(a)))
        for b in range(1, size + 1):
            loader = dist.new_group(list(range(b)))
            if rank < a:
                extents = _split(11, a, skew=False)
                save({"x": Shard(_slab_of(full, extents, rank))}, shared_path, group=saver)
            dist.barrier()
            if rank < b:
                extents = _split(11, b, skew)
                mine = {"x": Shard(np.full((extents[rank], 4), -1.0))}
                load(mine, shared_path, group=loader)
                np.testing.assert_array_equal(mine["x"].array, _slab_of(full, extents, rank), err_msg=f"{a} -> {b}")
            dist.barrier()
            dist.destroy_process_group(loader) if loader is not dist.GroupMember.NON_GROUP_MEMBER else None
        dist.destroy_process_group(saver) if saver is not dist.GroupMember.NON_GROUP_MEMBER else None


@pytest.mark.mpi
def test_a_non_contiguous_target_is_filled_in_place(shared_path, rank, size):
    full = _global(np.float32, 3, 5)
    save({"m": full}, shared_path)
    holder = np.zeros((5, 3), np.float32)
    load({"m": holder.T}, shared_path)  # a transposed view
    np.testing.assert_array_equal(holder.T, full)


@pytest.mark.mpi
@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_tensors_round_trip(shared_path, rank, size):
    weight = torch.arange(6 * (rank + 1), dtype=torch.bfloat16).reshape(rank + 1, 6)
    save({"w": Shard(weight), "step": 3}, shared_path)
    back = {"w": Shard(torch.zeros(rank + 1, 6, dtype=torch.bfloat16)), "step": 0}
    load(back, shared_path)
    assert torch.equal(back["w"].array, weight) and back["step"] == 3


WRONG_LOADS = {
    "shape": ({"w": np.zeros((3, 5))}, "global shape is [4, 3], the array is [3, 5]"),
    "dtype": ({"w": np.zeros((4, 3), np.float32)}, "the checkpoint holds float64, the array is float32"),
    "missing": ({"v": np.zeros(2)}, "v: not in the checkpoint"),
    "scalar type": ({"w": np.zeros((4, 3)), "step": 1.0}, "step: the checkpoint holds a int, not a float"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(WRONG_LOADS))
def test_wrong_loads_raise_on_every_rank(shared_path, rank, size, case):
    save({"w": np.ones((4, 3)), "step": 1}, shared_path)
    state, message = WRONG_LOADS[case]
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(state, shared_path)
    assert np.all(next(iter(state.values())) == 0)  # nothing was written into the arrays


@pytest.mark.mpi
def test_a_read_only_target_on_one_rank_raises_on_every_rank(shared_path, rank, size):
    save({"w": np.ones((4, 3))}, shared_path)
    target = np.zeros((4, 3))
    target.flags.writeable = rank != size - 1
    with pytest.raises(ValueError, match="w: the array is read-only"):
        load({"w": target}, shared_path)
    assert np.all(target == 0)


@pytest.mark.mpi
def test_slabs_that_do_not_add_up_raise_on_every_rank(shared_path, rank, size):
    save({"w": Shard(np.ones((2, 3)))}, shared_path)
    with pytest.raises(ValueError, match=rf"slabs along axis 0 add up to \[{3 * size}, 3\]"):
        load({"w": Shard(np.zeros((3, 3)))}, shared_path)


@pytest.mark.mpi
def test_ranks_that_disagree_on_save_raise_on_every_rank(shared_path, rank, size):
    if size < 2:
        pytest.skip("needs two ranks")
    with pytest.raises(ValueError, match="replicated, but rank 0 holds"):
        save({"w": np.zeros(3 + (rank == size - 1))}, shared_path)
    with pytest.raises(ValueError, match="hold different keys"):
        save({"w" if rank else "v": np.zeros(3)}, shared_path)
    with pytest.raises(TypeError, match=f"rank {size - 1}: .*not object"):
        save({"w": object() if rank == size - 1 else np.zeros(2)}, shared_path)
    assert not os.path.exists(shared_path)


KILLED_SAVE = r"""
import os, sys, time
import numpy as np
import hpc_c10d as dist
from hpc_c10d.checkpoint import Shard, save
path = sys.argv[1]
dist.init_process_group()
rank = dist.get_rank()
save({"x": Shard(np.full(4, 1.0)), "version": 1}, path)
print("saved 1", flush=True)
save({"x": Shard(np.full(40_000_000, 2.0)), "version": 2}, path)   # 320 MB per rank: killed before it ends
print("saved 2", flush=True)
"""


@pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts mpiexec itself")
def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    path, script = tmp_path / "state.h5", tmp_path / "job.py"
    script.write_text(KILLED_SAVE)
    job = subprocess.Popen(["timeout", "120", *mpiexec_command(2), sys.executable, str(script), str(path)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=fresh_env(),
                           start_new_session=True)
    deadline = time.monotonic() + 90
    while not os.path.exists(f"{path}.partial") or not path.exists():
        assert job.poll() is None and time.monotonic() < deadline, job.stdout.read() if job.poll() is not None else ""
        time.sleep(0.01)
    while os.path.getsize(f"{path}.partial") < 1 << 20 and time.monotonic() < deadline:  # well into the write
        time.sleep(0.01)
    os.killpg(job.pid, signal.SIGKILL)
    out = job.communicate(timeout=60)[0]
    assert "saved 1" in out and "saved 2" not in out, out
    with h5py.File(path, "r") as f:  # the previous checkpoint, whole
        assert f["version"][()] == 1
        np.testing.assert_array_equal(f["x"][()], np.full(8, 1.0))


def _gpu_or_skip():
    """cupy with a visible GPU (this rank's device made current), else a skip with the reason."""
    from hpc_c10d.nccl import cuda

    count, why_none = cuda.visible_devices()
    if count == 0:
        pytest.skip(f"no CUDA GPU ({why_none})")
    device = dist.get_node_local_rank(fallback_rank=dist.get_rank()) % count
    cuda.cupy().cuda.Device(device).use()
    return cuda.cupy(), device


@pytest.mark.mpi
def test_gpu_arrays_save_from_the_gpu_and_load_on_the_cpu_and_back(shared_path, rank, size):
    cupy, device = _gpu_or_skip()
    full = _global(np.float32, 2 * size, cols=5)
    state = {"shard": Shard(cupy.asarray(_slab_of(full, [2] * size, rank)), 0),
             "replicated": cupy.asarray(full[:1].astype(np.int64))}
    if torch is not None and torch.cuda.is_available():
        state["torch"] = torch.arange(6, dtype=torch.bfloat16, device=f"cuda:{device}") * 3
    save(state, shared_path)
    on_host = {"shard": Shard(np.zeros((2, 5), np.float32), 0), "replicated": np.zeros((1, 5), np.int64)}
    if "torch" in state:
        on_host["torch"] = np.zeros(6, bfloat16_dtype())
    load(on_host, shared_path)
    np.testing.assert_array_equal(on_host["shard"].array, _slab_of(full, [2] * size, rank))
    np.testing.assert_array_equal(on_host["replicated"], full[:1])
    back = {"shard": Shard(cupy.full((2, 5), -1, cupy.float32), 0), "replicated": cupy.zeros((1, 5), cupy.int64)}
    if "torch" in state:
        np.testing.assert_array_equal(on_host["torch"].astype(np.float32), np.arange(6) * 3)
        back["torch"] = torch.zeros(6, dtype=torch.bfloat16, device=f"cuda:{device}")
    load(back, shared_path)
    np.testing.assert_array_equal(cupy.asnumpy(back["shard"].array), _slab_of(full, [2] * size, rank))
    np.testing.assert_array_equal(cupy.asnumpy(back["replicated"]), full[:1])
    if "torch" in state:
        assert back["torch"].float().cpu().tolist() == [3.0 * i for i in range(6)]
