"""docs/compatibility.md lists every torch.distributed name as supported or excluded, truthfully."""

import re
from pathlib import Path

import pytest

import hpc_c10d
from support.launch import ROOT

TABLE = Path(ROOT) / "docs" / "compatibility.md"
SEED = Path(ROOT).parent / "shared" / "seeds" / "000_0cb39413f7a7f871.txt"
ROW = re.compile(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \| (supported|excluded) \|(.*)\|$")


def _rows():
    rows = {}
    for line in TABLE.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, status, notes = match.groups()
            assert name not in rows, f"{name} is listed twice"
            rows[name] = (status, notes.strip())
    return rows


def test_supported_names_exist_and_excluded_names_have_reasons():
    rows = _rows()
    assert len(rows) > 70
    for name, (status, notes) in rows.items():
        if status == "supported":
            assert hasattr(hpc_c10d, name), f"{name} is marked supported but hpc_c10d lacks it"
            assert name in hpc_c10d.__all__ or name.startswith("_"), f"{name} missing from __all__"
        else:
            assert len(notes) > 20, f"{name} is excluded without a reason"
            assert not hasattr(hpc_c10d, name), f"{name} exists: mark it supported"


def test_every_public_name_is_in_the_table():
    rows = _rows()
    torch_names = set()
    try:
        import torch.distributed.distributed_c10d as c10d

        torch_names |= set(c10d.__all__)
    except ImportError:
        pass
    if SEED.exists():
        text = SEED.read_text()
        block = text[text.index("__all__ = ["):]
        block = block[:block.index("]")]
        torch_names |= set(re.findall(r'"([A-Za-z_0-9]+)"', block))
    if not torch_names:
        pytest.skip("neither torch nor the reference seeds are available to compare with")
    assert sorted(torch_names - set(rows)) == []
    ours = {n for n in hpc_c10d.distributed_c10d.__all__}
    assert sorted(ours - set(rows)) == []
