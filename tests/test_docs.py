"""The documentation: README.md (the front door) and docs/*.md.

Fast and without torch: the generated parameter reference is current, every relative link and
anchor resolves, the results README.md shows are the figures in the reports/ files it names, and
every decimal figure in README.md and docs/ is written somewhere under reports/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0]
            elif marker.group(1)[0] == fence:
                fence = None
            continue
        if fence is None:
            out.append((n, re.sub(r"`+[^`]*`+", lambda m: "`" * len(m.group(0)), line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (word characters, hyphens and
    spaces kept), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    fence = None
    for line in path.read_text(encoding="utf-8").splitlines():
        marker = re.match(r"\s*(`{3,}|~{3,})", line)
        if marker:
            ch = marker.group(1)[0]
            fence = ch if fence is None else (None if ch == fence else fence)
            continue
        match = HEADING.match(line) if fence is None else None
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    return [(n, m.group(1)) for n, line in _prose(text) for m in LINK.finditer(line)]


def test_parameter_reference_is_generated_from_the_schema():
    from scripts.docs import parameters_markdown

    page = DOCS / "parameters.md"
    assert page.exists(), "docs/parameters.md is missing: run `python -m scripts.docs`"
    assert page.read_text(encoding="utf-8") == parameters_markdown(), (
        "docs/parameters.md is not what self_improve/config generates: run `python -m scripts.docs`"
    )


def test_the_parameter_reference_covers_every_section():
    from self_improve.config import Params

    text = (DOCS / "parameters.md").read_text(encoding="utf-8")
    for name in Params.model_fields:
        assert f"`{name}" in text, name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    bad = []
    for n, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http(s)://, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.name}:{n}: {target}: no such file")
            continue
        if anchor:
            if dest.suffix != ".md":
                bad.append(f"{page.name}:{n}: {target}: an anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                bad.append(f"{page.name}:{n}: {target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_the_slug_rule():
    assert slug("Real tasks on a real model: does self-judging work?") == (
        "real-tasks-on-a-real-model-does-self-judging-work")
    assert slug("Training: checkpoints and scale-out") == "training-checkpoints-and-scale-out"
    assert slug("`task.on_error`") == "taskon_error"


def test_every_docs_page_is_in_the_index_and_the_front_door():
    index = {t for _, t in links(DOCS / "README.md")}
    front = {t for _, t in links(README)}
    for page in sorted(DOCS.glob("*.md")):
        if page.name == "README.md":
            continue
        assert page.name in index, f"docs/README.md does not list {page.name}"
        assert f"docs/{page.name}" in front, f"README.md does not link docs/{page.name}"


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()  # its length: test_readme_sentences_are_short
    for start, table in _tables(lines):
        assert len(_cells(table[0])) <= 8, f"README.md line {start + 1}: a table of more than 8 columns"


# --- the results README.md shows are the reports' figures ---------------------------------------


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _tables(lines: list[str]) -> list[tuple[int, list[str]]]:
    """(index of the first line, the table's lines) for each markdown table in `lines`."""
    out, start = [], None
    for i, line in enumerate(lines + [""]):
        if line.startswith("|") and start is None:
            start = i
        elif not line.startswith("|") and start is not None:
            out.append((start, lines[start:i]))
            start = None
    return out


def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"## {title}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1:end]


def _figure(cell: str) -> str:
    """A cell as the reports write it: README may bold a figure or sign a gain."""
    return re.sub(r"^\+(?=\d)", "", cell.replace("**", "").strip())


def _report_rows(path: Path) -> list[dict[str, str]]:
    rows = []
    for _, table in _tables(path.read_text(encoding="utf-8").splitlines()):
        header = _cells(table[0])
        for line in table[2:]:
            rows.append(dict(zip(header, _cells(line))))
    return rows


def _transposed_matches(table: list[str], report: dict[str, str]) -> list[str]:
    """README's table turned on its side: its rows name a measure (`held-out acc`), its columns an
    iteration (`it1`) or the gain (`gain it0 -> it3`), and each cell must be the report's cell in
    column `<measure> <column>` (`held-out it1`), the report's per-seed values allowed after it."""
    header = _cells(table[0])
    wrong = []
    for line in table[2:]:
        cells = _cells(line)
        measure = re.sub(r"\s+acc$", "", cells[0])
        for col, cell in zip(header[1:], cells[1:]):
            if not cell:
                continue
            name = f"{measure} {col.replace(' -> ', '->')}"
            if name not in report:
                wrong.append(f"{cells[0]} / {col}: the report has no column {name!r}")
            elif report[name] != _figure(cell) and not report[name].startswith(_figure(cell) + " ("):
                wrong.append(f"{cells[0]} / {col}: README {cell!r}, report {report[name]!r}")
    return wrong


def test_readme_results_are_the_reports_figures():
    """Each results table in README.md names the reports/ file it comes from (the last reports/
    link before it); each of its rows is a row of that file verbatim, or, for a table turned on
    its side, every cell is the figure in the matching column of one row of that file."""
    section = _section(README.read_text(encoding="utf-8"), "Results")
    tables = _tables(section)
    assert len(tables) >= 2, "README.md's Results should show the tiny model's and SmolLM2's tables"
    sources = []
    prev_end = 0
    for start, table in tables:
        before = "\n".join(section[prev_end:start])
        prev_end = start + len(table)
        named = re.findall(r"\]\(((?:reports|research)/[^)#\s]+\.md)\)", before)
        assert named, f"no reports/ or research/ file named before the table {table[0]!r}"
        source = ROOT / named[-1]
        assert source.exists(), f"{named[-1]} does not exist"
        sources.append(named[-1])
        report_lines = set(source.read_text(encoding="utf-8").splitlines())
        if table[0] in report_lines:  # the report's own columns: its rows, verbatim
            missing = [line for line in table[2:] if line not in report_lines]
            assert not missing, f"rows of README.md that are not rows of {named[-1]}:\n" + "\n".join(missing)
            continue
        problems = sorted((_transposed_matches(table, row), row.get("variant", "?"))
                          for row in _report_rows(source))
        assert problems, f"{named[-1]} has no table"
        wrong, nearest = min(problems, key=lambda p: len(p[0]))
        assert not wrong, (f"README's table {table[0]!r} is no row of {named[-1]}; nearest, row "
                           f"{nearest}:\n  " + "\n  ".join(wrong))
    assert any("seeds" in s or "bstar" in s for s in sources), sources  # the tiny model's
    assert any("smollm2" in s or s.startswith("research/") for s in sources), sources  # and the real model's


FIGURE = re.compile(r"(?<![\w.])[+-]?(\d+\.\d{2,4})(?![\w.])")
NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?:[eE][+-]?\d+)?")
# figures from runs that kept no file under reports/, each said so where it stands (none now)
NOT_KEPT: dict[tuple[str, str], str] = {}


def _reported() -> set[str]:
    """Every decimal number written under reports/ and research/ (the kept runs and their analyses), as
    written and rounded to 2, 3 and 4 decimals."""
    text = "\n".join(p.read_text(encoding="utf-8", errors="ignore")
                     for folder in ("reports", "research") for p in sorted((ROOT / folder).rglob("*"))
                     if p.is_file() and p.suffix in {".md", ".json", ".jsonl", ".csv", ".txt"}
                     and p != ROOT / "research" / "LOG.md")  # the story: it cites figures, it keeps none
    out = set()
    for m in NUMBER.finditer(text):
        value = float(m.group(0))
        out.add(m.group(0))
        out.update(f"{value:.{d}f}" for d in (2, 3, 4))
    return out


def test_every_figure_in_the_docs_is_a_figure_of_reports():
    """Each decimal figure in README.md and docs/ (two to four decimals: accuracies, gains, their
    spreads) is a number written under reports/ or research/ (as written, or rounded), so a figure retyped by hand
    and gone wrong, or one whose report was never kept, fails here; the few from runs that kept no
    report are listed above."""
    reported = _reported()
    stray = []
    for page in PAGES:
        if page.name == "parameters.md":  # defaults from the schema, checked above
            continue
        for n, line in _prose(page.read_text(encoding="utf-8")):
            for m in FIGURE.finditer(line):
                if m.group(1) not in reported and (page.name, m.group(1)) not in NOT_KEPT:
                    stray.append(f"{page.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not stray, "figures found in no file under reports/:\n" + "\n".join(stray)


def test_the_readme_headline_tables_are_generated_from_the_kept_results():
    """README.md's tables between `<!-- headline:NAME -->` markers and research/results/headline.md are
    what `python -m research.headline` makes of the kept results now."""
    from research.headline import HEADLINE, headline, render

    text = README.read_text(encoding="utf-8")
    assert render(text) == text, "README.md's headline tables are stale: run python -m research.headline"
    assert HEADLINE.read_text(encoding="utf-8") == headline()


def _prose_lines(path: Path) -> list[str]:
    """`path`'s lines outside code blocks, tables, headings and markers."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [line for line in text.splitlines() if not line.startswith(("|", "<!--", "#"))]


def _long_sentences(lines: list[str], limit: int = 50) -> list[str]:
    """The sentences of over `limit` words, a paragraph or a list item at a time."""
    blocks = re.split(r"\n\s*\n|\n\s*(?=- )", "\n".join(lines))
    return [s for b in blocks for s in re.split(r"(?<=[.!?])\s+", " ".join(b.split())) if len(s.split()) > limit]


SHORT_PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md")))


def test_readme_sentences_are_short():
    """The front door in sentences a reader holds: at most ~1,000 words of prose (outside code and
    tables), and on it and every page of docs/ no sentence over 50 words."""
    words = sum(len(line.split()) for line in _prose_lines(README))
    assert words <= 1000, f"README.md: {words} words of prose"
    for page in SHORT_PAGES:
        long = _long_sentences(_prose_lines(ROOT / page))
        assert not long, f"{page}: sentences over 50 words:\n" + "\n".join(long)


def test_the_results_page_is_generated_from_the_kept_results():
    """docs/results.md is what `python -m research.results_page` makes: each study's table copied
    from the file it names, with its verdict."""
    from research.results_page import PAGE, page

    assert PAGE.read_text(encoding="utf-8") == page(), "docs/results.md is stale: run python -m research.results_page"
