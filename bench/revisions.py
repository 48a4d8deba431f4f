"""A package (sinks/, connectors/) of another git revision, importable beside this tree's,
so a bench can alternate the two in one process and one run (the machine is shared: only
ratios measured side by side mean anything)."""

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
    """`sinks.<module>` as it was at `revision` (`connectors/` is this tree's)."""
    return package_module_at(revision, "sinks", *modules)


def package_module_at(revision: str, top: str, *modules: str) -> ModuleType:
    """`<top>.<module>` as it was at `revision`, imported as package `<top>_<revision>`
    (its own imports of `<top>` rewritten; the other packages are this tree's). Of several
    names, the first the revision has: modules were renamed when the packages gained
    sub-packages (`sinks.sql` became `sinks.sql.warehouse`)."""
    package = f"{top}_" + "".join(c if c.isalnum() else "_" for c in revision)
    if package not in _ROOTS:
        folder = Path(tempfile.mkdtemp(prefix=f"bench-{top}-"))
        atexit.register(shutil.rmtree, folder, True)  # imported by now; nothing left behind
        for path in _git("ls-tree", "-r", "--name-only", revision, f"{top}/").split():
            text = _git("show", f"{revision}:{path}")
            for form in ("from {}.", "import {}.", "from {} import "):
                text = text.replace(form.format(top), form.format(package))
            target = folder / package / Path(path).relative_to(top)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        sys.path.insert(0, str(folder))
        _ROOTS[package] = folder / package
    for module in modules:
        path = _ROOTS[package].joinpath(*module.split("."))
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return importlib.import_module(f"{package}.{module}")
    raise ModuleNotFoundError(f"{top}/ at {revision} has none of {', '.join(modules)}")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
