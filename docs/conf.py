"""Sphinx configuration: the Markdown pages in docs/ (MyST) and the API reference from the docstrings.

    .venv/bin/pip install '.[docs]'
    .venv/bin/python -m sphinx -W --keep-going -b html docs build/docs

The build needs no network (no intersphinx) and none of the optional parts (torch, CuPy, h5py):
``import hpc_c10d`` loads neither MPI nor them, and the pages document what imports without them.
"""

import os
import sys
import warnings

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)  # document the checkout's hpc_c10d, not an installed copy

import hpc_c10d  # noqa: E402

project = "hpc_c10d"
copyright = "the hpc_c10d authors"
release = version = hpc_c10d.__version__

extensions = [
    "myst_parser",  # the pages are Markdown
    "sphinx.ext.autodoc",  # docs/api.md: the reference from the docstrings (reST, no napoleon needed)
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown: `#section` links within and between pages, as GitHub renders them.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# The reference lists members in source order and shows signatures as written.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autoclass_content = "both"  # a class's docstring, then its __init__'s (Preemption's arguments)
# Reading hpc_c10d.reduce_op's attributes warns that it is deprecated, which is its job; not the build's.
warnings.filterwarnings("ignore", message=r"`hpc_c10d\.reduce_op` is deprecated", category=FutureWarning)

# Links from a page to files outside docs/ stay links to those files, as on GitHub. MyST makes a
# link to an existing non-Markdown file (../slurm/cpu_job.sbatch) a download link by itself, but
# takes every existing .md file for a page of this site, so ../benchmarks/README.md would fail
# the build as an unknown document. setup() turns exactly those links (a .md file that exists
# outside docs/) into download links too; links to missing files and pages still fail the build.
# pydata-sphinx-theme (NumPy's and CuPy's): a wide body, so code blocks fit; no network at build time.
html_theme = "pydata_sphinx_theme"
html_title = f"hpc_c10d {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]  # a wider body: code blocks of ~110 columns fit at laptop width
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 4,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars: dict[str, list[str]] = {"**": []}  # pages are reached from the header and the index
# A fence without a language is program output or a file's text: shown plain, not coloured as code.
highlight_language = "none"


def setup(app):
    from docutils import nodes
    from sphinx import addnodes
    from sphinx.transforms import SphinxTransform

    docs = os.path.dirname(os.path.abspath(__file__))

    class MarkdownOutsideDocs(SphinxTransform):
        default_priority = 500

        def apply(self):
            for xref in list(self.document.findall(addnodes.pending_xref)):
                target = xref.get("reftarget", "")
                path = target + ".md"
                if (xref.get("reftype") != "myst" or xref.get("refdomain") != "doc" or not os.path.isabs(target)
                        or os.path.commonpath([docs, path]) == docs or not os.path.isfile(path)):
                    continue
                here = os.path.dirname(self.env.doc2path(self.env.docname))
                link = addnodes.download_reference("", "", refdoc=self.env.docname, refexplicit=True,
                                                   reftarget=os.path.relpath(path, here))
                link += nodes.inline("", "", *[child.deepcopy() for child in xref[0].children],
                                     classes=["xref", "download", "myst"])
                xref.replace_self(link)

    app.add_transform(MarkdownOutsideDocs)
    return {"parallel_read_safe": True}
