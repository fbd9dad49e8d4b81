"""Bad input gets torch's error type before any communication.

Every case below is invalid on EVERY rank, so all ranks raise without entering MPI; a WORLD
all_reduce after each multi-rank test proves that no rank was left waiting in a collective.
Errors that need a fresh process (before init, bad init arguments) run in a plain
``python -c`` subprocess, outside mpiexec.
"""
import os
import re
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import Callable, NamedTuple

import numpy as np
import pytest

import hpc_c10d as dist
from support.launch import ROOT, fresh_env
from support.reference import assert_in_sync

try:
    import torch
except ImportError:  # torch is optional: its cases skip
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

F32 = np.float32


@pytest.fixture(autouse=True)
def _nobody_left_behind(request):
    """After each multi-rank test, every rank must still reach the same all_reduce."""
    yield
    if request.node.get_closest_marker("mpi") is not None:
        assert_in_sync()


def _a(n=4, dtype=F32):
    return np.zeros(n, dtype)


def _readonly(n=4, dtype=F32):
    x = np.zeros(n, dtype)
    x.flags.writeable = False
    return x


def _strided(n=4, dtype=F32):
    return np.zeros(2 * n, dtype)[::2]


class Case(NamedTuple):
    """One row of the bad-input table (docs/bad_input.md is rendered from these rows)."""

    function: str
    wrong: str  # what is wrong with the call
    error: type
    message: str  # a phrase the message must contain
    call: Callable  # call(rank, size, first_only): invalid on every rank that makes it
    members_only: bool = False  # uses first_only: only its member (rank 0) makes the call


NOT_ARRAY = "expected an array (numpy, torch tensor, DLPack or buffer object)"
DTYPES_DIFFER = "Invalid usage of tensors with different dtypes"
ONE_PER_RANK = "must hold one array per rank of the group"
NOT_CONTIGUOUS = "must be C-contiguous because the result is written into it in place"
READ_ONLY = "is read-only, but the result is written into it in place"
NOT_MEMBER = "is not part of group"
NOT_A_GROUP = "Expecting a ProcessGroup"
NOT_TIMEDELTA = "Expected timeout argument to be of type datetime.timedelta"

# first_only: a group of global rank 0 alone. Root-only lists are given on every rank with
# every rank as its own root, so that every rank finds the same fault.
CASES = [
    # not an array, not a list, not a group, not an op
    Case("all_reduce", "a Python list as tensor", TypeError, NOT_ARRAY, lambda r, s, g: dist.all_reduce([1.0, 2.0])),
    Case("all_reduce", "a Python float as tensor", TypeError, NOT_ARRAY, lambda r, s, g: dist.all_reduce(3.0)),
    Case("broadcast", "a Python list as tensor", TypeError, NOT_ARRAY, lambda r, s, g: dist.broadcast([1.0], src=0)),
    Case("reduce", "a tuple as tensor", TypeError, NOT_ARRAY, lambda r, s, g: dist.reduce((1, 2), dst=0)),
    Case("send", "a Python list as tensor", TypeError, NOT_ARRAY, lambda r, s, g: dist.send([1.0], dst=(r + 1) % s)),
    Case("irecv", "a Python list as tensor", TypeError, NOT_ARRAY, lambda r, s, g: dist.irecv([1, 2])),
    Case("all_gather", "lists in the output list", TypeError, NOT_ARRAY,
         lambda r, s, g: dist.all_gather([[0.0] * 4] * s, _a())),
    Case("all_gather", "a list as input", TypeError, NOT_ARRAY,
         lambda r, s, g: dist.all_gather([_a() for _ in range(s)], [0.0] * 4)),
    Case("all_gather", "an array as output list", TypeError, "expected `tensor_list` to be a list of arrays",
         lambda r, s, g: dist.all_gather(_a(4 * s), _a())),
    Case("all_reduce", "op given as a string", TypeError, "op must be a ReduceOp",
         lambda r, s, g: dist.all_reduce(_a(), op="sum")),
    Case("all_reduce", "an int as group", TypeError, NOT_A_GROUP, lambda r, s, g: dist.all_reduce(_a(), group=5)),
    Case("barrier", "a string as group", TypeError, NOT_A_GROUP, lambda r, s, g: dist.barrier(group="x")),
    Case("get_rank", "an int as group", TypeError, NOT_A_GROUP, lambda r, s, g: dist.get_rank(group=3)),
    Case("get_world_size", "an int as group", TypeError, NOT_A_GROUP, lambda r, s, g: dist.get_world_size(group=3)),
    # unsupported op and dtype pairs
    Case("all_reduce", "BAND on float32", ValueError, "does not support bitwise RedOpType.BAND",
         lambda r, s, g: dist.all_reduce(_a(), op=dist.ReduceOp.BAND)),
    Case("all_reduce", "MAX on complex64", ValueError, "does not support RedOpType.MAX on complex",
         lambda r, s, g: dist.all_reduce(_a(dtype=np.complex64), op=dist.ReduceOp.MAX)),
    Case("all_reduce", "PREMUL_SUM on int32", ValueError, "PREMUL_SUM only on floating-point and complex",
         lambda r, s, g: dist.all_reduce(_a(dtype=np.int32), op=dist._make_nccl_premul_sum(2.0))),
    # lists of mixed dtypes
    Case("all_gather", "an int64 block among float32", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.all_gather([_a() for _ in range(s - 1)] + [_a(dtype=np.int64)], _a())),
    Case("all_to_all", "a float64 input among float32", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.all_to_all([_a() for _ in range(s)],
                                         [_a(dtype=np.float64)] + [_a() for _ in range(s - 1)])),
    Case("reduce_scatter", "an int32 input among float32", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.reduce_scatter(_a(), [_a(dtype=np.int32)] + [_a() for _ in range(s - 1)])),
    Case("scatter", "a generator as scatter_list (the same error on the source and elsewhere)", TypeError,
         "expected `scatter_list` to be a list of arrays",
         lambda r, s, g: dist.scatter(_a(), (_a() for _ in range(s)), src=0)),
    Case("gather", "a str as tensor and no gather_list (the same error on the destination)", TypeError, NOT_ARRAY,
         lambda r, s, g: dist.gather("abc", None, dst=0)),
    Case("scatter", "float16 inputs, float32 output", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.scatter(_a(), [_a(dtype=np.float16) for _ in range(s)], src=r)),
    Case("gather", "int8 outputs, float32 input", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.gather(_a(), [_a(dtype=np.int8) for _ in range(s)], dst=r)),
    Case("all_gather_into_tensor", "float64 output, float32 input", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.all_gather_into_tensor(_a(4 * s, np.float64), _a(4))),
    Case("reduce_scatter_tensor", "int32 output, float32 input", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.reduce_scatter_tensor(_a(4, np.int32), _a(4 * s))),
    Case("all_to_all_single", "int64 output, float32 input", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.all_to_all_single(_a(4 * s, np.int64), _a(4 * s))),
    # wrong list lengths
    Case("all_gather", "one block too many", ValueError, ONE_PER_RANK,
         lambda r, s, g: dist.all_gather([_a() for _ in range(s + 1)], _a())),
    Case("all_gather", "one block too few", ValueError, ONE_PER_RANK,
         lambda r, s, g: dist.all_gather([_a() for _ in range(s - 1)], _a())),
    Case("scatter", "one input too many", ValueError, ONE_PER_RANK,
         lambda r, s, g: dist.scatter(_a(), [_a() for _ in range(s + 1)], src=r)),
    Case("gather", "one output too many", ValueError, ONE_PER_RANK,
         lambda r, s, g: dist.gather(_a(), [_a() for _ in range(s + 1)], dst=r)),
    Case("reduce_scatter", "one input too many", ValueError, ONE_PER_RANK,
         lambda r, s, g: dist.reduce_scatter(_a(), [_a() for _ in range(s + 1)])),
    Case("all_to_all", "both lists one too long", ValueError, ONE_PER_RANK,
         lambda r, s, g: dist.all_to_all([_a() for _ in range(s + 1)], [_a() for _ in range(s + 1)])),
    Case("all_to_all", "output list one too long", ValueError, ONE_PER_RANK,
         lambda r, s, g: dist.all_to_all([_a() for _ in range(s + 1)], [_a() for _ in range(s)])),
    Case("all_gather_object", "None as object_list", TypeError, "`object_list` must be a list",
         lambda r, s, g: dist.all_gather_object(None, 1)),
    Case("all_gather_object", "an empty object_list", ValueError, "to be a list of size at least",
         lambda r, s, g: dist.all_gather_object([], 1)),
    Case("broadcast_object_list", "an int as object_list", TypeError, "`object_list` must be a list",
         lambda r, s, g: dist.broadcast_object_list(5, src=0)),
    Case("scatter_object_list", "an empty output list", ValueError, "to be a list of size at least",
         lambda r, s, g: dist.scatter_object_list([], [1] * s if r == 0 else None, src=0)),
    Case("batch_isend_irecv", "an empty op list", ValueError, "Invalid ``p2p_op_list``",
         lambda r, s, g: dist.batch_isend_irecv([])),
    Case("batch_isend_irecv", "an int in the op list", ValueError, "Invalid ``p2p_op_list``",
         lambda r, s, g: dist.batch_isend_irecv([1])),
    Case("P2POp", "broadcast as op", ValueError, "Expected ``op`` to be of type",
         lambda r, s, g: dist.P2POp(dist.broadcast, _a(), 0)),
    # wrong sizes
    Case("all_gather_into_tensor", "output one element too big", ValueError, "expected group size",
         lambda r, s, g: dist.all_gather_into_tensor(_a(4 * s + 1), _a(4))),
    Case("all_gather_into_tensor", "output one element too small", ValueError, "expected group size",
         lambda r, s, g: dist.all_gather_into_tensor(_a(4 * s - 1), _a(4))),
    Case("reduce_scatter_tensor", "output not input / size", ValueError, "expected group size",
         lambda r, s, g: dist.reduce_scatter_tensor(_a(5), _a(4 * s))),
    Case("reduce_scatter_tensor", "input not size x output", ValueError, "expected group size",
         lambda r, s, g: dist.reduce_scatter_tensor(_a(4), _a(4 * s + 2))),
    Case("all_gather", "output blocks bigger than input", ValueError, "every block must have 4",
         lambda r, s, g: dist.all_gather([_a(5) for _ in range(s)], _a(4))),
    Case("all_gather", "output blocks smaller than input", ValueError, "every block must have 4",
         lambda r, s, g: dist.all_gather([_a(3) for _ in range(s)], _a(4))),
    Case("all_to_all", "own block sizes differ", ValueError, "the block a rank sends itself must match",
         lambda r, s, g: dist.all_to_all([_a(5) for _ in range(s)], [_a(4) for _ in range(s)])),
    Case("reduce_scatter", "input blocks bigger than output", ValueError, "every block must have 4",
         lambda r, s, g: dist.reduce_scatter(_a(4), [_a(5) for _ in range(s)])),
    Case("all_to_all_single", "input splits not summing to dim 0", ValueError, "non-negative sizes adding up",
         lambda r, s, g: dist.all_to_all_single(_a(2 * s), _a(2 * s), input_split_sizes=[1] * s)),
    Case("all_to_all_single", "output splits not summing to dim 0", ValueError, "non-negative sizes adding up",
         lambda r, s, g: dist.all_to_all_single(_a(2 * s), _a(2 * s), output_split_sizes=[3] * s)),
    Case("all_to_all_single", "one split too many", ValueError, "non-negative sizes adding up",
         lambda r, s, g: dist.all_to_all_single(_a(2 * s), _a(2 * s), input_split_sizes=[2] * (s + 1))),
    # outputs that cannot be written in place
    Case("all_reduce", "a strided view", ValueError, NOT_CONTIGUOUS, lambda r, s, g: dist.all_reduce(_strided())),
    Case("broadcast", "a column of a matrix", ValueError, NOT_CONTIGUOUS,
         lambda r, s, g: dist.broadcast(np.zeros((4, 4))[:, 1], src=0)),
    Case("all_gather", "strided output blocks", ValueError, NOT_CONTIGUOUS,
         lambda r, s, g: dist.all_gather([_strided() for _ in range(s)], _a())),
    Case("all_gather_into_tensor", "a strided output", ValueError, NOT_CONTIGUOUS,
         lambda r, s, g: dist.all_gather_into_tensor(_strided(4 * s), _a())),
    Case("all_reduce", "a read-only array", ValueError, READ_ONLY, lambda r, s, g: dist.all_reduce(_readonly())),
    Case("all_gather", "read-only output blocks", ValueError, READ_ONLY,
         lambda r, s, g: dist.all_gather([_readonly() for _ in range(s)], _a())),
    Case("all_gather_into_tensor", "a read-only output", ValueError, READ_ONLY,
         lambda r, s, g: dist.all_gather_into_tensor(_readonly(4 * s), _a())),
    Case("reduce_scatter_tensor", "a read-only output", ValueError, READ_ONLY,
         lambda r, s, g: dist.reduce_scatter_tensor(_readonly(4), _a(4 * s))),
    Case("scatter", "a read-only output", ValueError, READ_ONLY,
         lambda r, s, g: dist.scatter(_readonly(), [_a() for _ in range(s)] if r == 0 else None, src=0)),
    Case("irecv", "a read-only buffer", ValueError, READ_ONLY, lambda r, s, g: dist.irecv(_readonly())),
    # ranks out of range or not in the group
    Case("broadcast", "src = world size", ValueError, NOT_MEMBER, lambda r, s, g: dist.broadcast(_a(), src=s)),
    Case("broadcast", "src negative", ValueError, NOT_MEMBER, lambda r, s, g: dist.broadcast(_a(), src=-5)),
    Case("broadcast", "group_src = group size", ValueError, "out of range for a group of size",
         lambda r, s, g: dist.broadcast(_a(), group_src=s)),
    Case("broadcast", "src not a member of group", ValueError, NOT_MEMBER,
         lambda r, s, g: dist.broadcast(_a(), src=1, group=g), members_only=True),
    Case("reduce", "dst = world size", ValueError, NOT_MEMBER, lambda r, s, g: dist.reduce(_a(), dst=s)),
    Case("reduce", "dst negative", ValueError, NOT_MEMBER, lambda r, s, g: dist.reduce(_a(), dst=-5)),
    Case("gather", "dst = world size", ValueError, NOT_MEMBER, lambda r, s, g: dist.gather(_a(), None, dst=s)),
    Case("scatter", "src negative", ValueError, NOT_MEMBER, lambda r, s, g: dist.scatter(_a(), None, src=-5)),
    Case("send", "dst = world size", ValueError, NOT_MEMBER, lambda r, s, g: dist.send(_a(), dst=s)),
    Case("send", "dst = own rank", ValueError, "should not be the same as the rank of the current process",
         lambda r, s, g: dist.send(_a(), dst=r)),
    Case("isend", "a negative tag", ValueError, "tag must be a non-negative int",
         lambda r, s, g: dist.isend(_a(), dst=r, tag=-1)),
    Case("isend", "a tag past a C int", TypeError, "no larger than MPI's TAG_UB",
         lambda r, s, g: dist.isend(_a(), dst=r, tag=2**40)),
    Case("isend", "a float tag", TypeError, "tag must be an int", lambda r, s, g: dist.isend(_a(), dst=r, tag=1.0)),
    Case("recv", "src = world size", ValueError, NOT_MEMBER, lambda r, s, g: dist.recv(_a(), src=s)),
    Case("isend", "dst given as a string", TypeError, "dst: rank must be an int",
         lambda r, s, g: dist.isend(_a(), dst="1")),
    Case("broadcast", "src given as a float", TypeError, "src: rank must be an int",
         lambda r, s, g: dist.broadcast(_a(), src=0.0)),
    Case("broadcast", "group_src given as a string", TypeError, "group_src: rank must be an int",
         lambda r, s, g: dist.broadcast(_a(), group_src="0")),
    Case("send_object_list", "dst = own rank", ValueError, "should not be the same as the rank",
         lambda r, s, g: dist.send_object_list([1], dst=r)),
    Case("broadcast_object_list", "src = world size", ValueError, NOT_MEMBER,
         lambda r, s, g: dist.broadcast_object_list([None], src=s)),
    Case("gather_object", "dst = world size", ValueError, NOT_MEMBER,
         lambda r, s, g: dist.gather_object(1, None, dst=s)),
    Case("scatter_object_list", "src negative", ValueError, NOT_MEMBER,
         lambda r, s, g: dist.scatter_object_list([None], None, src=-5)),
    Case("get_group_rank", "a global rank not in the group", ValueError, NOT_MEMBER,
         lambda r, s, g: dist.get_group_rank(g, 1), members_only=True),
    Case("get_global_rank", "a group rank past the group", ValueError, "is not part of group",
         lambda r, s, g: dist.get_global_rank(g, 1), members_only=True),
    Case("new_group", "a rank = world size", ValueError, "out of range for a world of",
         lambda r, s, g: dist.new_group([0, s])),
    Case("new_group", "a string as ranks", TypeError, "ranks must be a list of ints",
         lambda r, s, g: dist.new_group("01")),
    Case("new_group", "a duplicate rank", ValueError, "duplicate ranks", lambda r, s, g: dist.new_group([0, 0])),
    Case("new_group", "an int as timeout", TypeError, NOT_TIMEDELTA,
         lambda r, s, g: dist.new_group([0], timeout=5)),
    Case("new_group", "a zero timeout", RuntimeError, "Invalid timeout",
         lambda r, s, g: dist.new_group([0], timeout=timedelta(0))),
    Case("new_group", "a negative timeout", RuntimeError, "Invalid timeout",
         lambda r, s, g: dist.new_group([0], timeout=timedelta(seconds=-1))),
    Case("new_subgroups", "a zero timeout", RuntimeError, "Invalid timeout",
         lambda r, s, g: dist.new_subgroups(group_size=1, timeout=timedelta(0))),
    Case("monitored_barrier", "a negative timeout", RuntimeError, "Invalid timeout",
         lambda r, s, g: dist.monitored_barrier(timeout=timedelta(seconds=-1))),
    Case("new_subgroups", "group_size > world size", ValueError, "must not exceed the group size",
         lambda r, s, g: dist.new_subgroups(group_size=s + 1)),
    Case("monitored_barrier", "an int as timeout", TypeError, NOT_TIMEDELTA,
         lambda r, s, g: dist.monitored_barrier(timeout=5)),
    # a global and a group root at once
    Case("broadcast", "src and group_src", ValueError, "Can't specify both src and group_src",
         lambda r, s, g: dist.broadcast(_a(), src=0, group_src=0)),
    Case("reduce", "dst and group_dst", ValueError, "Can't specify both dst and group_dst",
         lambda r, s, g: dist.reduce(_a(), dst=0, group_dst=0)),
    Case("gather", "dst and group_dst", ValueError, "Can't specify both dst and group_dst",
         lambda r, s, g: dist.gather(_a(), [_a() for _ in range(s)] if r == 0 else None, dst=0, group_dst=0)),
    Case("scatter", "src and group_src", ValueError, "Can't specify both src and group_src",
         lambda r, s, g: dist.scatter(_a(), [_a() for _ in range(s)] if r == 0 else None, src=0, group_src=0)),
    Case("isend", "dst and group_dst", ValueError, "Can't specify both dst and group_dst",
         lambda r, s, g: dist.isend(_a(), dst=0, group_dst=0)),
    Case("broadcast_object_list", "src and group_src", ValueError, "Can't specify both src and group_src",
         lambda r, s, g: dist.broadcast_object_list([None], src=0, group_src=0)),
    # debug levels and stores (no communication)
    Case("set_debug_level", "an unknown level", ValueError, "is not a debug level",
         lambda r, s, g: dist.set_debug_level("LOUD")),
    Case("Store.set", "an int as key", TypeError, "store keys must be str",
         lambda r, s, g: dist.HashStore().set(5, "v")),
    Case("Store.set", "an int as value", TypeError, "store values must be str or bytes",
         lambda r, s, g: dist.HashStore().set("k", 5)),
    Case("Store.add", "a float amount", TypeError, "amount must be an int",
         lambda r, s, g: dist.HashStore().add("k", 1.5)),
    Case("Store.add", "a key holding text", ValueError, "is not an integer", lambda r, s, g: _add_to_text()),
    Case("Store.wait", "a string as keys", TypeError, "keys must be a list of str",
         lambda r, s, g: dist.HashStore().wait("k")),
    Case("Store.get", "a key never set", dist.DistStoreError, "keys not set: ['nokey']",
         lambda r, s, g: _short_timeout_store().get("nokey")),
    Case("Store.set_timeout", "an int", TypeError, "timeout must be a datetime.timedelta",
         lambda r, s, g: dist.HashStore().set_timeout(5)),
    Case("Store.queue_pop", "an empty queue, block=False", dist.QueueEmptyError, "is empty",
         lambda r, s, g: dist.HashStore().queue_pop("q", block=False)),
    Case("PrefixStore", "an int as store", TypeError, "store must be a Store",
         lambda r, s, g: dist.PrefixStore("p", 5)),
    Case("MPIStore.set", "a value past the capacity", dist.DistStoreError, "Nothing was changed",
         lambda r, s, g: _past_capacity(r)),
]
TORCH_CASES = [
    Case("all_gather_into_tensor", "torch float64 output, float32 input", ValueError, DTYPES_DIFFER,
         lambda r, s, g: dist.all_gather_into_tensor(torch.zeros(4 * s, dtype=torch.float64), torch.zeros(4))),
    Case("all_reduce", "a transposed torch tensor", ValueError, NOT_CONTIGUOUS,
         lambda r, s, g: dist.all_reduce(torch.zeros(3, 4).t())),
    Case("all_reduce", "MAX on a torch complex64 tensor", ValueError, "MAX",
         lambda r, s, g: dist.all_reduce(torch.zeros(4, dtype=torch.complex64), op=dist.ReduceOp.MAX)),
]


NOT_INITIALIZED = "Default process group has not been initialized, please make sure to call init_process_group."
UNINITIALIZED_CALLS = [  # (function, call): each raises ValueError(NOT_INITIALIZED) before init and after destroy
    ("all_reduce", lambda: dist.all_reduce(_a())),
    ("broadcast", lambda: dist.broadcast(_a(), src=0)),
    ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(_a(4), _a(4))),
    ("barrier", lambda: dist.barrier()),
    ("monitored_barrier", lambda: dist.monitored_barrier()),
    ("send", lambda: dist.send(_a(), dst=0)),
    ("get_rank", lambda: dist.get_rank()),
    ("get_world_size", lambda: dist.get_world_size()),
    ("new_group", lambda: dist.new_group([0])),
    ("all_gather_object", lambda: dist.all_gather_object([None], 1)),
    ("destroy_process_group", lambda: dist.destroy_process_group()),
]


def render_table() -> str:
    """The docs' table (docs/bad_input.md) from the cases above."""
    rows = ["| function | wrong input | error | the message says |", "|---|---|---|---|"]
    for case in CASES + TORCH_CASES:
        message = case.message.replace("|", "\\|")
        rows.append(f"| `{case.function}` | {case.wrong} | `{case.error.__name__}` | {message} |")
    for function, _ in UNINITIALIZED_CALLS:
        rows.append(f"| `{function}` | called before `init_process_group` or after `destroy_process_group` "
                    f"| `ValueError` | {NOT_INITIALIZED} |")
    return "\n".join(rows) + "\n"


def test_the_docs_carry_this_table():
    with open(os.path.join(ROOT, "docs", "bad_input.md")) as docs:
        assert render_table() in docs.read(), \
            "docs/bad_input.md is stale: PYTHONPATH=tests python tests/core/test_bad_input.py > table"


def _add_to_text():
    store = dist.HashStore()
    store.set("k", "abc")
    store.add("k", 1)


def _past_capacity(rank):
    store = dist.MPIStore(capacity=1 << 20)  # collective: every rank makes the call
    try:
        store.set(f"big{rank}", b"x" * (2 << 20))
    finally:
        store.close()


def _short_timeout_store():
    store = dist.HashStore()
    store.set_timeout(timedelta(milliseconds=10))
    return store


@pytest.fixture(scope="module")
def first_only(world):
    """A group of global rank 0 alone (made by every rank, as new_group requires)."""
    group = dist.new_group([0])
    yield group
    if group is not dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(group)


def _param(case, torch_needed=False):
    return pytest.param(case, id=f"{case.function}: {case.wrong}", marks=[needs_torch] if torch_needed else [])


@pytest.mark.mpi
@pytest.mark.parametrize("case", [_param(c) for c in CASES] + [_param(c, True) for c in TORCH_CASES])
def test_invalid_call_raises_before_communicating(rank, size, first_only, case):
    if case.members_only and rank != 0:
        return
    with pytest.raises(case.error, match=re.escape(case.message)):
        case.call(rank, size, first_only)


def _tag_ub():
    from mpi4py import MPI

    return dist.group.WORLD.comm.Get_attr(MPI.TAG_UB)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", ["isend", "irecv", "send", "recv", "batch_isend_irecv"])
def test_a_tag_past_mpis_tag_ub_raises_before_communicating(rank, size, call):
    """MPI refuses tags past the communicator's TAG_UB (2**29-1 with MPICH): checked up front, as
    ValueError (TypeError past a C int, as torch), not an MPI error with a misleading hint."""
    tag_ub = _tag_ub()
    np.testing.assert_array_equal(_tag_round_trip(rank, size, tag_ub), np.full(4, (rank - 1) % size, F32))
    if tag_ub >= 2**31 - 1:
        pytest.skip(f"this MPI's TAG_UB ({tag_ub}) is a C int's maximum: only TypeError is left (a table case)")
    peer = (rank + 1) % size
    calls = {"isend": lambda: dist.isend(_a(), dst=peer, tag=tag_ub + 1),
             "irecv": lambda: dist.irecv(_a(), src=peer, tag=tag_ub + 1),
             "send": lambda: dist.send(_a(), dst=peer, tag=2**31 - 1),
             "recv": lambda: dist.recv(_a(), src=peer, tag=tag_ub + 1),
             "batch_isend_irecv": lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, _a(), peer, tag=0),
                                                                  dist.P2POp(dist.irecv, _a(), peer, tag=tag_ub + 1)])}
    with pytest.raises(ValueError, match=rf"no larger than MPI's TAG_UB \({tag_ub}\), got ({tag_ub + 1}|{2**31 - 1})$"):
        calls[call]()


def _tag_round_trip(rank, size, tag):
    """Send this rank's number to the next rank with ``tag``; return what came from the previous one."""
    got = np.zeros(4, F32)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, np.full(4, rank, F32), (rank + 1) % size, tag=tag),
                                    dist.P2POp(dist.irecv, got, (rank - 1) % size, tag=tag)])
    for work in works:
        work.wait()
    return got


@pytest.mark.mpi
@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint8, "tensor"])
def test_ranks_and_tags_may_be_any_integral_index(rank, size, kind):
    """torch takes any integral index (operator.index) as a rank or tag: numpy integers, 0-d integer
    tensors. Every rank/root/src/dst/group_dst argument, here each once."""
    if kind == "tensor":
        if torch is None:
            pytest.skip("torch is not installed")
        integral = lambda n: torch.tensor(n)  # noqa: E731
    else:
        integral = kind
    last, nxt, prev = size - 1, (rank + 1) % size, (rank - 1) % size
    x = np.full(3, rank + 1.0, F32)
    dist.broadcast(x, src=integral(last))
    np.testing.assert_array_equal(x, np.full(3, size, F32))
    dist.broadcast(x, group_src=integral(0))
    y = np.ones(3, F32)
    dist.reduce(y, dst=integral(last))
    if rank == last:
        np.testing.assert_array_equal(y, np.full(3, size, F32))
    dist.reduce(np.ones(3, F32), group_dst=integral(0))
    blocks = [np.zeros(3, F32) for _ in range(size)] if rank == 0 else None
    dist.gather(np.full(3, rank, F32), blocks, dst=integral(0))
    if rank == 0:
        np.testing.assert_array_equal(np.stack(blocks), np.repeat(np.arange(size, dtype=F32), 3).reshape(size, 3))
    out = np.zeros(3, F32)
    dist.scatter(out, [np.full(3, i, F32) for i in range(size)] if rank == last else None, group_src=integral(last))
    np.testing.assert_array_equal(out, np.full(3, rank, F32))
    got = np.zeros(3, F32)
    works = [dist.isend(np.full(3, rank, F32), dst=integral(nxt), tag=integral(7)),
             dist.irecv(got, src=integral(prev), tag=integral(7))]
    for work in works:
        work.wait()
    np.testing.assert_array_equal(got, np.full(3, prev, F32))
    objects = ["hi"] if rank == 0 else [None]
    dist.broadcast_object_list(objects, src=integral(0))
    assert objects == ["hi"]
    group = dist.new_group([integral(r) for r in range(size)])
    assert dist.get_global_rank(group, integral(last)) == last
    assert dist.get_group_rank(group, integral(last)) == last
    dist.destroy_process_group(group)


BITWISE = [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
ORDERING = [dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", BITWISE, ids=lambda o: o.name)
def test_bitwise_op_on_floats_raises(rank, size, op, dtype):
    with pytest.raises(ValueError, match=op.name):
        dist.all_reduce(_a(dtype=dtype), op=op)
    with pytest.raises(ValueError, match=op.name):
        dist.reduce(_a(dtype=dtype), dst=0, op=op)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ORDERING, ids=lambda o: o.name)
def test_ordering_op_on_complex_raises(rank, size, op, dtype):
    with pytest.raises(ValueError, match=op.name):
        dist.all_reduce(_a(dtype=dtype), op=op)
    with pytest.raises(ValueError, match=op.name):
        dist.reduce_scatter_tensor(_a(dtype=dtype), _a(4 * size, dtype=dtype), op=op)


@pytest.mark.mpi
def test_init_twice_raises(rank, size):
    with pytest.raises(ValueError, match=r"trying to initialize the default process group twice!"):
        dist.init_process_group()
    assert dist.is_initialized()
    assert dist.get_world_size() == size


# ---------------------------------------------------------------- fresh processes

def _run_fresh(code):
    """Run `code` in a new Python started without mpiexec (a singleton MPI world)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=fresh_env(), cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "ALL OK" in proc.stdout, proc.stdout


_EXPECT_RAISES = """
import re
import numpy as np
import hpc_c10d as dist

def expect(exc, pattern, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert re.search(pattern, str(e)), f"{fn.__name__}: message {str(e)!r} !~ {pattern!r}"
    else:
        raise AssertionError(f"{fn.__name__}{args}{kwargs} did not raise {exc.__name__}")
"""


def test_calls_before_init_and_after_destroy_raise_value_error():
    _run_fresh(r"""
import sys
sys.path[:0] = ["tests", "tests/core"]  # support/, and this file
import numpy as np
import hpc_c10d as dist
from test_bad_input import NOT_INITIALIZED, UNINITIALIZED_CALLS

def check(when):
    for function, call in UNINITIALIZED_CALLS:
        try:
            call()
        except ValueError as exc:
            assert NOT_INITIALIZED in str(exc), (when, function, str(exc))
        else:
            raise AssertionError(f"{function} {when} did not raise")
    assert not dist.is_initialized()

check("before init")
dist.init_process_group()
x = np.ones(3)
dist.all_reduce(x)
assert x.tolist() == [1.0, 1.0, 1.0]
dist.destroy_process_group()
check("after destroy")
print("ALL OK")
""")


def test_init_with_rank_or_world_size_disagreeing_with_mpi():
    _run_fresh(_EXPECT_RAISES + r"""
for kwargs in ({"rank": 1, "world_size": 2}, {"world_size": 3}, {"rank": 2},
               {"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 1}):
    expect(ValueError, r".", dist.init_process_group, **kwargs)
    assert not dist.is_initialized(), kwargs
dist.init_process_group(rank=0, world_size=1)  # agrees with the singleton world
assert dist.get_rank() == 0 and dist.get_world_size() == 1
x = np.arange(3, dtype=np.int64)
dist.all_reduce(x)
assert x.tolist() == [0, 1, 2]
dist.destroy_process_group()
print("ALL OK")
""")


def test_init_with_unknown_backend():
    _run_fresh(_EXPECT_RAISES + r"""
expect(ValueError, r"nonsense", dist.init_process_group, backend="nonsense")
assert not dist.is_initialized()
dist.init_process_group()
x = np.ones(2)
dist.all_reduce(x)
assert x.tolist() == [1.0, 1.0]
expect(ValueError, r"trying to initialize the default process group twice!", dist.init_process_group)
dist.destroy_process_group()
assert not dist.is_initialized()
print("ALL OK")
""")


def test_init_timeout_must_be_timedelta():
    _run_fresh(_EXPECT_RAISES + r"""
expect(TypeError, r"timedelta", dist.init_process_group, timeout=30)
from datetime import timedelta
expect(RuntimeError, r"Invalid timeout", dist.init_process_group, timeout=timedelta(0))
assert not dist.is_initialized()
print("ALL OK")
""")


if __name__ == "__main__":
    print(render_table(), end="")


def test_init_where_mpi_sees_each_launched_process_alone():
    """torchrun (or srun without --mpi) starts N processes that MPI sees as N worlds of 1."""
    _run_fresh(_EXPECT_RAISES + r"""
import os
os.environ.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
expect(ValueError, r"torchrun started 2 processes, but MPI sees each one as a world of 1", dist.init_process_group)
assert not dist.is_initialized()
print("ALL OK")
""")
