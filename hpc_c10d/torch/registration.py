"""Tell torch.distributed about backend ``"hpc"`` and the ``mpi://`` rendezvous (cheap: starts no MPI)."""

from __future__ import annotations

import importlib
from typing import Any

import torch.distributed as dist

from .devices import BACKEND_NAME, devices
from .p2p import install as install_p2p
from .rendezvous import SCHEME, env_or_mpi_rendezvous, mpi_rendezvous
from .shrink import install as install_shrink_group
from .version import python_backends

__all__ = ["BACKEND_NAME", "register", "devices"]


def _create(options: Any, backend_options: Any) -> Any:
    """torch's backend creator (extended API): a ProcessGroupHPC on the group's own communicator
    (from torch 2.14 a per-device Backend, which torch puts in its own ProcessGroup)."""
    from .comms import group_communicator
    from .process_group import PER_DEVICE_BACKEND, ProcessGroupHPC
    from .rendezvous import claim_for_mpi

    claim_for_mpi(options.store)  # an env:// store under MASTER_ADDR/MASTER_PORT: MPI's, no port
    ranks = list(options.global_ranks_in_group)
    comm = group_communicator(ranks, options.group_rank, options.group_size)
    backend = ProcessGroupHPC(comm, ranks, options.group_id, options.timeout, options.store)
    return backend._held_by(options.process_group) if PER_DEVICE_BACKEND else backend


def _without_torchs_detail_wrapper(create_wrapper: Any) -> Any:
    """torch's DETAIL wrapper factory, leaving backend "hpc" unwrapped.

    From torch 2.14 "hpc" is a per-device ``Backend``, which torch wraps at DETAIL in a checker
    that compares each collective over a gloo group of its own (TCP sockets, an open port).
    hpc_c10d compares them itself, over MPI (``instrument(detail=...)``), so ours is left as it is.
    """
    def create_process_group_wrapper(wrapped_pg: Any, *args: Any, **kwargs: Any) -> Any:
        from .process_group import ProcessGroupHPC

        if isinstance(wrapped_pg, ProcessGroupHPC):
            return wrapped_pg
        return create_wrapper(wrapped_pg, *args, **kwargs)

    create_process_group_wrapper.wraps_detail_wrapper = True  # type: ignore[attr-defined]
    return create_process_group_wrapper


def register() -> None:
    """Register backend ``"hpc"``, the ``mpi://`` rendezvous and the MPI fallback of ``env://``.

    Idempotent. Runs at ``import torch`` through the ``torch.backends`` entry point, so it only
    fills torch's tables: MPI starts when a process group is created.
    """
    install_shrink_group()  # torch's shrink_group, for backend "hpc" too
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=devices())
    c10d: Any = importlib.import_module("torch.distributed.distributed_c10d")
    install_p2p(handles=python_backends())  # handles of its own where "hpc" is a per-device Backend (>= 2.14)
    if python_backends():
        if not hasattr(c10d._create_process_group_wrapper, "wraps_detail_wrapper"):
            c10d._create_process_group_wrapper = _without_torchs_detail_wrapper(c10d._create_process_group_wrapper)
    # torch 2.15 hooks its flight recorder onto the C++ group of each backend that does not record
    # its own operations; ours has no C++ side, and hpc_c10d keeps its own flight recorder
    self_recording = getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if self_recording is not None:
        self_recording.add(BACKEND_NAME)
    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the package's name is a function
    handlers = rendezvous._rendezvous_handlers
    if SCHEME not in handlers:
        rendezvous.register_rendezvous_handler(SCHEME, mpi_rendezvous)
    env = handlers.get("env")
    if env is not None and not hasattr(env, "wraps_env_handler"):
        # register_rendezvous_handler refuses to replace a scheme, so the table entry is swapped
        handlers["env"] = env_or_mpi_rendezvous(env)
