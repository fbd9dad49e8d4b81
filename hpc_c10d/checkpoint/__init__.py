"""HDF5 checkpoints of rank-sharded arrays: one file, global shapes, any world size on load.

``save(state, path)`` writes one HDF5 file with a dataset per array at its **global** shape: a
``Shard(array, axis)`` is this rank's slab, slabs join along the axis in group-rank order (they
may be uneven); a plain array is replicated and written once; nested dicts become HDF5 groups;
scalars and strings keep their types. ``load(state, path)`` fills the arrays of ``state`` in
place, each rank reading its own slab, at any world size and split (resharding).

With an MPI-enabled h5py the ranks write collectively through the ``mpio`` driver; with the
PyPI h5py (no MPI) they write their slabs in turn, each straight from its own memory, so no rank
ever holds more than its own slab. Either way the file is written as ``<path>.partial`` and
renamed once every rank has finished: a job killed mid-save leaves the previous file intact.
Device arrays (cupy, torch CUDA) are staged through host memory.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator

import numpy as np

from ..arrays import bfloat16_dtype
from ..errors import DistError
from ..extras import install_hint
from ..state import resolve_group
from . import host
from .layout import SCALAR_TYPES, Leaf, Shard, agree, leaves, storage_dtype

__all__ = ["Shard", "save", "load"]

FORMAT = "hpc_c10d-checkpoint-1"
_TOKEN = 0x5A7E  # tag of the turn-taking messages (on a communicator of the checkpoint's own)


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise ImportError(f"hpc_c10d.checkpoint needs h5py: {install_hint('hdf5')}") from None
    return h5py


def _member(group: Any) -> Any:
    pg = resolve_group(group)
    if pg is None:
        raise ValueError("checkpoint: this rank is not a member of the group; call it on the members only")
    return pg


def _failure(exc: Any, comm: Any, pg: Any) -> Exception:
    """The error for an MPI one on the checkpoint's communicator: where a rank died (ULFM), that
    communicator is revoked, so every rank's exchange on it ends, and the group's failure is raised
    (every survivor gets the same ProcessFailedError); else ``mpi_failure``'s."""
    from mpi4py import MPI

    from ..mpi import failures, ulfm

    if ulfm.enabled(MPI) and ulfm.is_process_failure(MPI, exc.Get_error_class()):
        ulfm.revoke(comm)
        return failures.mpi_failure(exc, pg._comm)
    return failures.mpi_failure(exc, comm)


@contextlib.contextmanager
def _agreed(state: dict, group: Any) -> Iterator[tuple[Any, list, list]]:
    """The checkpoint's own communicator, and the plan ((leaf, extents) per leaf) and values of
    ``state`` once every rank has agreed on them (else the same error on every rank)."""
    pg = _member(group)
    comm = pg.comm.Dup()
    try:
        try:
            found = list(leaves(state))
            mine: list[Leaf] | Exception = [leaf for leaf, _ in found]
        except (TypeError, ValueError) as exc:  # shared through agree(), so every rank raises it
            found, mine = [], exc
        extents = agree(mine, comm)  # raises on every rank if one could not read its state
        yield comm, [(leaf, e) for (leaf, _), e in zip(found, extents)], [value for _, value in found]
    except Exception as exc:
        from mpi4py import MPI  # loaded already: the communicator is MPI's

        if not isinstance(exc, MPI.Exception):
            raise
        raise _failure(exc, comm, pg) from exc
    finally:
        comm.Free()


def _slab(leaf: Leaf, extents: list[int], rank: int) -> tuple[slice, ...]:
    """Where rank's slab of a sharded leaf sits in the global dataset."""
    start = sum(extents[:rank])
    return (slice(None),) * leaf.axis + (slice(start, start + extents[rank]),)


def _global_shape(leaf: Leaf, extents: list[int]) -> tuple[int, ...]:
    if leaf.kind != "sharded":
        return leaf.shape
    return leaf.shape[:leaf.axis] + (sum(extents),) + leaf.shape[leaf.axis + 1:]


# ------------------------------------------------------------------------------------ save
def save(state_dict: dict, path: str | os.PathLike, group: Any = None) -> None:
    """Write ``state_dict`` to the HDF5 file ``path`` (collective over ``group``)."""
    h5py, path = _h5py(), os.fspath(path)
    with _agreed(state_dict, group) as (comm, plan, values):
        partial = f"{path}.partial"
        if h5py.get_config().mpi:
            failure = _write_collectively(h5py, partial, plan, values, comm)
        else:
            failure = _write_in_turn(h5py, partial, plan, values, comm)
        if failure is None and comm.Get_rank() == 0:
            os.replace(partial, path)
        elif failure is not None and comm.Get_rank() == 0 and os.path.exists(partial):
            os.remove(partial)
        comm.Barrier()  # nobody returns before the file is in place
        if failure is not None:
            raise DistError(f"checkpoint save to {path} failed on {failure}; the previous file is untouched")


def _create(f: Any, plan: list, values: list, comm: Any) -> list:
    """Make every group and dataset (and write the scalars); return the datasets, in plan order."""
    from .. import __version__

    f.attrs.update({"format": FORMAT, "library": f"hpc_c10d {__version__}", "world_size": comm.Get_size(),
                    "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    datasets = []
    for (leaf, extents), value in zip(plan, values):
        if leaf.kind == "scalar":
            dset = f.create_dataset(leaf.path, data=_scalar_data(value))
            dset.attrs["python_type"] = leaf.dtype
        else:
            dset = f.create_dataset(leaf.path, shape=_global_shape(leaf, extents), dtype=storage_dtype(leaf.dtype))
            dset.attrs.update({"dtype": leaf.dtype, "layout": leaf.kind})
            if leaf.kind == "sharded":
                dset.attrs.update({"axis": leaf.axis, "extents": np.asarray(extents, np.int64)})
        datasets.append(dset)
    return datasets


def _write_mine(plan: list, values: list, datasets: list, rank: int, collective: bool) -> None:
    """Write this rank's slabs (and, on rank 0, the replicated arrays)."""
    for (leaf, extents), value, dset in zip(plan, values, datasets):
        if leaf.kind == "scalar" or (leaf.kind == "replicated" and rank != 0):
            continue
        data = host.to_host(value)
        data = data.view(dset.dtype)  # bfloat16 as its bit pattern
        where = _slab(leaf, extents, rank) if leaf.kind == "sharded" else ()
        if collective and leaf.kind == "sharded":
            with dset.collective:
                dset[where] = data
        elif data.size:
            dset[where] = data


def _write_in_turn(h5py: Any, partial: str, plan: list, values: list, comm: Any) -> str | None:
    """The serial path: rank 0 creates the file, then each rank in turn opens it and writes its slabs."""
    rank, size = comm.Get_rank(), comm.Get_size()
    failure = comm.recv(source=rank - 1, tag=_TOKEN) if rank > 0 else None
    if failure is None:
        try:
            with h5py.File(partial, "w" if rank == 0 else "r+") as f:
                datasets = _create(f, plan, values, comm) if rank == 0 else \
                    [f[leaf.path] for leaf, _ in plan]
                _write_mine(plan, values, datasets, rank, collective=False)
        except Exception as exc:  # passed on, so that every rank raises it
            failure = f"rank {rank}: {type(exc).__name__}: {exc}"
    if rank + 1 < size:
        comm.send(failure, dest=rank + 1, tag=_TOKEN)
    return comm.bcast(failure, root=size - 1)


def _write_collectively(h5py: Any, partial: str, plan: list, values: list, comm: Any) -> str | None:
    """The parallel path: one file opened by every rank with the mpio driver, collective writes."""
    failure = None
    try:
        with h5py.File(partial, "w", driver="mpio", comm=comm) as f:
            datasets = _create(f, plan, values, comm)
            _write_mine(plan, values, datasets, comm.Get_rank(), collective=True)
    except Exception as exc:
        failure = f"rank {comm.Get_rank()}: {type(exc).__name__}: {exc}"
    failures = [f for f in comm.allgather(failure) if f is not None]
    return "; ".join(failures) if failures else None


# ------------------------------------------------------------------------------------ load
def load(state_dict: dict, path: str | os.PathLike, group: Any = None) -> dict:
    """Fill ``state_dict``'s arrays in place from ``path`` (any world size and split), and set its
    scalars and strings; collective over ``group``. Returns ``state_dict``."""
    h5py, path = _h5py(), os.fspath(path)
    with _agreed(state_dict, group) as (comm, plan, values):
        rank = comm.Get_rank()
        try:
            f = h5py.File(path, "r")
        except OSError as exc:
            f, problems = None, [f"cannot open {path}: {exc}"]
        else:
            problems = [p for (leaf, extents), value in zip(plan, values) for p in _mismatch(f, leaf, extents, value)]
        everyone = comm.allgather(problems)  # a file visible to some ranks only is a problem too
        if any(everyone):
            if f is not None:
                f.close()
            found = next(p for p in everyone if p)
            raise ValueError(f"cannot load {path}:\n  " + "\n  ".join(found))
        with f:
            for (leaf, extents), value in zip(plan, values):
                if leaf.kind == "scalar":
                    _set(state_dict, leaf.path, _scalar(f[leaf.path]))
                else:
                    _read(f[leaf.path], leaf, extents, rank, value)
    return state_dict


def _mismatch(f: Any, leaf: Leaf, extents: list[int], target: Any) -> list[str]:
    """What stops ``leaf`` being loaded from ``f`` into ``target`` (shared, so every rank raises)."""
    stored = f.get(leaf.path)
    if stored is None:
        return [f"{leaf.path}: not in the checkpoint"]
    if leaf.kind == "scalar":
        found = stored.attrs.get("python_type")
        return [] if found == leaf.dtype else [f"{leaf.path}: the checkpoint holds a {found}, not a {leaf.dtype}"]
    dtype = stored.attrs.get("dtype", stored.dtype.name)
    want = _global_shape(leaf, extents)
    view = host.cpu_view(target)
    problems = [] if view is None or view.flags.writeable else [f"{leaf.path}: the array is read-only"]
    if dtype != leaf.dtype:
        problems.append(f"{leaf.path}: the checkpoint holds {dtype}, the array is {leaf.dtype}")
    if tuple(stored.shape) != want:
        what = f"the ranks' slabs along axis {leaf.axis} add up to" if leaf.kind == "sharded" else "the array is"
        problems.append(f"{leaf.path}: the checkpoint's global shape is {list(stored.shape)}, {what} {list(want)}")
    return problems


def _read(dset: Any, leaf: Leaf, extents: list[int], rank: int, target: Any) -> None:
    where = _slab(leaf, extents, rank) if leaf.kind == "sharded" else ()
    view = host.cpu_view(target)
    if view is not None and view.flags.c_contiguous:
        if view.size:
            dset.read_direct(view.view(dset.dtype), source_sel=where or None)  # straight into the array
        return
    data = dset[where]
    if leaf.dtype == "bfloat16":
        data = data.view(bfloat16_dtype())
    if view is not None:
        view[...] = data
    else:
        host.fill(target, np.ascontiguousarray(data))


def _scalar_data(value: Any) -> Any:
    """How a scalar is stored. Text and bytes are fixed-size (MPI-IO cannot write HDF5's
    variable-length strings): a str as UTF-8 ``S`` (readable in h5dump), bytes, and a str that
    ends in NUL (which ``S`` would drop), as uint8."""
    if isinstance(value, str) and value and not value.endswith("\0"):
        return np.bytes_(value.encode())
    if isinstance(value, (str, bytes)):
        return np.frombuffer(value.encode() if isinstance(value, str) else value, np.uint8)
    return value


def _scalar(dset: Any) -> Any:
    kind, value = dset.attrs["python_type"], dset[()]
    if kind.startswith("numpy."):
        return np.dtype(kind[len("numpy."):]).type(value)
    if kind in ("str", "bytes"):
        raw = value.tobytes() if isinstance(value, np.ndarray) else bytes(value)
        return raw.decode() if kind == "str" else raw
    return SCALAR_TYPES[kind](value)


def _set(state: dict, path: str, value: Any) -> None:
    *parents, key = path.split("/")
    for name in parents:
        state = state[name]
    state[key] = value
