"""Hostile input: a 5xx matched with its traceback in the deployment's web.log."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from urllib.parse import unquote, urlsplit

from drills.deployment import PROJECT_DIR

LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.MULTILINE)


SERVER_ERROR = re.compile(r"ERROR django\.request Internal Server Error: (.+)$")


def server_tracebacks(text: str) -> dict[str, list[str]]:
    """Logged request path -> the tracebacks the web log ``text`` holds for it (carets dropped).

    Django logs the decoded path escaped with ``unicode_escape``; ``traceback_for`` matches it.
    """
    found: dict[str, list[str]] = defaultdict(list)
    starts = [m.start() for m in LOG_RECORD.finditer(text)] + [len(text)]
    for start, end in itertools.pairwise(starts):
        record = text[start:end]
        match = SERVER_ERROR.search(record.split("\n", 1)[0])
        if match:
            lines = [line for line in record.rstrip().splitlines() if line.strip().strip("^~") != ""]
            found[match.group(1)].append("\n".join(lines))
    return found


def traceback_summary(traceback: str) -> str:
    """The exception and the innermost frame of the project's own code."""
    lines = traceback.splitlines()
    own = [line.strip() for line in lines if line.strip().startswith("File ") and ".venv" not in line]
    own = [line for line in own if str(PROJECT_DIR) in line]
    where = own[-1].replace(str(PROJECT_DIR) + "/", "") if own else ""
    return f"{lines[-1].strip()}" + (f" at {where}" if where else "")


def traceback_for(tracebacks: dict[str, list[str]], url_or_path: str) -> str:
    raw = urlsplit(url_or_path.split(" ", 1)[-1]).path
    for path in (unquote(raw), raw):  # Django keeps a path that is not UTF-8 percent-encoded
        logged = path.encode("unicode_escape").decode("ascii")
        if logged in tracebacks:
            return tracebacks[logged][0]
    return ""
