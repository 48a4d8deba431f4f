"""mkdocs hooks (`mkdocs.yml`): README.md is the site's home page and BENCHMARKS.md one of
its pages, read where they live rather than copied into docs/, and every relative link is
written as GitHub reads it (a path in the repository) and pointed here at the page the
site makes of that file. Plain mkdocs, no plugin."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
# Files outside docs/ that the site shows, by repository path: the page each becomes.
OUTSIDE = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks.md"}
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def on_files(files: Files, config: Any) -> Files:
    """Add the pages that live outside docs/."""
    for repo_path, uri in OUTSIDE.items():
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / repo_path)))
    return files


def repo_path(uri: str) -> str:
    """The repository path of a site page."""
    inverse = {uri: path for path, uri in OUTSIDE.items()}
    return inverse.get(uri, f"docs/{uri}")


def site_uri(path: str) -> str | None:
    """The site page of a repository path (None: not a page of the site)."""
    if path in OUTSIDE:
        return OUTSIDE[path]
    return path.removeprefix("docs/") if path.startswith("docs/") else None


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point each repository-relative link at the site page it means."""
    here = repo_path(page.file.src_uri)

    def point(match: re.Match[str]) -> str:
        target = match["target"]
        path, hash_, anchor = target.partition("#")
        if not path or "://" in path or path.startswith("mailto:"):
            return match[0]
        uri = site_uri(posixpath.normpath(posixpath.join(posixpath.dirname(here), path)))
        if uri is None:
            return match[0]
        relative = posixpath.relpath(uri, posixpath.dirname(page.file.src_uri) or ".")
        return f"]({relative}{hash_}{anchor})"

    return LINK.sub(point, markdown)
