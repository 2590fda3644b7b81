"""The code a lesson teaches, from its notebook into the library: one mechanism, so it exists once.

A code cell of ``notebooks/NN_*.ipynb`` whose first line is ``#@save`` defines something the
library uses too (as d2l.ai's ``#@save`` does). ``python -m mgpu.runtime.saved`` writes every such
cell of notebook NN, in order, into ``mgpu/lessonNN/saved.py``: the cell as the notebook has it,
with its solution (the ``### BEGIN SOLUTION`` / ``### END SOLUTION`` marker lines dropped, the code
between them kept). The library imports those names from there and never defines them again.
``--check`` (and ``tests/test_saved.py``) fails when a saved file is not what the notebooks give:
edit the notebook, then run ``python -m mgpu.runtime.saved``.

A saved cell must stand alone: it imports what it uses (``import numpy as np`` in the cell), and
notebook magics (``%%writefile``) cannot be saved.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mgpu.runtime import paths

MARK = "#@save"
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def saved_cells(notebook: Path) -> list[str]:
    """The sources of the notebook's ``#@save`` cells, marker lines removed, in order."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    sources = []
    for index, cell in enumerate(cells):
        text = "".join(cell["source"])
        lines = text.splitlines()
        if cell["cell_type"] != "code" or not lines or lines[0].strip() != MARK:
            continue
        body = [line for line in lines[1:] if line.strip() not in SOLUTION_MARKERS]
        if any(line.lstrip().startswith(("%", "!")) for line in body):
            raise ValueError(f"{notebook.name}, cell {index}: a #@save cell cannot hold notebook magics or shell lines")
        sources.append("\n".join(body).strip("\n"))
    return sources


def module_text(notebook: Path, sources: list[str]) -> str:
    """The text of ``mgpu/lessonNN/saved.py`` for ``notebook``'s saved cells."""
    head = (f'"""What notebook {notebook.stem[:2]} teaches, as its cells define it: generated from '
            f"notebooks/{notebook.name}\nby ``python -m mgpu.runtime.saved`` (edit the notebook, then run it; "
            'see mgpu.runtime.saved)."""\n')
    return head + "".join(f"\n\n# --- cell {i + 1} of {len(sources)} ---\n{s}\n" for i, s in enumerate(sources))


def targets(root: Path = paths.ROOT) -> dict[Path, str]:
    """Each lesson's saved module and the text it should hold (lessons with ``#@save`` cells only)."""
    out = {}
    for notebook in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        sources = saved_cells(notebook)
        if sources:
            package = root / "mgpu" / f"lesson{notebook.stem[:2]}"
            if not package.is_dir():
                raise ValueError(f"{notebook.name} has #@save cells but mgpu/{package.name}/ does not exist: create the package")
            out[package / "saved.py"] = module_text(notebook, sources)
    return out


def stale(root: Path = paths.ROOT) -> list[Path]:
    """Saved modules that differ from what the notebooks give (or are missing), and orphans."""
    want = targets(root)
    wrong = [path for path, text in want.items() if not path.exists() or path.read_text(encoding="utf-8") != text]
    orphans = [p for p in (root / "mgpu").glob("lesson*/saved.py") if p not in want]
    return wrong + orphans


def write(root: Path = paths.ROOT) -> list[Path]:
    """Write every saved module that changed; returns those written."""
    written = []
    for path, text in targets(root).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.runtime.saved", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a saved module is not what the notebooks give")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for path in bad:
            print(f"{path.relative_to(paths.ROOT)} is not what the notebooks give: run python -m mgpu.runtime.saved")
        return 1 if bad else 0
    for path in write():
        print(f"wrote {path.relative_to(paths.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
