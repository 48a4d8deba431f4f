"""The pages a newcomer reads stay true: README.md, BENCHMARKS.md and docs/*.md.

Every relative link resolves to a file of the repository and, with an `#anchor`, to a
heading of that file (GitHub's slugs, which mkdocs' match for the headings we write);
every `historian ...` line of a shell code block names a real command and real options,
resolved through the CLI's own click command and option parsers (parsed, never run); and `mkdocs build
--strict` passes. Each checker is a function over text, proven on a synthetic bad page by
the tests at the end.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import click
import pytest
import typer

from pipelines.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<lang>[\w+-]*)")
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(?P<level>#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
SEPARATORS = {"&&", "||", "|", ";", "&", "(", ")"}
# typer 0.29 carries a copy of click of its own: its commands raise that copy's errors.
USAGE_ERRORS: tuple[type[Exception], ...] = (click.UsageError,)
if importlib.util.find_spec("typer._click") is not None:
    from typer._click.exceptions import UsageError as TyperUsageError

    USAGE_ERRORS += (TyperUsageError,)
# README.md is a front page: its tables hold short cells, the reference lives in docs/.
README_MAX_CELL = 160


def pages(root: Path = ROOT) -> list[Path]:
    """The documentation: the front page, the benchmarks and every page under docs/."""
    return [root / "README.md", root / "BENCHMARKS.md", *sorted((root / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language and its lines, with the line number of the first."""

    lang: str
    first_line: int
    lines: list[str]


def split_fences(text: str) -> tuple[list[tuple[int, str]], list[Block]]:
    """The prose lines (numbered from 1) and the fenced code blocks of a Markdown text."""
    prose: list[tuple[int, str]] = []
    blocks: list[Block] = []
    open_fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if open_fence is None and match:
            open_fence = match["fence"]
            blocks.append(Block(match["lang"].lower(), number + 1, []))
        elif open_fence is not None and line.strip().startswith(open_fence):
            open_fence = None
        elif open_fence is not None:
            blocks[-1].lines.append(line)
        else:
            prose.append((number, line))
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (mkdocs' toc gives the same for ours): the text as
    rendered, lower case, without punctuation, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, a repeated one numbered as GitHub numbers it (`-1`, `-2`)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in split_fences(text)[0]:
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match["text"])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> Iterator[tuple[int, str]]:
    """The targets of the Markdown links in prose (code spans and blocks left out)."""
    for number, line in split_fences(text)[0]:
        for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            yield number, match["target"]


def broken_links(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """A line per relative link of `page` that names no file, or no heading of it."""
    broken = []
    for number, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not resolved.is_relative_to(root) or not resolved.exists():
            broken.append(f"{where}: no such file")
        elif (
            anchor
            and resolved.suffix == ".md"
            and anchor not in anchors(resolved.read_text(encoding="utf-8"))
        ):
            broken.append(f"{where}: no heading #{anchor} in {resolved.relative_to(root)}")
    return broken


def shell_lines(block: Block) -> Iterator[tuple[int, str]]:
    """The command lines of a shell block: continuations joined, a console's `$ ` only."""
    pending, start = "", block.first_line
    for offset, line in enumerate(block.lines):
        if block.lang == "console":
            if not line.startswith("$ ") and not pending:
                continue
            line = line.removeprefix("$ ")
        if not pending:
            start = block.first_line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def historian_commands(text: str) -> Iterator[tuple[int, list[str]]]:
    """Each `historian ...` command of the shell blocks (also `.venv/bin/historian`), its
    arguments after the program's name, with the line it is on."""
    for block in split_fences(text)[1]:
        if block.lang not in SHELL_LANGUAGES:
            continue
        for number, line in shell_lines(block):
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            command: list[str] = []
            for token in [*lexer, ";"]:
                if token not in SEPARATORS:
                    command.append(token)
                    continue
                while command and re.match(r"^[A-Za-z_]\w*=", command[0]):  # VAR=value
                    command.pop(0)
                if command and PurePosixPath(command[0]).name == "historian":
                    yield number, command[1:]
                command = []


def unknown_in_command(argv: list[str], cli: Any) -> str | None:
    """What of `historian ARGV` the CLI (a click command) does not know, a command or an
    option, or None. Each level's options go through that command's own option parser
    (which runs no callback: `--version` prints nothing); the resilient context that
    click builds beside it says which subcommand the rest is for."""
    command, names, args = cli, ["historian"], list(argv)
    parent: Any = None
    while True:
        strict = command.context_class(command, info_name=names[-1], parent=parent)
        try:
            command.make_parser(strict).parse_args(list(args))
        except USAGE_ERRORS as error:
            return f"{' '.join(names)}: {error.format_message()}"  # type: ignore[attr-defined]
        if not hasattr(command, "get_command"):  # a command, not a group of them
            return None
        ctx = command.make_context(names[-1], list(args), parent=parent, resilient_parsing=True)
        # click keeps a group's subcommand and its arguments apart until it invokes it.
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return None
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return f"{' '.join(names)}: no command {rest[0]!r}"
        command, parent, args = sub, ctx, rest[1:]
        names.append(rest[0])


def bad_commands(page: str, text: str, cli: Any) -> list[str]:
    """A line per `historian` command of a page that names a command or option there is not."""
    found = []
    for number, argv in historian_commands(text):
        problem = unknown_in_command(argv, cli)
        if problem:
            found.append(f"{page}:{number}: historian {shlex.join(argv)}: {problem}")
    return found


def commands_of(cli: Any, names: tuple[str, ...] = ("historian",)) -> Iterator[tuple[str, Any]]:
    """Every command of the CLI (groups too), by its full name: `historian state reset`."""
    yield " ".join(names), cli
    for name, sub in sorted(getattr(cli, "commands", {}).items()):
        yield from commands_of(sub, (*names, name))


def undocumented(cli: Any, text: str) -> list[str]:
    """The commands without a `### historian ...` heading in the page, and the long options
    the page never names."""
    found = []
    for name, command in commands_of(cli):
        if name != "historian" and not re.search(rf"^### {re.escape(name)}$", text, re.M):
            found.append(f"{name}: no heading")
        for option in (o for param in command.params for o in param.opts):
            named = re.search(rf"{re.escape(option)}(?![\w-])", text)
            if option.startswith("--") and option != "--help" and not named:
                found.append(f"{name} {option}: not named")
    return found


def long_cells(text: str, limit: int) -> list[str]:
    """Table cells of more than `limit` characters."""
    found = []
    for number, line in split_fences(text)[0]:
        if line.lstrip().startswith("|"):
            for cell in line.strip().strip("|").split("|"):
                if len(cell.strip()) > limit:
                    found.append(f"line {number}: a cell of {len(cell.strip())} characters")
    return found


@pytest.fixture(scope="module")
def cli() -> Any:
    return typer.main.get_command(app)


# --- the pages as they are -------------------------------------------------------------


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_heading(page: Path) -> None:
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_historian_command_shown_is_a_real_command_with_real_options(
    page: Path, cli: Any
) -> None:
    text = page.read_text(encoding="utf-8")
    assert bad_commands(str(page.relative_to(ROOT)), text, cli) == []


def test_the_pages_show_commands_at_all() -> None:
    shown = [argv for page in pages() for _, argv in historian_commands(page.read_text())]
    assert {"init", "check", "backfill", "serve"} <= {argv[0] for argv in shown if argv}


def test_every_command_and_option_is_in_the_commands_page(cli: Any) -> None:
    assert undocumented(cli, (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")) == []


def test_readme_is_a_front_page_with_short_cells() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert long_cells(text, README_MAX_CELL) == []
    assert "## Quick start" in text


def test_the_readme_quick_start_test_command_is_the_one_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = quick.strip().splitlines()
    assert len(commands) == 2
    assert commands[1] in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_mkdocs_builds_the_site_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "Quick start" in home  # the README is the home page
    assert 'href="configuration/"' in home  # its `docs/configuration.md` link, pointed here
    assert (tmp_path / "site" / "benchmarks" / "index.html").exists()


# --- the checkers, on synthetic pages --------------------------------------------------

BAD_PAGE = """\
# A page

## Real heading

See [a missing file](nowhere.md), [a missing heading](#not-a-heading),
[another page's missing heading](other.md#gone), [fine](other.md#kept-heading),
[here](#real-heading) and [the web](https://example.com/x.md).
Inside code: `[not a link](nowhere.md)`.

```bash
historian run --all
historian run hourly --invented-option 3
historian frobnicate
historian state reset hourly --tag "/A b/c" --yes
historian state resett hourly
HISTORIAN_CONFIG=x.yaml .venv/bin/historian check --config y.yaml && historian plan f --strat -1d
```

```yaml
historian: {not: a command}
```
"""


def test_broken_links_name_every_missing_file_and_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Kept heading\n")
    page = tmp_path / "page.md"
    page.write_text(BAD_PAGE)
    assert broken_links(page, BAD_PAGE, root=tmp_path) == [
        "page.md:5: nowhere.md: no such file",
        "page.md:5: #not-a-heading: no heading #not-a-heading in page.md",
        "page.md:6: other.md#gone: no heading #gone in other.md",
    ]


def test_a_link_out_of_the_repository_is_broken(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (tmp_path / "outside.md").write_text("# Outside\n")
    page = root / "page.md"
    assert broken_links(page, "[x](../outside.md)\n", root=root) == [
        "page.md:1: ../outside.md: no such file"
    ]


def test_invented_commands_and_options_are_named(cli: Any) -> None:
    expected = [  # click's own wording after these (a suggestion) differs between versions
        "page.md:12: historian run hourly --invented-option 3: historian run: "
        "No such option: --invented-option",
        "page.md:13: historian frobnicate: historian: no command 'frobnicate'",
        "page.md:15: historian state resett hourly: historian state: no command 'resett'",
        "page.md:16: historian plan f --strat -1d: historian plan: No such option: --strat",
    ]
    found = bad_commands("page.md", BAD_PAGE, cli)
    assert [line[: len(start)] for line, start in zip(found, expected, strict=True)] == expected


def test_real_commands_pass(cli: Any) -> None:
    for argv in (
        ["run", "--all"],
        ["--version"],
        ["--log-format", "json", "run", "f", "--node", "a", "-n", "b"],
        ["state"],
        ["state", "repair", "f"],
        ["backfill", "f", "--start", "-30d", "--shards", "4", "--pool", "p", "--by", "time"],
    ):
        assert unknown_in_command(argv, cli) is None, argv


def test_anchors_follow_github_slugs() -> None:
    text = "# T\n## A fleet: `node_defaults` and anchors\n## Sizing 1,000 nodes\n## Dup\n## Dup\n"
    assert anchors(text) == {
        "t",
        "a-fleet-node_defaults-and-anchors",
        "sizing-1000-nodes",
        "dup",
        "dup-1",
    }


def test_headings_inside_code_blocks_are_not_anchors() -> None:
    assert anchors("# T\n```bash\n# a comment\n```\n") == {"t"}


def test_long_cells_are_found() -> None:
    assert long_cells(f"| a | {'x' * 200} |\n", 160) == ["line 1: a cell of 200 characters"]


def test_undocumented_commands_and_options_are_named() -> None:
    group = click.Group(
        "historian",
        commands=[
            click.Command(
                "run",
                params=[
                    click.Option(["--start"]),
                    click.Option(["-x", "--hidden-gem"], is_flag=True),
                ],
            ),
            click.Command("tail"),
        ],
    )
    page = "### historian run\n\n`historian run --start T`\n"
    assert undocumented(group, page) == [
        "historian run --hidden-gem: not named",
        "historian tail: no heading",
    ]
