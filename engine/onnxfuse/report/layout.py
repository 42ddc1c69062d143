"""Graphviz's ``dot`` lays the graphs out, once, when the page is written: the browser
then only shows finished SVG (docs/report.md says why dot and not a JS layout)."""

from __future__ import annotations

import re
import shutil
import subprocess

from onnxfuse.errors import OnnxfuseError

_INSTALL = "Graphviz's dot lays out the graphs of --html (Debian: apt-get install graphviz)"
# dot's <title> elements name the node ids (L12): the page shows its own tooltips.
_TITLES = re.compile(r"<title>[^<]*</title>\n?")
_COMMENTS = re.compile(r"<!--.*?-->\n?", re.DOTALL)


def require_dot() -> str:
    """The path of ``dot``, or one line naming what to install."""
    found = shutil.which("dot")
    if found is None:
        raise OnnxfuseError(f"no 'dot' on PATH: {_INSTALL}")
    return found


def render_svg(sources: list[str]) -> list[str]:
    """Each dot graph in ``sources`` as an inline SVG element, in one run of dot."""
    if not sources:
        return []
    result = subprocess.run(
        [require_dot(), "-Tsvg"],
        input="\n".join(sources).encode("utf-8"),
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        message = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OnnxfuseError(f"dot failed: {message[-1] if message else result.returncode}")
    text = result.stdout.decode("utf-8")
    svgs = [_inline(part) for part in text.split("</svg>")[:-1]]
    if len(svgs) != len(sources):
        raise OnnxfuseError(f"dot drew {len(svgs)} graphs of {len(sources)}")
    return svgs


def _inline(document: str) -> str:
    """A standalone SVG document as an element for HTML: no XML prolog, no doctype."""
    start = document.index("<svg")
    return _TITLES.sub("", _COMMENTS.sub("", document[start:])) + "</svg>"
