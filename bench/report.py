"""The results: a text table for the terminal and a markdown section for BENCHMARKS.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

START = "<!-- bench:results:start -->"
END = "<!-- bench:results:end -->"

_HEADER = ("Measurement", "Measured", "Floor", "Ratio", "Budget", "Result")

_NEW_FILE = f"""# Benchmarks

Run `python bench/run.py`; the section below is rewritten by each run.

{START}
{END}
"""


@dataclass(frozen=True)
class Row:
    """One line of results; ``passed`` is None for a figure reported for information."""

    name: str
    measured: str
    floor: str = ""
    ratio: str = ""
    budget: str = ""
    passed: bool | None = None

    @property
    def result(self) -> str:
        return {True: "PASS", False: "FAIL", None: "info"}[self.passed]

    def cells(self) -> tuple[str, ...]:
        return (self.name, self.measured, self.floor, self.ratio, self.budget, self.result)


def ns(seconds: float) -> str:
    return f"{seconds * 1e9:,.1f} ns"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def mib(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 2**20:,.1f} MiB"


def ratio(value: float) -> str:
    return f"{value:.2f}x"


def text_table(title: str, rows: Sequence[Row]) -> str:
    table = [_HEADER, *(row.cells() for row in rows)]
    widths = [max(len(line[column]) for line in table) for column in range(len(_HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return f"{title}\n" + "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    aligns = ("---", "---:", "---:", "---:", "---", ":---:")
    return "\n".join([line(_HEADER), line(aligns), *(line(row.cells()) for row in rows)])


def write_section(path: Path, section: str, *, start: str = START, end: str = END) -> None:
    """Put ``section`` between the markers ``start`` and ``end`` of ``path`` (by default the leave
    cache's), creating the file or the markers if missing."""
    text = path.read_text() if path.exists() else _NEW_FILE
    block = f"{start}\n{section.strip()}\n{end}"
    if start in text and end in text and text.index(start) < text.index(end):
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def markdown_section(
    *,
    command: str,
    facts: Sequence[tuple[str, str]],
    budgets: Sequence[Row],
    info: Sequence[Row],
    failed_checks: Sequence[str],
    passed: bool,
) -> str:
    fact_lines = "\n".join(f"| {key} | {value} |" for key, value in facts)
    checks = (
        "\n".join(f"- FAILED: {what}" for what in failed_checks)
        if failed_checks
        else "All correctness checks passed (the warmed cache gates exactly the LEFT records, look-ups run no query, "
        "a sync after leaves replays the feed and gates every leaver)."
    )
    return f"""## Results of the last run: {"PASS" if passed else "FAIL"}

```
{command}
```

| Item | Value |
|---|---|
{fact_lines}

### Budgets

{markdown_table(budgets)}

### For information

{markdown_table(info)}

### Checks

{checks}
"""
