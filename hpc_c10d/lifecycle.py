"""Start and stop the default group, and the module-level queries about groups and backends."""

from __future__ import annotations

import importlib.util
import os
import secrets
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from .backend import Backend, BackendConfig, is_backend_available
from .diagnostics import fingerprints, flight_recorder, logs, watchdog
from .errors import DistError
from .job import jobenv, threads
from .mpi import bootstrap, notices
from .mpi.progress import progress
from .nccl import device as nccl_device
from .process_group import ProcessGroup
from .reduce_op import RedOpType
from .state import GroupMember, _world, default_group, resolve_group
from .store import MPIStore, Store
from .timeouts import check_timeout, default_pg_timeout, require_timedelta, timeout_from_env

if TYPE_CHECKING:
    from .nccl.backend import NCCLBackend

__all__ = [
    "default_pg_timeout", "init_process_group", "destroy_process_group", "is_initialized",
    "is_available", "is_mpi_available", "is_nccl_available", "is_gloo_available",
    "is_ucc_available", "is_xccl_available", "is_backend_available", "is_torchelastic_launched",
    "get_rank", "get_world_size", "get_backend", "get_backend_config", "get_pg_count",
    "get_node_local_rank", "get_default_backend_for_device", "set_timeout", "supports_complex",
    "_get_default_group", "_get_default_store", "check_timeout",
]

_INIT_SCHEMES = ("env://", "tcp://", "file://", "mpi://")

progress.activity = _world.operations_started  # the store's progress thread backs off while this grows


def _node_local_rank() -> int | None:
    """The default group's node-local rank, None while there is none (for ``nccl.bind_local_device``)."""
    return _world.node_local_rank if _world.default_pg is not None else None


nccl_device.node_local_rank = _node_local_rank


def _check_init_method(init_method: str | None, store: Any) -> None:
    if init_method is None:
        return
    if store is not None:
        raise ValueError("Cannot specify both init_method and store.")
    if not isinstance(init_method, str) or not init_method.startswith(_INIT_SCHEMES):
        raise ValueError(f"init_method {init_method!r} is not supported; use one of "
                         f"{', '.join(_INIT_SCHEMES)} (accepted for compatibility: MPI does the rendezvous)")


def _check_against_mpi(rank: int, world_size: int, comm: Any) -> None:
    mpi_rank, mpi_size = comm.Get_rank(), comm.Get_size()
    if world_size not in (-1, None) and world_size != mpi_size:
        raise ValueError(f"world_size={world_size} but the MPI world has {mpi_size} processes; "
                         f"drop `world_size=` or launch with -n {world_size}")
    if rank not in (-1, None) and rank != mpi_rank:
        raise ValueError(f"rank={rank} but MPI made this process rank {mpi_rank}; drop `rank=` "
                         "(MPI assigns ranks) or pass the rank MPI reports")


_LAUNCH_HINTS = {
    "srun": "add --mpi=pmi2 (MPICH, the mpich wheel; Intel MPI with I_MPI_PMI_LIBRARY set to SLURM's "
            "libpmi2.so) or --mpi=pmix (Open MPI) so srun joins its tasks into one MPI world",
    "torchrun": "hpc_c10d takes ranks from MPI: launch with `mpiexec -n N` or `srun -n N`, not torchrun",
}


def _check_launcher(mpi_size: int) -> None:
    """ValueError when a launcher started several processes but MPI made each a world of its own."""
    job = jobenv.detect()
    if mpi_size == 1 and (job.env_size or 1) > 1:
        hint = _LAUNCH_HINTS.get(job.launcher, "launch with the mpiexec of the MPI library mpi4py was built with")
        raise ValueError(f"{job.launcher} started {job.env_size} processes, but MPI sees each one as a world "
                         f"of 1 (they would not talk to each other): {hint}")


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
    *,
    comm: Any = None,
) -> None:
    """Initialise the default process group from MPI; no address, port or store needed.

    Run under ``mpiexec``/``srun``: ranks and world size come from MPI. ``backend`` may be
    None (``cpu:mpi,cuda:nccl``), ``"mpi"``, ``"gloo"`` (an alias of the MPI CPU backend) or a
    ``"cpu:mpi,cuda:nccl"`` map. Without ``timeout``, groups time out after ``HPC_C10D_TIMEOUT``
    seconds if that is set, else torch's 30 minutes. ``init_method`` is accepted for compatibility.
    The default store is an ``MPIStore`` over the world (created collectively here); a ``store``
    given is used instead. ``rank``/``world_size``, if given, must agree with MPI. ``comm`` (an
    mpi4py intracommunicator) runs the world on a sub-communicator instead of ``COMM_WORLD``.
    Each rank's BLAS/OpenMP thread pools are limited to its share of the node's cores unless a
    thread variable is set or ``HPC_C10D_LIMIT_THREADS=0`` (docs/launching.md).

    Example::

        import hpc_c10d as dist
        dist.init_process_group()
        dist.all_reduce(x)
    """
    if _world.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    timeout_from_env()  # settings errors before any communication, also where timeout= overrides this one
    timeout = check_timeout(timeout)
    watchdog.policy_from_env()
    watchdog.grace_from_env()
    flight_recorder.buffer_size()
    threads.switched_on()
    notices.mode()
    _check_init_method(init_method, store)
    if store is not None and not isinstance(store, Store):
        raise TypeError(f"store must be a Store, got {type(store).__name__}")
    config = BackendConfig(backend)
    MPI = bootstrap.initialize()
    base = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL:
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {base!r}")
    _check_against_mpi(rank, world_size, base)
    if comm is None:
        _check_launcher(base.Get_size())
    world = base.Dup()
    world.Set_errhandler(MPI.ERRORS_RETURN)  # errors raise (mpi/failures.py), not abort in MPI; groups inherit it
    _open_notice_board(MPI, world)
    node = _learn_the_node(MPI, world)
    backend_name = str(config) if backend is None else Backend(backend)
    pg = ProcessGroup(world, range(world.Get_size()), group_name or "0", config, backend_name,
                      timeout, "default_pg")
    _world.default_store = MPIStore(world, timeout=timeout) if store is None else store
    _world.default_pg = pg
    _world.groups.append(pg)
    _world.group_count = 1
    logs.configure()
    threads.limit_pools(node, world.Get_rank() == 0)
    node.Free()
    instrument(pg)
    try:
        pg._bind_device(device_id)  # NCCL now, when a device is bound: every rank succeeds or fails alike
    except BaseException:
        destroy_process_group()
        raise
    _start_watchdog(MPI, world)


def _open_notice_board(MPI: Any, world: Any) -> None:  # noqa: N803 - the module
    """The refusal notices' communicator, a duplicate of ``world`` (collective), where switched on."""
    mode = notices.mode()
    if mode != "off":
        _world.notices = notices.NoticeBoard(world.Dup(), MPI, raising=mode == "raise")


def _close_notice_board() -> None:
    if _world.notices is not None:
        _world.notices.close()
        _world.notices = None


def _learn_the_node(MPI: Any, world: Any) -> Any:
    """Record this rank's place among the ranks of its node and the thread level MPI granted; return
    the node's communicator (MPI's shared-memory split of ``world``, collective), for the caller to free."""
    node = bootstrap.node_local_comm(world)
    _world.node_local_rank, _world.node_local_size = node.Get_rank(), node.Get_size()
    _world.thread_level = bootstrap.thread_level_name(MPI)
    return node


def _start_watchdog(MPI: Any, world: Any, explains: bool = False) -> None:
    """Name the run (the same on every rank) and start the watchdog (collective over ``world``)."""
    run_id = world.bcast(f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}" if world.Get_rank() == 0 else None)
    watchdog.start(MPI, run_id, explains)


def adopt(pg: ProcessGroup, world: bool) -> None:
    """Count a group another owner made (backend "hpc" under torch) among this process's groups, so
    the watchdog and the dumps see it. A ``world`` adopted while hpc_c10d has no default group of its
    own becomes that group, and starts the watchdog (collective over it), which then explains the
    adopted groups' timeouts (``watchdog.explain``); its ranks' places on their nodes are learnt as
    ``init_process_group`` learns them (collective over it too)."""
    _world.groups.append(pg)
    if world and _world.default_pg is None:
        MPI = bootstrap.initialize()
        _world.default_pg, _world.group_count = pg, 1
        _open_notice_board(MPI, pg.comm)
        _learn_the_node(MPI, pg.comm).Free()  # get_node_local_rank, new_subgroups and bind_local_device read it
        logs.configure()
        _start_watchdog(MPI, pg.comm, explains=True)


def disown(pg: ProcessGroup) -> None:
    """Undo ``adopt`` as the group goes (for the default group: the watchdog stops)."""
    if pg in _world.groups:
        _world.groups.remove(pg)
    if _world.default_pg is pg:
        watchdog.stop()
        _close_notice_board()
        _world.reset()


def instrument(pg: ProcessGroup, detail: bool = False, mismatch: type[Exception] = DistError) -> None:
    """Put the debug aids the settings ask for around a new group's transports (collective call):
    fingerprint checks at DETAIL (or with ``detail``) raising ``mismatch``, else the refusal notices
    (where switched on), and the flight recorder."""
    if not fingerprints.enable_checks(pg, detail, mismatch) and _world.notices is not None:
        notices.watch_refusals(pg, _world.notices)
    flight_recorder.enable_recording(pg)  # outermost: a failed check shows in the ring


def destroy_process_group(group: ProcessGroup | int | None = None) -> None:
    """Free ``group``'s communicator, or every group (and the default one) when None; a
    non-member's ``GroupMember.NON_GROUP_MEMBER`` is accepted and changes nothing."""
    if group is None or group is GroupMember.WORLD:
        default_group()
        if isinstance(_world.default_store, MPIStore):
            _world.default_store.close()  # collective: a rank done early waits here for the others,
        watchdog.stop()  # and until then answers their alarms, saying it is in destroy_process_group
        for pg in _destroy_order(_world.groups):
            pg._destroy()
        _close_notice_board()
        _world.reset()
        return
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    if not isinstance(group, ProcessGroup) or group not in _world.groups:
        raise ValueError("Invalid process group specified or has been destroyed.")
    _world.groups.remove(group)
    group._destroy()


flight_recorder.track(destroy_process_group)


def _destroy_order(groups: list[ProcessGroup]) -> list[ProcessGroup]:
    """``groups`` in the order every rank destroys them: by their ranks, the default group last.
    Groups made with ``use_local_synchronization`` exist in a different order on each rank, and
    destroying an NCCL communicator waits for the node's other members, so a rank's own order
    could make two ranks wait on each other; the newest first among groups of the same ranks."""
    newest_first = list(reversed(groups))
    default = _world.default_pg
    return sorted(newest_first, key=lambda pg: (pg is default, list(pg._global_ranks)))


def _drop_after_hang() -> None:
    """Drop every group after an operation that never completed (the testing kit's time limit),
    collectively but without touching the groups' communicators' traffic: they may hold operations
    that will never match, or be revoked. GPU transports are aborted, not drained."""
    default_group()
    watchdog.stop()
    if isinstance(_world.default_store, MPIStore):
        _world.default_store.close()  # its own communicator and windows, untouched by the hang
    for pg in reversed(_world.groups):
        gpu = cast("NCCLBackend | None", pg._transports.get("cuda"))  # or wrappers forwarding to it
        if gpu is not None:
            gpu.abort()
        pg._destroy()
    _close_notice_board()
    _world.reset()


def is_initialized() -> bool:
    """Return True once the default process group exists."""
    return _world.default_pg is not None


def is_available() -> bool:
    """Return True: the package is usable wherever mpi4py imports."""
    return True


def is_mpi_available() -> bool:
    """Return True if mpi4py is installed (does not start MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


def is_nccl_available() -> bool:
    """Return True if the NCCL library loads here and CuPy (streams, events) is installed."""
    from . import nccl

    return importlib.util.find_spec("cupy") is not None and nccl.available()


def is_gloo_available() -> bool:
    """Return True: ``"gloo"`` is served by the MPI CPU backend."""
    return is_mpi_available()


def is_ucc_available() -> bool:
    """Return False: there is no UCC backend."""
    return False


def is_xccl_available() -> bool:
    """Return False: there is no XCCL (Intel GPU) backend."""
    return False


def is_torchelastic_launched() -> bool:
    """Return True if torchelastic (torchrun) started this process."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_rank(group: ProcessGroup | None = None) -> int:
    """Return this process's rank in ``group`` (-1 if it is not a member)."""
    if group is None:
        return default_group()._rank
    pg = resolve_group(group)
    return -1 if pg is None else pg.rank()


def get_world_size(group: ProcessGroup | None = None) -> int:
    """Return the number of ranks in ``group`` (-1 if this process is not a member)."""
    if group is None:
        return default_group()._size
    pg = resolve_group(group)
    return -1 if pg is None else pg.size()


def _member_group(group: Any) -> ProcessGroup:
    pg = resolve_group(group)
    if pg is None:
        raise ValueError("Invalid process group specified")
    return pg


def get_backend(group: ProcessGroup | None = None) -> str:
    """Return the backend name of ``group`` (as given to init, e.g. ``"gloo"``)."""
    return _member_group(group).name()


def set_timeout(timeout: timedelta, group: ProcessGroup | None = None) -> None:
    """Make ``timeout`` the default of ``group``'s later operations (torch 2.14's ``set_timeout``;
    ValueError for a group this process is not in, TypeError unless a ``timedelta``)."""
    pg = _member_group(group)
    pg._timeout = require_timedelta(timeout)


def get_backend_config(group: ProcessGroup | None = None) -> str:
    """Return ``group``'s device map, e.g. ``"cpu:mpi,cuda:nccl"``."""
    return str(_member_group(group)._config)


def get_pg_count() -> int:
    """Return how many process groups have been created, the default one included."""
    return _world.group_count


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """Return this process's rank among the processes on its node.

    After ``init_process_group`` this is MPI's shared-memory split; before it, ``LOCAL_RANK``
    from the environment, then ``fallback_rank``.
    """
    if _world.node_local_rank is not None:
        return _world.node_local_rank
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("LOCAL_RANK is not set and the process group is not initialized; "
                       "call init_process_group() first or pass fallback_rank")


def get_default_backend_for_device(device: Any) -> str:
    """Return the backend name that serves ``device`` (``"cpu"``, ``"cuda"`` or a torch device)."""
    device_type = getattr(device, "type", None) or str(device).split(":")[0]
    backend = Backend.default_device_backend_map.get(device_type)
    if backend is None:
        raise ValueError(f"Default backend not registered for device : {device}")
    return backend


_COMPLEX_DENY = frozenset({RedOpType.MAX, RedOpType.MIN, RedOpType.PRODUCT,
                           RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR})


def supports_complex(reduceOp: Any) -> bool:  # noqa: N803 - torch's name
    """Return True if ``reduceOp`` can reduce complex arrays."""
    op = reduceOp if isinstance(reduceOp, RedOpType) else reduceOp.op
    return op not in _COMPLEX_DENY


def _get_default_group() -> ProcessGroup:
    """Return the default process group (ValueError before init)."""
    return default_group()


def _get_default_store() -> Store:
    """Return the store made (or given) at ``init_process_group`` (ValueError before init)."""
    default_group()
    return _world.default_store
