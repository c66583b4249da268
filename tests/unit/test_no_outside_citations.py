"""No code or document cites a file that is not in the repository.

Why: a reader of a checkout (or of the published package) cannot open a design note kept beside
the repository, so "see the design note, section 5" or a path to a shared folder explains
nothing; what such a note said that still matters lives in docs/ or in the module's docstring.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache"}
_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".cfg", ".ini", ".conf", ".txt", ""}
# built from parts, so that this file does not cite them itself
_CITATIONS = re.compile("|".join([r"DESIGN" + r"\.md", "/work/" + "shared", r"\.\./" + "shared"]))
_MD_LINK = re.compile(r"\]\(([^)#\s]+)")


def _text_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(p in _SKIP_DIRS or p.endswith(".egg-info") for p in rel.parts[:-1]):
            continue
        if path.is_file() and path.suffix in _SUFFIXES and path.stat().st_size < 2_000_000:
            out.append(path)
    return out


def citations_outside(files: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line: text`` of every line citing a design note or a folder outside the repo."""
    found = []
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(lines, 1):
            if _CITATIONS.search(line):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def links_outside(files: list[Path], root: Path = ROOT) -> list[str]:
    """Relative links of the Markdown files that lead out of the repository."""
    found = []
    for path in files:
        if path.suffix != ".md":
            continue
        for target in _MD_LINK.findall(path.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(root):
                found.append(f"{path.relative_to(root)}: {target}")
    return found


def test_no_file_cites_a_design_note_or_a_folder_outside_the_repository() -> None:
    assert citations_outside(_text_files()) == []


def test_no_markdown_link_leads_out_of_the_repository() -> None:
    assert links_outside(_text_files()) == []


def test_the_checks_see_a_citation_and_an_outside_link(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    bad = repo / "docs" / "probe.md"
    bad.write_text("see " + "DESIGN" + ".md §5 and [notes](../../elsewhere/notes.md)\n")
    good = repo / "docs" / "fine.md"
    good.write_text("see [the design](architecture.md)\n")
    assert citations_outside([bad], repo) and links_outside([bad], repo)
    assert citations_outside([good], repo) == links_outside([good], repo) == []
