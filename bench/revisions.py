"""The sinks/ package of another git revision, importable beside this tree's, so a bench
can alternate the two in one process and one run (the machine is shared: only ratios
measured side by side mean anything)."""

from __future__ import annotations

import atexit
import importlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
_ROOTS: dict[str, Path] = {}  # package name -> the folder its revision was written to


def sinks_module_at(revision: str, *modules: str) -> ModuleType:
    """`sinks.<module>` as it was at `revision`, imported as package `sinks_<revision>`
    (its own imports of `sinks.` rewritten; `connectors/` is this tree's). Of several
    names, the first the revision has: a module's name changed when sinks/ gained
    sub-packages (`sql` became `sql.warehouse`)."""
    package = "sinks_" + "".join(c if c.isalnum() else "_" for c in revision)
    if package not in _ROOTS:
        top = tempfile.mkdtemp(prefix="bench-sinks-")
        atexit.register(shutil.rmtree, top, True)  # imported by now; nothing left behind
        folder = Path(top) / package
        folder.mkdir()
        listed = _git("ls-tree", "-r", "--name-only", revision, "sinks/").split()
        for path in listed:
            text = _git("show", f"{revision}:{path}")
            for old, new in (("from sinks.", "from {}."), ("from sinks import", "from {} import")):
                text = text.replace(old, new.format(package))
            text = text.replace("import sinks.", f"import {package}.")
            target = folder / Path(path).relative_to("sinks")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        sys.path.insert(0, str(folder.parent))
        _ROOTS[package] = folder
    root = _ROOTS[package]
    for module in modules:
        path = root.joinpath(*module.split("."))
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return importlib.import_module(f"{package}.{module}")
    raise ModuleNotFoundError(f"sinks/ at {revision} has none of {', '.join(modules)}")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
