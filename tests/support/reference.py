"""Deterministic per-rank test data and numpy reference results for the collective tests.

Every rank can rebuild every other rank's input locally (data depends only on shape, dtype,
rank and world size), so each test computes its expected result with plain numpy and
compares exactly.  Values are small integers (or powers of two for PRODUCT) so that sums
and products are exact even in float16 / bfloat16.
"""
import math

import ml_dtypes
import numpy as np

import hpc_c10d as dist

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

BOOL_DTYPES = [np.dtype(np.bool_)]
INT_DTYPES = [np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16,
                                    np.int32, np.uint32, np.int64, np.uint64)]
FLOAT_DTYPES = [np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64)]
COMPLEX_DTYPES = [np.dtype(np.complex64), np.dtype(np.complex128)]
ALL_DTYPES = BOOL_DTYPES + INT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES

OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM"]
PREMUL_FACTOR = 2.0

# Shapes exercised by the shape-generic tests: 0-d, empty, 1-d, 3-d.
SHAPES = [(), (0,), (7,), (2, 3, 4)]


def dtype_id(dt):
    """Readable pytest id for a dtype."""
    return np.dtype(dt).name


def category(dt):
    dt = np.dtype(dt)
    if dt == np.bool_:
        return "bool"
    if dt in INT_DTYPES:
        return "int"
    if dt in FLOAT_DTYPES:
        return "float"
    if dt in COMPLEX_DTYPES:
        return "complex"
    raise AssertionError(f"unexpected dtype {dt}")


def op_valid(dt, op):
    """The library's validity matrix: may ``op`` (a name from OPS) reduce arrays of ``dt``."""
    cat = category(dt)
    if cat == "int":
        return op != "PREMUL_SUM"
    if cat == "float":
        return op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM")
    if cat == "complex":
        return op in ("SUM", "AVG", "PREMUL_SUM")
    return op not in ("AVG", "PREMUL_SUM")  # bool


def make_op(op, factor=PREMUL_FACTOR):
    """The ReduceOp object for an op name (PREMUL_SUM built with ``factor``)."""
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, op)


def _wide(dt):
    cat = category(dt)
    if cat == "int":
        return np.dtype(np.uint64) if np.dtype(dt).kind == "u" else np.dtype(np.int64)
    return np.dtype(np.complex128) if cat == "complex" else np.dtype(np.float64)


def _index(shape):
    return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)


def rank_data(shape, dt, seed):
    """Data that differs between seeds (ranks) for gathers/scatters; small integer values.

    Seeds 0..20 give pairwise-different arrays once there are >= 16 elements; values stay
    within int8 range."""
    dt = np.dtype(dt)
    i = _index(shape)
    s = seed % 7
    cat = category(dt)
    if cat == "bool":
        # one pseudo-random bit per element (Knuth multiplicative hash of position and seed)
        v = ((((i + 1) * (2 * seed + 3) * 2654435761) % 2**32) >> 16) & 1 == 1
    else:
        v = ((i + 3 * seed) % 16) - 8 + 16 * s
        if cat == "complex":
            v = v + 1j * (-(i % 5) - s)
        elif dt.kind == "u":
            v = v + 8
    return np.asarray(v).astype(dt)  # np.asarray: 0-d arithmetic yields numpy scalars


def reduce_inputs(shape, dt, op, size):
    """Per-rank inputs (a list indexed by rank) whose ``op`` reduction is exact in ``dt``."""
    dt = np.dtype(dt)
    i = _index(shape)
    cat = category(dt)
    out = []
    for r in range(size):
        if cat == "bool":
            # bit r of the position: over >= 2**size positions every truth-table row appears
            v = ((i >> (r % 8)) & 1).astype(bool)
        elif op == "PRODUCT":
            # +-1 and +-2 only: products stay exact and far from overflow
            v = np.array([1, 2, -1, -2, 1, 1])[(i + r) % 6]
            if dt.kind == "u":
                v = np.abs(v)
            v = v.astype(dt)
        elif op == "AVG" and cat in ("float", "complex"):
            # rank r contributes b + size*r: the sum is divisible by size, so the mean is exact
            b = (i % 7) - 3
            v = (b + size * r + (1j * ((i % 3) - size * r) if cat == "complex" else 0)).astype(dt)
        else:
            # in [-3, 3]; position- and rank-dependent so integer AVG sums are often not
            # divisible by the group size (truncation is observable)
            v = ((i * (r + 1) + r) % 7) - 3
            if cat == "complex":
                v = v + 1j * (((i + 2 * r) % 5) - 2)
            elif dt.kind == "u":
                v = v + 3
            v = v.astype(dt)
        out.append(np.asarray(v, dtype=dt))
    return out


def reduce_ref(arrays, op, factor=PREMUL_FACTOR):
    """numpy reference for reducing ``arrays`` (one per rank) with op name ``op``."""
    dt = arrays[0].dtype
    n = len(arrays)
    raw = np.stack(arrays)
    if dt == np.bool_:
        fn = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or,
              "PRODUCT": np.logical_and, "MIN": np.logical_and, "BAND": np.logical_and,
              "BXOR": np.logical_xor}[op]
        return np.asarray(fn.reduce(raw, axis=0)).astype(dt)
    if op in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
        return np.asarray(fn.reduce(raw, axis=0)).astype(dt)
    s = raw.astype(_wide(dt))
    if op == "SUM":
        res = s.sum(axis=0)
    elif op == "PRODUCT":
        res = s.prod(axis=0)
    elif op == "MIN":
        res = s.min(axis=0)
    elif op == "MAX":
        res = s.max(axis=0)
    elif op == "AVG":
        tot = s.sum(axis=0)
        if category(dt) == "int":
            # integer mean truncates toward zero
            res = tot // n if dt.kind == "u" else np.sign(tot) * (np.abs(tot) // n)
        else:
            res = tot / n
    elif op == "PREMUL_SUM":
        res = factor * s.sum(axis=0)
    else:
        raise AssertionError(op)
    return np.asarray(res).astype(dt)


def assert_same(actual, expected):
    """Exact equality including dtype and shape."""
    assert isinstance(actual, np.ndarray), type(actual)
    np.testing.assert_array_equal(actual, expected, strict=True)


def empty_like_filled(shape, dt):
    """An output buffer pre-filled with a sentinel, so an untouched buffer is detected."""
    dt = np.dtype(dt)
    fill = True if dt == np.bool_ else 99
    return np.full(shape, fill, dtype=dt)


def split_count(src, dst):
    """all_to_all: rows rank ``src`` sends to rank ``dst`` (asymmetric, sometimes 0)."""
    return (src + 2 * dst + 1) % 4


def a2a_chunk(src, dst, dt, rows, tail=()):
    """all_to_all: the block rank ``src`` sends to rank ``dst`` (``rows`` x ``tail``)."""
    i = _index((rows,) + tuple(tail))
    dt = np.dtype(dt)
    if dt == np.bool_:
        return ((i + src + 2 * dst) % 3 == 0)
    return (16 * (src % 4) + 4 * (dst % 4) + i % 4).astype(dt)


class Deferred:
    """Collects (actual, expected) pairs while collectives run and checks them only at the end.

    A failed comparison inside a loop of collectives (e.g. one per root) would make that rank
    leave the test while the others still enter the next collective, which deadlocks or
    cross-matches later tests.  Recording first and verifying after the last collective keeps
    every rank in step even when the library is wrong.
    """

    def __init__(self, check=assert_same):
        self.check = check
        self.items = []

    def __call__(self, label, actual, expected):
        snap = actual.copy() if isinstance(actual, np.ndarray) else actual.clone()
        self.items.append((label, snap, expected))

    def verify(self):
        for label, actual, expected in self.items:
            try:
                self.check(actual, expected)
            except AssertionError as exc:
                raise AssertionError(f"[{label}] {exc}") from None


def assert_in_sync():
    """A plain all_reduce: proves no rank was left behind in (or ran ahead into) a collective."""
    x = np.array([dist.get_rank() + 1], dtype=np.int64)
    dist.all_reduce(x)
    n = dist.get_world_size()
    assert x[0] == n * (n + 1) // 2, "ranks are out of step"


def raises_everywhere(fn, exc=ValueError):
    """Call ``fn`` expecting ``exc`` on every rank; check the ranks are still in step, and only
    then fail if it did not raise (so a missing error on one rank cannot deadlock the suite)."""
    try:
        fn()
    except exc:
        problem = None
    else:
        problem = f"{exc.__name__} was not raised"
    assert_in_sync()
    assert problem is None, problem
