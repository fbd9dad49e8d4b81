"""Bad input gets torch's error type before any communication.

Every case below is invalid on EVERY rank, so all ranks raise without entering MPI; a WORLD
all_reduce after each multi-rank test proves that no rank was left waiting in a collective.
Errors that need a fresh process (before init, bad init arguments) run in a plain
``python -c`` subprocess, outside mpiexec.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hpc_c10d as dist
from _reference import assert_in_sync

try:
    import torch
except ImportError:  # torch is optional: its cases skip
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


# (id, exception, message regex, call(rank, size)); each call is invalid on every rank.
CASES = [
    # not an array
    ("all_reduce_python_list", TypeError, None, lambda r, s: dist.all_reduce([1.0, 2.0])),
    ("all_reduce_python_float", TypeError, None, lambda r, s: dist.all_reduce(3.0)),
    ("broadcast_python_list", TypeError, None, lambda r, s: dist.broadcast([1.0], src=0)),
    ("reduce_tuple", TypeError, None, lambda r, s: dist.reduce((1, 2), dst=0)),
    ("irecv_python_list", TypeError, None, lambda r, s: dist.irecv([1, 2])),
    ("all_gather_output_lists", TypeError, None, lambda r, s: dist.all_gather([[0.0] * 4] * s, _a())),
    ("all_gather_input_list", TypeError, None, lambda r, s: dist.all_gather([_a() for _ in range(s)], [0.0] * 4)),
    ("all_gather_output_not_a_list", TypeError, None, lambda r, s: dist.all_gather(_a(4 * s), _a())),
    # lists of mixed dtypes
    ("all_gather_mixed_dtypes", ValueError, "(?i)dtype",
     lambda r, s: dist.all_gather([_a() for _ in range(s - 1)] + [_a(dtype=np.int64)], _a())),
    ("all_to_all_mixed_dtypes", ValueError, "(?i)dtype",
     lambda r, s: dist.all_to_all([_a() for _ in range(s)], [_a(dtype=np.float64)] + [_a() for _ in range(s - 1)])),
    ("reduce_scatter_mixed_dtypes", ValueError, "(?i)dtype",
     lambda r, s: dist.reduce_scatter(_a(), [_a(dtype=np.int32)] + [_a() for _ in range(s - 1)])),
    ("scatter_mixed_dtypes", ValueError, None,
     lambda r, s: dist.scatter(_a(), [_a(dtype=np.float16) for _ in range(s)], src=0)),
    ("gather_mixed_dtypes", ValueError, None,
     lambda r, s: dist.gather(_a(), [_a(dtype=np.int8) for _ in range(s)], dst=0)),
    # wrong list lengths
    ("all_gather_list_too_long", ValueError, None, lambda r, s: dist.all_gather([_a() for _ in range(s + 1)], _a())),
    ("all_gather_list_too_short", ValueError, None, lambda r, s: dist.all_gather([_a() for _ in range(s - 1)], _a())),
    ("scatter_list_too_long", ValueError, None, lambda r, s: dist.scatter(_a(), [_a() for _ in range(s + 1)], src=0)),
    ("gather_list_too_long", ValueError, None, lambda r, s: dist.gather(_a(), [_a() for _ in range(s + 1)], dst=0)),
    ("reduce_scatter_list_too_long", ValueError, None,
     lambda r, s: dist.reduce_scatter(_a(), [_a() for _ in range(s + 1)])),
    ("all_to_all_lists_too_long", ValueError, None,
     lambda r, s: dist.all_to_all([_a() for _ in range(s + 1)], [_a() for _ in range(s + 1)])),
    ("all_to_all_output_list_too_long", ValueError, None,
     lambda r, s: dist.all_to_all([_a() for _ in range(s + 1)], [_a() for _ in range(s)])),
    # wrong output sizes
    ("all_gather_into_tensor_output_too_big", ValueError, None,
     lambda r, s: dist.all_gather_into_tensor(_a(4 * s + 1), _a(4))),
    ("all_gather_into_tensor_output_too_small", ValueError, None,
     lambda r, s: dist.all_gather_into_tensor(_a(4 * s - 1), _a(4))),
    ("reduce_scatter_tensor_output_wrong", ValueError, None,
     lambda r, s: dist.reduce_scatter_tensor(_a(5), _a(4 * s))),
    ("reduce_scatter_tensor_input_wrong", ValueError, None,
     lambda r, s: dist.reduce_scatter_tensor(_a(4), _a(4 * s + 2))),
    ("all_gather_element_too_big", ValueError, None,
     lambda r, s: dist.all_gather([_a(5) for _ in range(s)], _a(4))),
    ("all_gather_element_too_small", ValueError, None,
     lambda r, s: dist.all_gather([_a(3) for _ in range(s)], _a(4))),
    ("all_to_all_element_sizes_differ", ValueError, None,
     lambda r, s: dist.all_to_all([_a(5) for _ in range(s)], [_a(4) for _ in range(s)])),
    ("reduce_scatter_element_sizes_differ", ValueError, None,
     lambda r, s: dist.reduce_scatter(_a(4), [_a(5) for _ in range(s)])),
    # output dtype != input dtype
    ("all_gather_into_tensor_dtype", ValueError, "(?i)dtype",
     lambda r, s: dist.all_gather_into_tensor(_a(4 * s, np.float64), _a(4))),
    ("reduce_scatter_tensor_dtype", ValueError, "(?i)dtype",
     lambda r, s: dist.reduce_scatter_tensor(_a(4, np.int32), _a(4 * s))),
    ("all_to_all_single_dtype", ValueError, "(?i)dtype",
     lambda r, s: dist.all_to_all_single(_a(4 * s, np.int64), _a(4 * s))),
    ("torch_all_gather_into_tensor_dtype", ValueError, "(?i)dtype",
     lambda r, s: dist.all_gather_into_tensor(torch.zeros(4 * s, dtype=torch.float64), torch.zeros(4))),
    # non-contiguous outputs
    ("all_reduce_strided", ValueError, "(?i)contiguous", lambda r, s: dist.all_reduce(_strided())),
    ("broadcast_column", ValueError, "(?i)contiguous", lambda r, s: dist.broadcast(np.zeros((4, 4))[:, 1], src=0)),
    ("all_gather_strided_output", ValueError, "(?i)contiguous",
     lambda r, s: dist.all_gather([_strided() for _ in range(s)], _a())),
    ("all_gather_into_tensor_strided_output", ValueError, "(?i)contiguous",
     lambda r, s: dist.all_gather_into_tensor(_strided(4 * s), _a())),
    ("torch_all_reduce_transposed", ValueError, "(?i)contiguous",
     lambda r, s: dist.all_reduce(torch.zeros(3, 4).t())),
    # read-only outputs
    ("all_reduce_readonly", ValueError, "(?i)(read-?only|writ)", lambda r, s: dist.all_reduce(_readonly())),
    ("all_gather_readonly_output", ValueError, "(?i)(read-?only|writ)",
     lambda r, s: dist.all_gather([_readonly() for _ in range(s)], _a())),
    ("all_gather_into_tensor_readonly", ValueError, "(?i)(read-?only|writ)",
     lambda r, s: dist.all_gather_into_tensor(_readonly(4 * s), _a())),
    ("reduce_scatter_tensor_readonly", ValueError, "(?i)(read-?only|writ)",
     lambda r, s: dist.reduce_scatter_tensor(_readonly(4), _a(4 * s))),
    ("scatter_readonly_output", ValueError, "(?i)(read-?only|writ)",
     lambda r, s: dist.scatter(_readonly(), [_a() for _ in range(s)] if r == 0 else None, src=0)),
    ("irecv_readonly", ValueError, "(?i)(read-?only|writ)", lambda r, s: dist.irecv(_readonly())),
    # src / dst out of range
    ("broadcast_src_size", ValueError, None, lambda r, s: dist.broadcast(_a(), src=s)),
    ("broadcast_src_negative", ValueError, None, lambda r, s: dist.broadcast(_a(), src=-5)),
    ("broadcast_group_src_size", ValueError, None, lambda r, s: dist.broadcast(_a(), group_src=s)),
    ("reduce_dst_size", ValueError, None, lambda r, s: dist.reduce(_a(), dst=s)),
    ("reduce_dst_negative", ValueError, None, lambda r, s: dist.reduce(_a(), dst=-5)),
    ("gather_dst_size", ValueError, None, lambda r, s: dist.gather(_a(), None, dst=s)),
    ("scatter_src_negative", ValueError, None, lambda r, s: dist.scatter(_a(), None, src=-5)),
    ("broadcast_object_list_src_size", ValueError, None, lambda r, s: dist.broadcast_object_list([None], src=s)),
    ("gather_object_dst_size", ValueError, None, lambda r, s: dist.gather_object(1, None, dst=s)),
    ("scatter_object_list_src_negative", ValueError, None,
     lambda r, s: dist.scatter_object_list([None], None, src=-5)),
    # a global and a group root at once
    ("broadcast_src_and_group_src", ValueError, None, lambda r, s: dist.broadcast(_a(), src=0, group_src=0)),
    ("reduce_dst_and_group_dst", ValueError, None, lambda r, s: dist.reduce(_a(), dst=0, group_dst=0)),
    ("gather_dst_and_group_dst", ValueError, None,
     lambda r, s: dist.gather(_a(), [_a() for _ in range(s)] if r == 0 else None, dst=0, group_dst=0)),
    ("scatter_src_and_group_src", ValueError, None,
     lambda r, s: dist.scatter(_a(), [_a() for _ in range(s)] if r == 0 else None, src=0, group_src=0)),
    ("isend_dst_and_group_dst", ValueError, None, lambda r, s: dist.isend(_a(), dst=0, group_dst=0)),
    ("broadcast_object_list_src_and_group_src", ValueError, None,
     lambda r, s: dist.broadcast_object_list([None], src=0, group_src=0)),
    # all_to_all_single split sizes
    ("all_to_all_single_input_splits_sum", ValueError, None,
     lambda r, s: dist.all_to_all_single(_a(2 * s), _a(2 * s), input_split_sizes=[1] * s)),
    ("all_to_all_single_output_splits_sum", ValueError, None,
     lambda r, s: dist.all_to_all_single(_a(2 * s), _a(2 * s), output_split_sizes=[3] * s)),
    ("all_to_all_single_splits_length", ValueError, None,
     lambda r, s: dist.all_to_all_single(_a(2 * s), _a(2 * s), input_split_sizes=[2] * (s + 1))),
]


@pytest.mark.mpi
@pytest.mark.parametrize(
    "exc, match, call",
    [pytest.param(*c[1:], id=c[0], marks=[needs_torch] if c[0].startswith("torch_") else []) for c in CASES],
)
def test_invalid_call_raises_before_communicating(rank, size, exc, match, call):
    with pytest.raises(exc, match=match):
        call(rank, size)


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


@needs_torch
@pytest.mark.mpi
def test_torch_complex_max_raises(rank, size):
    with pytest.raises(ValueError, match="MAX"):
        dist.all_reduce(torch.zeros(4, dtype=torch.complex64), op=dist.ReduceOp.MAX)


@pytest.mark.mpi
def test_init_twice_raises(rank, size):
    with pytest.raises(ValueError, match=r"trying to initialize the default process group twice!"):
        dist.init_process_group()
    assert dist.is_initialized()
    assert dist.get_world_size() == size


# ---------------------------------------------------------------- fresh processes

_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", "MPI_LOCAL")


def _run_fresh(code):
    """Run `code` in a new Python started without mpiexec (a singleton MPI world)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=180,
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


def test_calls_before_init_raise_value_error():
    _run_fresh(_EXPECT_RAISES + r"""
NOT_INIT = (r"Default process group has not been initialized, "
            r"please make sure to call init_process_group\.")
assert not dist.is_initialized()
x = np.ones(3, np.float32)
expect(ValueError, NOT_INIT, dist.all_reduce, x)
expect(ValueError, NOT_INIT, dist.broadcast, x, src=0)
expect(ValueError, NOT_INIT, dist.barrier)
expect(ValueError, NOT_INIT, dist.get_rank)
expect(ValueError, NOT_INIT, dist.get_world_size)
expect(ValueError, NOT_INIT, dist.new_group, [0])
expect(ValueError, NOT_INIT, dist.all_gather_object, [None], 1)
np.testing.assert_array_equal(x, np.ones(3, np.float32))
assert not dist.is_initialized()
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
assert not dist.is_initialized()
print("ALL OK")
""")
