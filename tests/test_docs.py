"""The docs stay honest: links resolve, the README's commands exist, the present tense.

- every relative link in README.md and docs/*.md names a file of the repository, and
  its `#anchor` a heading of that file (GitHub's heading ids);
- every `canal-ha ...` command the README shows parses with the command line's own
  parser (the subcommand and every option exist), and `make` targets exist;
- no development history by number in the repository (the pattern is built below so
  that this file does not match it).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from canal_ha.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def heading_ids(text: str) -> set[str]:
    """GitHub's ids of a page's headings: lower case, punctuation dropped, spaces to '-'."""
    ids: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def links_of(text: str) -> list[str]:
    prose = FENCE.sub("", text)
    return [a or b for a, b in LINK.findall(prose)]


def broken_links(page: Path) -> list[str]:
    out = []
    for target in links_of(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{page.name}: {target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in heading_ids(dest.read_text()):
            out.append(f"{page.name}: {target}: no heading #{anchor} in {dest.name}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    (tmp_path / "q.md").write_text("# Real heading\n")
    page.write_text("[a](q.md#real-heading) [b](q.md#nope) [c](missing.md) [d](#here)\n## Here\n")
    assert [b.split(": ")[1] for b in broken_links(page)] == ["q.md#nope", "missing.md"]


def readme_commands() -> list[str]:
    """The `canal-ha` and `make` command lines of the README's console blocks."""
    found = []
    for block in FENCE.findall((ROOT / "README.md").read_text()):
        for line in block.splitlines():
            m = re.match(r"^\$ (?:\.venv/bin/)?((?:canal-ha|make) .*)$", line)
            if m:
                found.append(m.group(1).split(" #")[0].strip())
    return found


def test_the_readme_shows_commands() -> None:
    commands = readme_commands()
    assert any(c.startswith("canal-ha up") for c in commands)
    assert any(c.startswith("make test") for c in commands)


@pytest.mark.parametrize("line", readme_commands())
def test_readme_commands_parse(line: str) -> None:
    argv = shlex.split(line)
    if argv[0] == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        assert set(argv[1:]) <= set(targets), f"{line}: no such make target"
        return
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse's own error names the option
        pytest.fail(f"{line}: the command line refuses it (exit {exc.code})")


def test_no_development_history_by_number() -> None:
    word = "sess" + "ion"
    pattern = f"{word}s? [0-9]"
    done = subprocess.run(
        ["git", "grep", "-niE", pattern, "--", ".", ":!*.png"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.stdout == "", "history belongs in git, not in the tree:\n" + done.stdout[:3000]
