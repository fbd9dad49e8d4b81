"""``python -m hpc_c10d bench``: its arithmetic in process, and the CLI under real mpiexec at 1 and 2
ranks with tiny sizes: valid JSON and CSV that agree, every result checked, and a result corrupted
through the test hook counted as wrong (exit status 1). Serial tests: they launch their own jobs."""
import argparse
import csv
import importlib.util
import io
import json
import os
import re

import numpy as np
import pytest

from support.launch import ROOT, job_sizes, launch, outer_world_size
from hpc_c10d.extras import install_hint
from hpc_c10d.arrays import bfloat16_dtype
from hpc_c10d.bench import main, parser
from hpc_c10d.bench.collective_ops import COLLECTIVES, Case, contribution, reference_reduce
from hpc_c10d.bench.collectives import CORRUPT_ENV, count_wrong
from hpc_c10d.bench.options import SUB_BENCHMARKS
from hpc_c10d.bench.report import Progress, Record, table
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


@pytest.mark.parametrize("ranks", job_sizes(2, 3, 8))
def test_bus_factors_are_nccl_tests(ranks):
    expected = {"all_reduce": 2 * (ranks - 1) / ranks, "broadcast": 1, "reduce": 1, "all_gather": (ranks - 1) / ranks,
                "all_gather_list": (ranks - 1) / ranks, "reduce_scatter": (ranks - 1) / ranks,
                "all_to_all": (ranks - 1) / ranks,
                "gather": (ranks - 1) / ranks, "scatter": (ranks - 1) / ranks, "barrier": 0}
    assert {name: op.bus_factor(ranks) for name, op in COLLECTIVES.items()} == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), bfloat16_dtype(), np.dtype(np.int8), np.dtype(np.float32)])
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
    (["p2p", "--compare", "nccl"], "unknown nccl"),
    (["stores", "--compare", "mpi4py"], "unknown mpi4py"),
    (["startup", "--ranks", "0:4"], "bad rank counts"),
    (["stores", "-r", "0"], "not a positive integer"),
    (["p2p", "-f", "1"], "at least 2"),
    (["collectives", "-n", "-1"], "is negative"),
    (["torch", "--ddp-batch", "-4"], "is negative"),
    (["startup", "--timeout", "0"], "positive number of seconds"),
    (["stores", "--busy-owner", "-1"], "positive number of seconds"),
])
def test_bad_arguments_exit_2_before_any_communication(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def _sub_parsers():
    """The bench's parser and its sub-benchmarks' parsers by name."""
    top = parser()
    (subs,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return top, subs


def test_every_option_has_plain_help():
    """--help says what every option does, in plain text (no reST backticks)."""
    top, subs = _sub_parsers()
    assert list(subs.choices) == list(SUB_BENCHMARKS)
    assert all(line.help and "`" not in line.help for line in subs._choices_actions)
    for name, sub in [("bench", top), *subs.choices.items()]:
        assert sub.description and "`" not in sub.description, name
        for option in (a for a in sub._actions if a.option_strings and a.help != argparse.SUPPRESS):
            assert option.help and "`" not in option.help, (name, option.option_strings)


def test_compare_says_what_each_sub_benchmark_compares():
    _, subs = _sub_parsers()
    helps = {name: option.help for name, sub in subs.choices.items() for option in sub._actions
             if "--compare" in option.option_strings}
    assert set(helps) == {"collectives", "p2p", "stores", "startup", "checkpoint"} and len(set(helps.values())) == 5
    assert all(("nccl" in text.lower()) == (name == "collectives") for name, text in helps.items())
    assert "Send/Recv" in helps["p2p"] and "TCPStore" in helps["stores"] and "env://" in helps["startup"]
    assert "torch.save" in helps["checkpoint"] and "plugin" in helps["collectives"]


@pytest.mark.parametrize("argv, message", [
    ([], f"name a sub-benchmark: {', '.join(SUB_BENCHMARKS)}"),
    (["collectives", "--compare", "nccl"], "--compare nccl needs --device cuda"),
])
def test_usage_errors_exit_2_before_any_communication(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"error: {message}" in capsys.readouterr().err


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


def _timed(nbytes, us_min, us_median, rounds=5):
    return Record(bench="collectives", op="all_reduce", impl="hpc_c10d", ranks=3, bytes=nbytes, count=nbytes // 4,
                  rounds=rounds, us_min=us_min, us_median=us_median, us_max=us_median * 1.1)


def test_a_noisy_table_says_so_and_suggests_more_rounds():
    quiet = table([_timed(8, 10.0, 12.0), _timed(1024, 20.0, 21.0)])
    assert "noisy" not in quiet
    noisy = table([_timed(8, 10.0, 23.0), _timed(1024, 20.0, 21.0), _timed(2**20, 100.0, 150.0)])
    assert noisy.rstrip().endswith("noisy: the median is 1.5-2.3x the minimum at 8 B, 1 MiB, so the machine was busy: "
                                   "rerun on a quiet one, or with more --rounds (this run: 5)"), noisy


def test_the_last_progress_step_prints_nothing_before_the_table(capsys):
    progress = Progress(3, enabled=True)
    for label in ("8 B", "1 KiB", "1 MiB"):
        progress.step(label)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["[1/3] 8 B", "[2/3] 1 KiB"]


def test_the_plot_reads_sizes_in_binary_units():
    pytest.importorskip("matplotlib", reason=f"matplotlib is not installed ({install_hint('plot')})")
    from hpc_c10d.bench.plot import figure

    drawn = figure([_timed(n, 10.0, 10.0) for n in (8, 1024, 2**20, 2**24)])
    drawn.canvas.draw()
    labels = [tick.get_text() for tick in drawn.axes[0].get_xticklabels() if tick.get_text()]
    assert labels and all(re.fullmatch(r"\d+ (B|KiB|MiB)", label) for label in labels), labels  # not 2^10
    assert {"8 B", "4 KiB", "2 MiB"} <= set(labels) and drawn.axes[0].get_xlabel() == "message size", labels


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


def _said(proc):
    """The bench's own lines on stderr (a launcher may add its own about the exit status); no traceback."""
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("python -m hpc_c10d bench")]


def _measured(document):
    return [r for r in document["results"] if not r["note"]]


@needs_own_job
@pytest.mark.parametrize("ranks", job_sizes(1, 2))
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
@pytest.mark.parametrize("ranks", job_sizes(1, 2))
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
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_collectives_through_torch_tensors_and_the_plugin_are_checked_too(tmp_path):
    compare = "torch,plugin,hpc_c10d-tensors"
    _, doc, _ = _bench(2, ["collectives", "--ops", "all", "--compare", compare, *TINY], tmp_path)
    results = _measured(doc)
    assert {r["impl"] for r in results} == {"hpc_c10d", *compare.split(",")}
    assert all(r["wrong"] == 0 and r["us_max"] > 0 and r["host_us"] is None for r in results)
    assert "torch" not in doc["meta"]["notes"]


@needs_own_job
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("ranks", job_sizes(1, 2))
@pytest.mark.long
def test_training_steps_on_the_plugin_and_on_torchs_own_backend(ranks, tmp_path):
    _, doc, _ = _bench(ranks, ["training", "--params", "20K", "--batch", "4", "-r", "2", "-n", "2", "-w", "1", "-q"],
                       tmp_path)
    assert {(r["op"].split()[0], r["impl"]) for r in doc["results"]} == {
        (strategy, impl) for strategy in ("ddp", "fsdp2") for impl in ("plugin", "torch")}
    for r in doc["results"]:
        assert r["wrong"] == 0 and r["us_max"] > 0 and r["count"] > 10_000, r  # both backends trained alike


@needs_own_job
def test_p2p_latency_and_bandwidth_between_pairs(tmp_path):
    stdout, doc, _ = _bench(2, ["p2p", "--compare", "mpi4py", *TINY], tmp_path)
    assert {(r["op"], r["impl"]) for r in doc["results"]} == {
        (op, impl) for op in ("latency", "bandwidth") for impl in ("hpc_c10d", "mpi4py")}
    assert all(r["wrong"] == 0 and r["us_max"] > 0 for r in doc["results"])
    # a latency is a time, not a rate: no bandwidth in its record nor its table
    assert all((r["algbw_gbs"] is None) == (r["op"] == "latency") for r in doc["results"])
    latency, bandwidth = stdout.split("### p2p: bandwidth")
    assert "GB/s" not in latency and "algbw GB/s" in bandwidth, stdout


@needs_own_job
def test_p2p_on_one_rank_says_why():
    proc, _ = launch(1, ["-m", "hpc_c10d", "bench", "p2p", *TINY], TIMEOUT_S)
    assert proc.returncode == 2 and _said(proc) == [
        "python -m hpc_c10d bench p2p: needs at least 2 ranks (it pairs rank 0 with 1, 2 with 3, ...)"]


@needs_own_job
@pytest.mark.parametrize("ranks", job_sizes(1, 2))
def test_stores_against_tcpstore(ranks, tmp_path):
    _, doc, _ = _bench(ranks, ["stores", "--compare", "-r", "2", "-n", "5", "-w", "1", "-q"], tmp_path)
    stores = {"MPIStore", "TCPStore"} if HAVE_TORCH else {"MPIStore"}
    ops = {"set", "get", "get counter", "add", "compare_set", "contended add"}
    assert {(r["op"], r["impl"]) for r in doc["results"]} == {(op, s) for op in ops for s in stores}
    assert all(r["wrong"] == 0 and r["us_max"] > 0 for r in doc["results"])
    assert ("torch" in doc["meta"]["notes"]) == (not HAVE_TORCH)


@needs_own_job
def test_stores_with_a_busy_owner(tmp_path):
    """Rank 0 computes while rank 1 times single operations on keys rank 0 holds: every op gets a
    latency distribution (min <= median <= max, p99 in the note) and every result is right."""
    _, doc, _ = _bench(2, ["stores", "--busy-owner", "0.5", "--ops", "set,get,add,compare_set", "--compare", "-q"],
                       tmp_path)
    stores = {"MPIStore", "TCPStore"} if HAVE_TORCH else {"MPIStore"}
    ops = {"set", "get", "add", "compare_set"}
    assert {(r["op"], r["impl"]) for r in doc["results"]} == {(f"{op}, owner busy", s) for op in ops for s in stores}
    for record in doc["results"]:
        assert record["wrong"] == 0 and record["iters"] > 0 and "p99" in record["note"]
        assert 0 < record["us_min"] <= record["us_median"] <= record["us_max"]


@needs_own_job
def test_busy_owner_on_one_rank_says_why():
    proc, _ = launch(1, ["-m", "hpc_c10d", "bench", "stores", "--busy-owner", "1", "-q"], TIMEOUT_S)
    assert proc.returncode == 2 and _said(proc) == [
        "python -m hpc_c10d bench stores: --busy-owner needs at least 2 ranks (rank 0 computes, the others time "
        "store operations)"]


@needs_own_job
def test_checkpoint_bandwidth(tmp_path):
    pytest.importorskip("h5py", reason=f"h5py is not installed ({install_hint('hdf5')})")
    _, doc, _ = _bench(2, ["checkpoint", "--size", "1M", "--dir", str(tmp_path), "-r", "2", "-q"], tmp_path)
    assert {(r["op"], r["impl"]) for r in doc["results"]} == {
        (op, impl) for op in ("write", "read") for impl in ("hpc_c10d", "h5py")}
    assert all(r["algbw_gbs"] > 0 for r in doc["results"])
    assert [r["wrong"] for r in doc["results"] if r["impl"] == "hpc_c10d" and r["op"] == "read"] == [0]
    assert not list(tmp_path.glob("bench-*.h5"))


@needs_own_job
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.long
def test_checkpoint_bandwidth_against_torch_save_and_dcp(tmp_path):
    pytest.importorskip("h5py", reason=f"h5py is not installed ({install_hint('hdf5')})")
    files = tmp_path / "files"
    files.mkdir()
    _, doc, _ = _bench(2, ["checkpoint", "--size", "1M", "--dir", str(files), "-r", "2", "--compare", "-q"], tmp_path)
    assert {(r["op"], r["impl"]) for r in doc["results"]} == {
        (op, impl) for op in ("write", "read") for impl in ("hpc_c10d", "h5py", "torch.save", "dcp")}
    assert all(r["algbw_gbs"] > 0 for r in doc["results"])
    assert [r["wrong"] for r in doc["results"] if r["impl"] == "hpc_c10d" and r["op"] == "read"] == [0]
    assert not list(files.iterdir())  # every implementation's files are gone


def _hidden(tmp_path, *modules):
    """Environment entries under which ``import MODULE`` fails as if it were not installed."""
    shadow = tmp_path / "hidden"
    for name in modules:
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(f'raise ModuleNotFoundError("No module named {name!r}", '
                                                   f'name={name!r})\n')
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(shadow), ROOT, os.environ.get("PYTHONPATH")) if p)}


_PHASES = {"init + first all_reduce", "store set", "store get (neighbour)", "store add (shared)", "launch to exit"}


def _startup(ranks, tmp_path, env=None):
    """Run the start-up sweep with --compare as one process; return (stdout, JSON document)."""
    import subprocess
    import sys

    from support.launch import fresh_env

    out = tmp_path / "startup.json"
    proc = subprocess.run(["timeout", str(TIMEOUT_S), sys.executable, "-m", "hpc_c10d", "bench", "startup",
                           "--ranks", ranks, "--repeats", "1", "--compare", "-q", "--json", str(out)],
                          env=fresh_env(**(env or {})), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(out.read_text())
    assert all(r["us_max"] > 0 and not r["note"] for r in document["results"])
    return proc.stdout, document


@needs_own_job
@pytest.mark.long
def test_startup_sweep_launches_each_world_size(tmp_path):
    """Run as one process, it starts one job per world size and implementation itself."""
    _, document = _startup("1,2", tmp_path)
    impls = {"hpc_c10d", "torch"} if HAVE_TORCH else {"hpc_c10d"}
    assert {(r["ranks"], r["impl"], r["op"]) for r in document["results"]} == {
        (n, i, p) for n in (1, 2) for i in impls for p in _PHASES}
    assert ("torch" in document["meta"]["notes"]) == (not HAVE_TORCH)


@needs_own_job
def test_startup_leaves_torch_out_with_a_note_where_torch_is_missing(tmp_path):
    stdout, document = _startup("1", tmp_path, env=_hidden(tmp_path, "torch"))
    assert {(r["impl"], r["op"]) for r in document["results"]} == {("hpc_c10d", p) for p in _PHASES}
    note = f"torch is not installed ({install_hint('torch')})"
    assert document["meta"]["notes"] == {"torch": note} and f"# torch left out: {note}" in stdout


@needs_own_job
@pytest.mark.parametrize("argv, hidden, message", [
    (["torch"], ["torch"], f"torch is not installed ({install_hint('torch')})"),
    (["collectives", "--device", "cuda"], ["cupy"],
     f"--device cuda: cupy is not installed ({install_hint('cuda13')} or {install_hint('cuda12')})"),
    (["checkpoint", "--dir", "{missing}"], [], "--dir {missing}: no such directory"),
    (["checkpoint"], ["h5py"], f"h5py is not installed ({install_hint('hdf5')})"),
    (["p2p", "--plot", "p2p.png"], ["matplotlib"], f"--plot: matplotlib is not installed ({install_hint('plot')})"),
    (["startup"], [], "run it as one process (not under mpiexec or srun); it launches the jobs"),
])
def test_what_a_sub_benchmark_lacks_is_said_once_before_any_work(argv, hidden, message, tmp_path):
    """One line from rank 0, no traceback, exit status 2 on every rank (nothing was measured)."""
    missing = str(tmp_path / "no such dir")
    argv = [a.format(missing=missing) for a in argv]
    proc, cmd = launch(2, ["-m", "hpc_c10d", "bench", *argv, "-q"], TIMEOUT_S, env=_hidden(tmp_path, *hidden))
    assert proc.returncode == 2, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    assert _said(proc) == [f"python -m hpc_c10d bench {argv[0]}: {message.format(missing=missing)}"]


@needs_own_job
def test_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason=f"matplotlib is not installed ({install_hint('plot')})")
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
    scripts = [f for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py") and f[0] != "_"]
    assert scripts
    for name in scripts:
        text = open(os.path.join(ROOT, "benchmarks", name)).read()
        assert "bench(" in text and len(text.splitlines()) < 20, name


@needs_own_job
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed; the torch backend's bench needs it")
@pytest.mark.long
def test_torch_backend_against_gloo_and_mpi4py_with_a_ddp_step(tmp_path):
    _, doc, _ = _bench(2, ["torch", "--ops", "all_reduce,all_gather", "--ddp-batch", "4", *TINY], tmp_path)
    collectives = [r for r in doc["results"] if not r["op"].startswith("DDP")]
    assert {(r["op"], r["impl"]) for r in collectives} == {
        (op, impl) for op in ("all_reduce", "all_gather") for impl in ("plugin", "mpi4py", "gloo")} | {
        ("ProcessGroupHPC.allreduce", impl) for impl in ("plugin", "mpi4py")}
    assert all(r["wrong"] == 0 and r["us_max"] > 0 for r in collectives)
    ddp = [r for r in doc["results"] if r["op"].startswith("DDP")]
    assert {r["impl"] for r in ddp} == {"plugin", "gloo", "local"} and all(r["us_max"] > 0 for r in ddp)
