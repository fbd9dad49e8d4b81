#!/usr/bin/env python3
"""Which tests a run ran, and where, read from the JUnit XML files under one results folder.

    python tests/support/ledger.py record test-results > ledger.tsv     # a line per test: id, the stages that ran it
    python tests/support/ledger.py compare BEFORE.tsv AFTER.tsv [--allowed FILE]
    python tests/support/ledger.py table test-results STAGES.tsv        # CI's closing table

A test's id is ``module::name[parameters]``: the file's name without its folder, so a moved file keeps
its ids. A stage is the XML's folder under the results root and its tag, as tests/run_suite.py names
them: ``quickstart/n3`` is the README's command at 3 ranks (the XML files at the root),
``openmpi/serial`` Open MPI's serial run. A test *ran* in a stage when it passed or failed there on
some rank; one that only skipped did not run.

``compare`` lists every id that ran before and runs nowhere after, and exits 1 if there is one that
``--allowed`` (``id<TAB>reason`` lines) does not name, or names as ``moved to NEW_ID`` where NEW_ID
does not run either. run_suite.py's ``--skip-ran-in`` uses
``ran_in`` to leave out what an earlier run of the same stage ran already.
"""
from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUTCOMES = ("passed", "failed", "skipped")
MOVED = "moved to "
_RANK = re.compile(r"-rank\d+$")
_WORSE = {"skipped": 0, "passed": 1, "failed": 2}


def test_id(classname: str, name: str) -> str:
    """JUnit's ``tests.core.test_x.TestY`` and ``test_z[a]`` -> ``test_x::TestY::test_z[a]``."""
    parts = classname.split(".")
    module = next((i for i in range(len(parts) - 1, -1, -1) if parts[i].startswith("test_")), len(parts) - 1)
    return "::".join([*parts[module:], name])


def item_id(nodeid: str) -> str:
    """pytest's ``tests/core/test_x.py::TestY::test_z[a]`` -> ``test_x::TestY::test_z[a]``."""
    path, _, rest = nodeid.partition("::")
    return f"{Path(path).stem}::{rest}"


def _outcome(case: ET.Element) -> str:
    """passed, failed or skipped; an expected failure (xfail) ran, and counts as passed."""
    tags = {child.tag: child for child in case}
    if tags.keys() & {"failure", "error"}:
        return "failed"
    skipped = tags.get("skipped")
    return "skipped" if skipped is not None and skipped.get("type") != "pytest.xfail" else "passed"


def stage_of(xml: Path, root: Path) -> str:
    """``root/openmpi/n3-rank1.xml`` -> ``openmpi/n3``; ``root/serial.xml`` -> ``quickstart/serial``."""
    folder = xml.parent.relative_to(root).as_posix()
    return f"{'quickstart' if folder == '.' else folder}/{_RANK.sub('', xml.stem)}"


def _keep_worst(seen: dict[str, str], tid: str, now: str) -> None:
    if _WORSE[now] >= _WORSE.get(seen.get(tid, "skipped"), 0):
        seen[tid] = now


def cases(xml: Path) -> dict[str, str]:
    """id -> outcome in one JUnit XML file (failed beats passed beats skipped); ET.ParseError if unreadable."""
    seen: dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        _keep_worst(seen, test_id(case.get("classname", ""), case.get("name", "")), _outcome(case))
    return seen


def outcomes(xmls: list[Path], root: Path) -> dict[str, dict[str, str]]:
    """stage -> id -> outcome over the stage's ranks."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for xml in xmls:
        try:
            per_rank = cases(xml)
        except ET.ParseError as exc:
            raise SystemExit(f"ledger: {xml}: {exc}") from exc
        seen = found[stage_of(xml, root)]
        for tid, now in per_rank.items():
            _keep_worst(seen, tid, now)
    return found


def ran_in(results: Path, tag: str) -> set[str]:
    """The ids that passed or failed on some rank of stage ``tag`` (``serial``, ``n3`` ...) in ``results``."""
    xmls = [results / f"{tag}.xml", *results.glob(f"{tag}-rank*.xml")]
    tests = outcomes([x for x in xmls if x.is_file()], results).values()
    return {tid for stage in tests for tid, state in stage.items() if state != "skipped"}


def record(root: Path) -> dict[str, list[str]]:
    """id -> the stages that ran it (empty: it only skipped)."""
    ran: dict[str, list[str]] = defaultdict(list)
    for stage, tests in sorted(outcomes(sorted(root.rglob("*.xml")), root).items()):
        for tid, state in tests.items():
            ran[tid] += [stage] if state != "skipped" else []
    return dict(sorted(ran.items()))


def read(path: Path) -> dict[str, list[str]]:
    """A ``record`` listing: id -> the stages that ran it."""
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    return {row[0]: [s for s in row[1].split(",") if s] if len(row) > 1 else [] for row in rows}


def reasons(path: Path) -> dict[str, str]:
    """An allowed list: id -> why it may stop running (``moved to NEW_ID`` where it runs as NEW_ID)."""
    with open(path) as f:
        return dict(line.rstrip("\n").split("\t", 1) for line in f if line.strip() and not line.startswith("#"))


def lost(before: dict[str, list[str]], after: dict[str, list[str]], allowed: dict[str, str]) -> list[str]:
    """Ids that ran before and run nowhere now: not allowed to go, or moved to an id that does not run."""
    def gone(tid: str) -> bool:
        why = allowed.get(tid)
        return why is None or (why.startswith(MOVED) and not after.get(why[len(MOVED):].strip()))

    return [tid for tid, stages in before.items() if stages and not after.get(tid) and gone(tid)]


def table(root: Path, stages_file: Path) -> str:
    """stage, minutes, tests run, passed, skipped, failed: a row per line of ``stages_file``
    (``name<TAB>seconds<TAB>results folders``, space-separated and relative to ``root``; none where
    the stage writes no JUnit XML). A test counts once per world size it was run at."""
    rows = [("stage", "min", "run", "passed", "skipped", "failed")]
    total = 0
    with open(stages_file) as f:
        for name, seconds, folders in (line.rstrip("\n").split("\t") for line in f if line.strip()):
            total += int(seconds)
            xmls = [x for folder in folders.split() for x in sorted((root / folder).glob("*.xml"))]
            counts = dict.fromkeys(OUTCOMES, 0)
            for tests in outcomes(xmls, root).values():
                for state in tests.values():
                    counts[state] += 1
            numbers = (counts["passed"] + counts["failed"], counts["passed"], counts["skipped"], counts["failed"])
            rows.append((name, f"{int(seconds) / 60:.1f}", *(str(n) if xmls else "-" for n in numbers)))
    rows.append(("total", f"{total / 60:.1f}", "", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("record", help="the ids under a results folder, each with the stages that ran it").add_argument(
        "root", type=Path)
    compare = sub.add_parser("compare", help="the ids that ran before and run nowhere after")
    compare.add_argument("before", type=Path)
    compare.add_argument("after", type=Path)
    compare.add_argument("--allowed", type=Path, help="id<TAB>reason lines: ids that may go")
    tab = sub.add_parser("table", help="CI's closing table")
    tab.add_argument("root", type=Path)
    tab.add_argument("stages", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        for tid, stages in record(args.root).items():
            print(f"{tid}\t{','.join(stages)}")
        return 0
    if args.command == "table":
        print(table(args.root, args.stages))
        return 0
    allowed = reasons(args.allowed) if args.allowed else {}
    before, after = read(args.before), read(args.after)
    missing = lost(before, after, allowed)
    print(f"ran before: {sum(map(bool, before.values()))} ids; ran after: {sum(map(bool, after.values()))}; "
          f"allowed to go: {len(allowed)}; lost: {len(missing)}")
    for tid in missing:
        print(f"lost: {tid} (ran in {', '.join(before[tid])})")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
