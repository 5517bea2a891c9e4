"""The results: a text table for the terminal and a markdown section for BENCHMARKS.md."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple


class Row(NamedTuple):
    """One line of results; ``passed`` is None for a figure reported for information."""

    name: str
    measured: str
    floor: str = ""
    ratio: str = ""
    budget: str = ""
    passed: bool | None = None

    def cells(self) -> tuple[str, ...]:
        return (*self[:5], {True: "PASS", False: "FAIL", None: "info"}[self.passed])


def ns(seconds: float) -> str:
    return f"{seconds * 1e9:,.1f} ns"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def ratio(value: float) -> str:
    return f"{value:.2f}x"


def text_table(title: str, header: Sequence[str], rows: Sequence[Row]) -> str:
    table = [header, *(row.cells() for row in rows)]
    widths = [max(len(line[column]) for line in table) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return f"{title}\n" + "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Row]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    aligns = ("---", "---:", "---:", "---:", "---", ":---:")
    return "\n".join([line(header), line(aligns), *(line(row.cells()) for row in rows)])


def write_section(path: Path, section: str, *, start: str, end: str) -> None:
    """Put ``section`` between the markers ``start`` and ``end`` of ``path``, adding what is missing."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{section.strip()}\n{end}"
    before, found, rest = text.partition(start)
    if found and end in rest:
        path.write_text(before + block + rest.split(end, 1)[1])
    else:
        path.write_text(text.rstrip() + "\n\n" + block + "\n")


@dataclass
class Results:
    """What a benchmark found: budget rows, rows for information, failed checks; also a benchmark's base class.
    ``header`` heads the columns of its tables."""

    header = ("Measurement", "Measured", "Floor", "Ratio", "Budget", "Result")
    budgets: list[Row] = field(default_factory=list, init=False)
    info: list[Row] = field(default_factory=list, init=False)
    failed_checks: list[str] = field(default_factory=list, init=False)

    def budget(self, name: str, measured: str, floor: str, ratio: str, budget: str, passed: bool) -> None:
        self.budgets.append(Row(name, measured, floor, ratio, budget, passed))

    def at_least(self, name: str, measured: str, floor: str, value: float, limit: float) -> None:
        self.budget(name, measured, floor, ratio(value), f"≥ {limit:g}x", value >= limit)

    def share_below(self, name: str, measured: str, share: float, limit: float) -> None:
        self.budget(name, measured, "", "", f"< {limit:.0%}", share < limit)

    def note(self, name: str, measured: str, floor: str = "", ratio: str = "") -> None:
        self.info.append(Row(name, measured, floor, ratio))

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failed_checks.append(what)
            print(f"CHECK FAILED: {what}", file=sys.stderr)

    def sort(self) -> None:
        """Rows in the order of BENCHMARKS.md's list (by the number they start with), run order within each."""
        for rows in (self.budgets, self.info):
            rows.sort(key=lambda row: row.name.split(" ", 1)[0])

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.budgets) and not self.failed_checks
