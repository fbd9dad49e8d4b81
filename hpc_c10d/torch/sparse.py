"""All-reduce (sum) of sparse COO tensors, as torch's gloo offers it.

Every rank's nonzeros are gathered, concatenated and coalesced: the sum's sparsity is the union
of the ranks'. Three exchanges: a fixed header (nonzeros, layout, dtype) so that every rank can
check agreement and size its receive buffers, the shape, then indices and values as raw bytes.
Agreement is checked on every rank from the same gathered headers, so all raise together.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from ..work import Work
from .ops import dtype_code
from .work import wait_within

__all__ = ["all_reduce_sparse"]


def _gather(comm: Any, mine: np.ndarray, limit: timedelta | None, what: str) -> np.ndarray:
    """Every rank's equally long int64 array, one row per rank."""
    rows = np.empty((comm.Get_size(), mine.size), np.int64)
    wait_within(Work([comm.Iallgather(mine, rows)], [], None, None), limit, what)
    return rows


def _as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's elements in row-major order, as a flat byte array (a copy only where not contiguous)."""
    if not tensor.numel():
        return np.empty(0, np.uint8)
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()


def _gather_bytes(comm: Any, send: np.ndarray, counts: np.ndarray, limit: timedelta | None,
                  what: str) -> np.ndarray:
    """Every rank's bytes, concatenated in rank order (``counts`` bytes each)."""
    received = np.empty(int(counts.sum()), np.uint8)
    request = comm.Iallgatherv(send, (received, (counts, None), MPI.BYTE))
    wait_within(Work([request], [], None, None), limit, what)
    return received


def all_reduce_sparse(comm: Any, tensor: torch.Tensor, limit: timedelta | None, what: str) -> None:
    """Replace ``tensor`` (sparse COO) by the coalesced sum of every rank's (a GPU tensor through a
    copy in host memory, as gloo does)."""
    if not tensor.is_cpu:
        on_host = tensor.cpu()
        all_reduce_sparse(comm, on_host, limit, what)
        tensor.copy_(on_host)
        return
    local = tensor.coalesce()
    values = local.values()  # (nonzeros, *dense shape)
    index_bytes = _as_bytes(local.indices().t())  # (nonzeros, sparse dims): a nonzero's indices together
    value_bytes = _as_bytes(values)  # everything that can fail here, before the first exchange
    header = np.array([local._nnz(), tensor.sparse_dim(), tensor.dense_dim(), dtype_code(tensor.dtype)], np.int64)
    headers = _gather(comm, header, limit, what)
    if (headers[:, 1:] != header[1:]).any():
        raise ValueError(f"{what}: every rank's sparse tensor must have the same sparse and dense dimensions and "
                         f"dtype (rank-by-rank [nonzeros, sparse dims, dense dims, dtype code]: {headers.tolist()})")
    shapes = _gather(comm, np.array(tensor.shape, np.int64), limit, what)
    if (shapes != shapes[0]).any():
        raise ValueError(f"{what}: every rank's sparse tensor must have the same shape (got {shapes.tolist()})")
    nonzeros = headers[:, 0]
    row = math.prod(values.shape[1:]) * values.element_size()
    all_indices = _gather_bytes(comm, index_bytes, nonzeros * tensor.sparse_dim() * 8, limit, what)
    all_values = _gather_bytes(comm, value_bytes, nonzeros * row, limit, what)
    total = int(nonzeros.sum())
    if total == 0:  # nothing anywhere: the sum is empty too
        tensor.copy_(local)
        return
    summed = torch.sparse_coo_tensor(
        torch.from_numpy(all_indices).view(torch.int64).reshape(total, tensor.sparse_dim()).t(),
        torch.from_numpy(all_values).view(tensor.dtype).reshape(total, *values.shape[1:]),
        tensor.shape,
    ).coalesce()
    tensor.copy_(summed)
