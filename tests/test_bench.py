"""``python -m hpc_c10d bench``: its arithmetic in process, and the CLI under real mpiexec at 1 and 2
ranks with tiny sizes: valid JSON and CSV that agree, every result checked, and a result corrupted
through the test hook counted as wrong (exit status 1). Serial tests: they launch their own jobs."""
import csv
import importlib.util
import io
import json
import os

import numpy as np
import pytest

from _launch import launch, outer_world_size
from hpc_c10d.arrays import bfloat16
from hpc_c10d.bench import parser
from hpc_c10d.bench.collective_ops import COLLECTIVES, Case, contribution, reference_reduce
from hpc_c10d.bench.collectives import CORRUPT_ENV, count_wrong
from hpc_c10d.bench.report import Record, table
from hpc_c10d.bench.units import parse_bytes, parse_range, sweep

HAVE_TORCH = importlib.util.find_spec("torch") is not None
TIMEOUT_S = 180
TINY = ["-b", "8:64", "-f", "8", "-r", "2", "-n", "3", "-w", "1", "-q"]
needs_own_job = pytest.mark.skipif(outer_world_size() > 1, reason="serial test that launches its own mpiexec")


# ---------------------------------------------------------------- arithmetic, in process
@pytest.mark.parametrize("text, expected", [("8", 8), ("4K", 4096), ("4KiB", 4096), ("1kb", 1000),
                                            ("16M", 16 * 2**20), ("1GB", 10**9), ("1.5K", 1536)])
def test_sizes_parse_like_nccl_tests(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "8X", "-1", "M", "8:4"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(Exception, match="bad size"):
        parse_range(text)


def test_sweep_includes_both_ends_and_rounds_to_whole_elements_per_rank():
    assert sweep(8, 64, 2, 4) == [8, 16, 32, 64]
    assert sweep(8, 100, 4, 4) == [8, 32, 100]
    assert sweep(1, 50, 4, 12) == [12, 48]  # 3 ranks of float32: multiples of 12, never below


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_bus_factors_are_nccl_tests(ranks):
    expected = {"all_reduce": 2 * (ranks - 1) / ranks, "broadcast": 1, "reduce": 1, "all_gather": (ranks - 1) / ranks,
                "reduce_scatter": (ranks - 1) / ranks, "all_to_all": (ranks - 1) / ranks,
                "gather": (ranks - 1) / ranks, "scatter": (ranks - 1) / ranks, "barrier": 0}
    assert {name: op.bus_factor(ranks) for name, op in COLLECTIVES.items()} == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), bfloat16, np.dtype(np.int8), np.dtype(np.float32)])
@pytest.mark.parametrize("redop", ["sum", "prod", "min", "max"])
def test_reference_is_exact_at_64_ranks(dtype, redop):
    """The data are small integers, so the reference is exact whatever order MPI reduces in."""
    case = Case(rank=0, size=64, count=97, dtype=dtype, redop=redop)
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[redop]
    wide = np.stack([contribution(case, r, case.count).astype(np.int64) for r in range(case.size)])
    exact = ufunc.reduce(wide, axis=0)
    got = reference_reduce(case, case.count)
    if dtype.kind == "i":  # integers wrap as MPI's do
        assert np.array_equal(got, exact.astype(dtype))
    else:
        assert np.array_equal(got.astype(np.float64), exact.astype(np.float64))


def test_count_wrong_counts_elements_and_tolerates_rounding_only():
    expected = np.arange(10, dtype=np.float32)
    got = expected.copy()
    got[[2, 7]] += 1
    assert count_wrong(got, expected) == 2
    assert count_wrong(expected * (1 + 1e-8), expected) == 0
    assert count_wrong(np.array([3, 4], np.int64), np.array([3, 5], np.int64)) == 1


@pytest.mark.parametrize("argv, message", [
    (["collectives", "--ops", "allreduce"], "unknown allreduce"),
    (["collectives", "-d", "float128"], "invalid choice"),
    (["collectives", "--compare", "gloo"], "unknown gloo"),
    (["startup", "--ranks", "0:4"], "bad rank counts"),
    (["stores", "-r", "0"], "not a positive integer"),
    (["p2p", "-f", "1"], "at least 2"),
    (["collectives", "-n", "-1"], "is negative"),
    (["torch", "--ddp-batch", "-4"], "is negative"),
    (["startup", "--timeout", "0"], "positive number of seconds"),
])
def test_bad_arguments_exit_2_before_any_communication(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def _point(op, impl, us, wrong=None, bench="checkpoint"):
    return Record(bench=bench, op=op, impl=impl, ranks=2, bytes=2**20, count=2**17, us_min=us, us_median=us,
                  us_max=us, algbw_gbs=2**20 / us / 1e3, wrong=wrong)


def _cells(text):
    """Each row of the one Markdown table in ``text``, header first, as a list of cells."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|-")]


def test_a_table_gives_times_in_one_unit_named_in_its_headers():
    header, row = _cells(table([_point("read", "hpc_c10d", 20_000, wrong=0), _point("read", "h5py", 2_500_000)]))
    assert header == ["size", "count", "hpc_c10d min (ms)", "median (ms)", "max (ms)", "algbw GB/s", "#wrong",
                      "h5py max (ms)", "hpc_c10d / h5py"]
    assert row == ["1 MiB", "131072", "20.0", "20.0", "20.0", "0.05", "0", "2500", "0.01"]


def test_a_table_has_a_wrong_column_only_for_checked_implementations():
    header, _ = _cells(table([_point("write", "hpc_c10d", 5.0), _point("write", "h5py", 7.0)]))
    assert header == ["size", "count", "hpc_c10d min (µs)", "median (µs)", "max (µs)", "algbw GB/s",
                      "h5py max (µs)", "hpc_c10d / h5py"]
    stores = [_point("add", "MPIStore", 3.0, 0, "stores"), _point("add", "TCPStore", 30.0, 0, "stores")]
    header, _ = _cells(table(stores))
    assert header[-4:] == ["#wrong", "TCPStore max (µs)", "MPIStore / TCPStore", "TCPStore #wrong"]


def test_a_start_up_table_is_by_world_size_even_for_one_size():
    header, row = _cells(table([Record(bench="startup", op="store set", impl="hpc_c10d", ranks=4, us_min=50.0,
                                       us_median=60.0, us_max=70.0)]))
    assert header == ["ranks", "hpc_c10d min (µs)", "median (µs)", "max (µs)"] and row == ["4", "50.0", "60.0", "70.0"]


# ---------------------------------------------------------------- the CLI under mpiexec
def _bench(ranks, argv, tmp_path, env=None, expect_rc=0):
    """Run the bench; return (stdout, JSON document, CSV rows) from files it wrote."""
    out_json, out_csv = tmp_path / "out.json", tmp_path / "out.csv"
    proc, cmd = launch(ranks, ["-m", "hpc_c10d", "bench", *argv, "--json", str(out_json), "--csv", str(out_csv)],
                       TIMEOUT_S, env=env)
    assert proc.returncode == expect_rc, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    document = json.loads(out_json.read_text())
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == len(document["results"]) > 0
    assert [r["op"] for r in rows] == [r["op"] for r in document["results"]]
    for record in document["results"]:
        assert set(record) == set(Record.__dataclass_fields__)
    return proc.stdout, document, rows


def _measured(document):
    return [r for r in document["results"] if not r["note"]]


@needs_own_job
@pytest.mark.parametrize("ranks", [1, 2])
def test_collectives_report_checked_results_as_json_and_csv(ranks, tmp_path):
    compare = "mpi4py,torch" if HAVE_TORCH else "mpi4py"
    stdout, doc, rows = _bench(ranks, ["collectives", "--ops", "all", "--compare", compare, *TINY], tmp_path)
    assert doc["meta"]["ranks"] == ranks and "MPI" in doc["meta"]["mpi_library"]
    results = _measured(doc)
    impls = ["hpc_c10d", *compare.split(",")]
    for op in COLLECTIVES:
        points = {(r["bytes"], r["impl"]) for r in results if r["op"] == op}
        sizes = [0] if op == "barrier" else sorted({b for b, _ in points})
        assert points == {(b, i) for b in sizes for i in impls}, op
    for r in results:
        assert r["wrong"] == 0 and 0 < r["us_min"] <= r["us_median"] <= r["us_max"], r
        assert r["ranks"] == ranks and r["iters"] == 3 and r["rounds"] == 2
        if r["bytes"] and ranks > 1:
            factor = COLLECTIVES[r["op"]].bus_factor(ranks)
            assert r["algbw_gbs"] == pytest.approx(r["bytes"] / r["us_max"] / 1e3)
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * factor)
    chunked = [r for r in results if COLLECTIVES[r["op"]].chunked]
    assert all(r["bytes"] % (4 * ranks) == 0 and r["count"] * 4 == r["bytes"] for r in chunked)
    assert "| size | count | hpc_c10d min (µs) | median (µs) | max (µs) |" in stdout and "# 0 wrong results" in stdout
    assert {r["impl"] for r in rows} == set(impls)


@needs_own_job
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_corrupted_result_is_counted_and_fails_the_run(ranks, tmp_path):
    stdout, doc, _ = _bench(ranks, ["collectives", "--ops", "all_reduce,reduce,all_gather", "--compare", "mpi4py",
                                    *TINY], tmp_path, env={CORRUPT_ENV: "hpc_c10d"}, expect_rc=1)
    for r in _measured(doc):
        # one element off on every rank that holds a defined result: all ranks, or the root
        holders = 1 if r["op"] == "reduce" else ranks
        assert r["wrong"] == (holders if r["impl"] == "hpc_c10d" else 0), r
    assert "BROKEN" in stdout


@needs_own_job
def test_collectives_in_bfloat16_async_with_a_clear_note_where_mpi4py_cannot(tmp_path):
    _, doc, _ = _bench(2, ["collectives", "--ops", "all_reduce,reduce_scatter", "-d", "bfloat16", "-o", "max",
                           "--async", "--compare", "mpi4py", *TINY], tmp_path)
    ours = [r for r in doc["results"] if r["impl"] == "hpc_c10d"]
    assert ours and all(r["wrong"] == 0 and r["mode"] == "async" and r["dtype"] == "bfloat16" for r in ours)
    raw = [r for r in doc["results"] if r["impl"] == "mpi4py"]
    assert raw and all("cannot run" in r["note"] and r["us_max"] == 0 for r in raw)


@needs_own_job
def test_p2p_latency_and_bandwidth_between_pairs(tmp_path):
    _, doc, _ = _bench(2, ["p2p", "--compare", "mpi4py", *TINY], tmp_path)
    assert {(r["op"], r["impl"]) for r in doc["results"]} == {
        (op, impl) for op in ("latency", "bandwidth") for impl in ("hpc_c10d", "mpi4py")}
    assert all(r["wrong"] == 0 and r["us_max"] > 0 for r in doc["results"])


@needs_own_job
def test_p2p_on_one_rank_says_why():
    proc, _ = launch(1, ["-m", "hpc_c10d", "bench", "p2p", *TINY], TIMEOUT_S)
    assert proc.returncode != 0 and "p2p needs at least 2 ranks" in proc.stderr


@needs_own_job
@pytest.mark.parametrize("ranks", [1, 2])
def test_stores_against_tcpstore(ranks, tmp_path):
    _, doc, _ = _bench(ranks, ["stores", "--compare", "-r", "2", "-n", "5", "-w", "1", "-q"], tmp_path)
    stores = {"MPIStore", "TCPStore"} if HAVE_TORCH else {"MPIStore"}
    ops = {"set", "get", "get counter", "add", "compare_set", "contended add"}
    assert {(r["op"], r["impl"]) for r in doc["results"]} == {(op, s) for op in ops for s in stores}
    assert all(r["wrong"] == 0 and r["us_max"] > 0 for r in doc["results"])
    assert "mpi4py" in doc["meta"]["notes"]


@needs_own_job
def test_checkpoint_bandwidth(tmp_path):
    pytest.importorskip("h5py", reason="h5py is not installed (pip install 'hpc-c10d[hdf5]')")
    _, doc, _ = _bench(2, ["checkpoint", "--size", "1M", "--dir", str(tmp_path), "-r", "2", "-q"], tmp_path)
    assert {(r["op"], r["impl"]) for r in doc["results"]} == {
        (op, impl) for op in ("write", "read") for impl in ("hpc_c10d", "h5py")}
    assert all(r["algbw_gbs"] > 0 for r in doc["results"])
    assert [r["wrong"] for r in doc["results"] if r["impl"] == "hpc_c10d" and r["op"] == "read"] == [0]
    assert not list(tmp_path.glob("bench-*.h5"))


@needs_own_job
def test_startup_sweep_launches_each_world_size(tmp_path):
    """Run as one process, it starts one job per world size and implementation itself."""
    import subprocess
    import sys

    from _launch import ROOT, fresh_env

    out = tmp_path / "startup.json"
    proc = subprocess.run(["timeout", str(TIMEOUT_S), sys.executable, "-m", "hpc_c10d", "bench", "startup",
                           "--ranks", "1,2", "--repeats", "1", "--compare", "-q", "--json", str(out)],
                          env=fresh_env(), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    impls = {"hpc_c10d", "torch"} if HAVE_TORCH else {"hpc_c10d"}
    phases = {"init + first all_reduce", "store set", "store get (neighbour)", "store add (shared)", "launch to exit"}
    assert {(r["ranks"], r["impl"], r["op"]) for r in results} == {
        (n, i, p) for n in (1, 2) for i in impls for p in phases}
    assert all(r["us_max"] > 0 and not r["note"] for r in results)


@needs_own_job
def test_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'hpc-c10d[plot]')")
    png = tmp_path / "bench.png"
    _bench(2, ["collectives", "--ops", "all_reduce,broadcast", "--compare", "mpi4py", "--plot", str(png), *TINY],
           tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_own_job
def test_csv_on_stdout_parses(tmp_path):
    proc, cmd = launch(2, ["-m", "hpc_c10d", "bench", "collectives", "--format", "csv", *TINY], TIMEOUT_S)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [r["bytes"] for r in rows] == ["8", "64"] and all(r["wrong"] == "0" for r in rows)


def test_the_benchmark_scripts_are_thin_callers():
    """One instrument: every script in benchmarks/ hands its arguments to ``python -m hpc_c10d bench``."""
    from _launch import ROOT

    scripts = [f for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py") and f[0] != "_"]
    assert scripts
    for name in scripts:
        text = open(os.path.join(ROOT, "benchmarks", name)).read()
        assert "bench(" in text and len(text.splitlines()) < 20, name


@needs_own_job
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed; the torch backend's bench needs it")
def test_torch_backend_against_gloo_and_mpi4py_with_a_ddp_step(tmp_path):
    _, doc, _ = _bench(2, ["torch", "--ops", "all_reduce,all_gather", "--ddp-batch", "4", *TINY], tmp_path)
    collectives = [r for r in doc["results"] if not r["op"].startswith("DDP")]
    assert {(r["op"], r["impl"]) for r in collectives} == {
        (op, impl) for op in ("all_reduce", "all_gather") for impl in ("plugin", "mpi4py", "gloo")}
    assert all(r["wrong"] == 0 and r["us_max"] > 0 for r in collectives)
    ddp = [r for r in doc["results"] if r["op"].startswith("DDP")]
    assert {r["impl"] for r in ddp} == {"plugin", "gloo", "local"} and all(r["us_max"] > 0 for r in ddp)
