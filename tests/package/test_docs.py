"""The docs site as a user reads it: pydata-sphinx-theme from the docs extra, output blocks left
plain, links that name pages (not files), pages that open with what the user does in a short
paragraph, and the Stores page's program running as written under mpiexec. Building the site is
CI's (`python -m sphinx -W`, docs/testing.md)."""
import re
from pathlib import Path

import pytest

from support.launch import ROOT, launch, mpiexec, outer_world_size

DOCS = Path(ROOT) / "docs"
# The user's guide: the pages of the index's first table of contents but its two tables.
GUIDE = ["install", "launching", "slurm", "gpus", "checkpoints", "surviving_failures", "torch_backend", "frameworks",
         "stores", "hangs", "testing_your_code", "benchmarks", "scaling", "measurements", "differences"]


def _pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())


def test_the_theme_comes_from_the_docs_extra_and_output_is_not_coloured_as_code():
    conf = (DOCS / "conf.py").read_text()
    assert re.search(r'^html_theme = "pydata_sphinx_theme"$', conf, re.M)
    extra = _pyproject()["project"]["optional-dependencies"]["docs"]
    assert any(requirement.startswith("pydata-sphinx-theme") for requirement in extra)
    assert re.search(r'^highlight_language = "none"$', conf, re.M)  # a fence without a language is output


def test_the_guide_is_in_the_table_of_contents():
    index = (DOCS / "index.md").read_text()
    assert all(f"\n{page}\n" in index for page in GUIDE)


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_links_name_the_page_not_its_file(page):
    text = (DOCS / page).read_text()
    assert not re.findall(r"\[[\w./#-]+\.md[\w#-]*\]\(", text)


@pytest.mark.parametrize("page", GUIDE)
def test_each_guide_page_opens_with_a_short_paragraph(page):
    lines = (DOCS / f"{page}.md").read_text().splitlines()
    assert lines[0].startswith("# ") and not lines[1].strip(), page
    opening = []
    for line in lines[2:]:
        if not line.strip():
            break
        opening.append(line)
    assert opening and not opening[0].startswith(("#", "```", "|")), f"{page}: no opening paragraph"
    assert len(opening) <= 5, f"{page}: the opening paragraph has {len(opening)} lines"


@pytest.mark.skipif(outer_world_size() > 1 or mpiexec() is None, reason="serial test that starts mpiexec itself")
def test_the_stores_page_program_runs_as_written(tmp_path):
    text = (DOCS / "stores.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)
    assert len(blocks) == 1
    program = tmp_path / "store_demo.py"
    program.write_text(blocks[0])
    assert "mpiexec -n 2 python store_demo.py" in " ".join(text.split())
    proc, cmd = launch(2, [str(program)], 60, cwd=str(tmp_path))
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    # mpiexec forwards the ranks' lines as they come: one may land inside the other
    assert sorted(re.findall(r"rank \d: epoch \d", proc.stdout)) == ["rank 0: epoch 3", "rank 1: epoch 3"], proc.stdout


def test_the_surviving_failures_page_quotes_its_example_as_it_is():
    text = (DOCS / "surviving_failures.md").read_text()
    walk_through = text[text.index("## The worked example"):]
    blocks = re.findall(r"^```python\n(.*?)^```$", walk_through, re.M | re.S)
    example = (Path(ROOT) / "examples" / "surviving_failures.py").read_text()
    assert len(blocks) == 3 and all(block in example for block in blocks)


# What a user page may not carry: history belongs in CHANGELOG.md and docs/dev/. A date only on
# the one line that says when and where the numbers below or above it were measured.
MEASURED = re.compile(r"^Measured on \d{4}-\d{2}-\d{2}, [^:]+: `[^`]+`$")
HISTORY = {
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),
}
USER_PAGES = ["README.md"] + [f"docs/{page.name}" for page in sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", USER_PAGES)
def test_user_pages_say_what_is_true_now_not_its_history(page):
    found = [f"line {number}: {what}: {line.strip()}"
             for number, line in enumerate((Path(ROOT) / page).read_text().splitlines(), 1)
             for what, pattern in HISTORY.items()
             if pattern.search(line) and not (what == "a date" and MEASURED.match(line))]
    assert not found, "\n".join(found)
