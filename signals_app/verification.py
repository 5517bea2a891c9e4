"""``verify_stop_forward``: runs the stop-forward checks over the stored signals and
aggregates and reports what they found (the ``verify_stop_forward`` command prints it).

The checks themselves, and what each proves, are in ``signals_app.verification_checks``.
Signals are read in chunks of ids, so memory stays bounded however many there are; only
counterexamples come back from the database, and at most ``max_named`` are kept as text.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Max, Min, Q
from tqdm import tqdm

from community.models import Cohort, Community

from .models import Outcome, Signal
from .verification_checks import aggregate_counterexamples, aggregate_rows, erasure_survivors, signal_counterexamples

CHUNK = 100_000


@dataclass
class Verification:
    signals_checked: int = 0
    attributed: int = 0
    gated: int = 0
    without_evidence: int = 0  # processed before the evidence was recorded: nothing to prove
    aggregate_rows_checked: int = 0
    erased_remaining: int = 0  # signals received before an erasure of their user (check 4)
    counterexamples: int = 0
    named: list[str] = field(default_factory=list)
    max_named: int = 100

    @property
    def passed(self) -> bool:
        return self.counterexamples == 0

    def add(self, text: str) -> None:
        self.counterexamples += 1
        if len(self.named) < self.max_named:
            self.named.append(text)


def verify_stop_forward(*, since: datetime | None = None, progress: bool = True, max_named: int = 100) -> Verification:
    """Run the four checks (``verification_checks``) over every signal, or over those
    processed since ``since`` and the aggregate hours from ``since`` on."""
    result = Verification(max_named=max_named)
    signals = Signal.objects.all()
    if since is not None:
        signals = signals.filter(id__gte=_first_id_since(since))
    bounds = signals.aggregate(first=Min("id"), last=Max("id"))
    if bounds["first"] is not None:
        for low, high in _id_chunks(bounds["first"], bounds["last"], progress=progress):
            chunk = signals.filter(id__gte=low, id__lte=high)
            counts = chunk.aggregate(
                attributed=_count_of(Outcome.ATTRIBUTED),
                gated=_count_of(Outcome.GATED),
                without=_count_of(Outcome.ATTRIBUTED, Outcome.GATED, no_evidence=True),
            )
            result.attributed += counts["attributed"]
            result.gated += counts["gated"]
            result.without_evidence += counts["without"]
            for text in signal_counterexamples(chunk):
                result.add(text)
            for text in erasure_survivors(chunk):
                result.erased_remaining += 1
                result.add(text)
    result.signals_checked = result.attributed + result.gated
    for model in (Community.aggregate_model, Cohort.aggregate_model):
        for text in aggregate_counterexamples(model, since=since):
            result.add(text)
        result.aggregate_rows_checked += aggregate_rows(model, since=since)
    return result


def _id_chunks(first: int, last: int, *, progress: bool) -> Iterator[tuple[int, int]]:
    total = max(0, last - first + 1)
    with tqdm(total=total, unit="ids", desc="signals", file=sys.stderr, disable=None if progress else True) as bar:
        for low in range(first, last + 1, CHUNK):
            high = min(low + CHUNK - 1, last)
            yield low, high
            bar.update(high - low + 1)


def _count_of(*outcomes: int, no_evidence: bool = False) -> Count:
    condition = Q(outcome__in=outcomes)
    if no_evidence:
        condition &= Q(fence_at_receipt__isnull=True)
    return Count("id", filter=condition)


def _first_id_since(since: datetime) -> int:
    """The first signal processed (or received gated) at or after ``since``: ids grow with
    time, and the (outcome, processed_at) index finds it without a scan of the table."""
    first = Signal.objects.filter(
        outcome__in=[Outcome.ATTRIBUTED, Outcome.GATED, Outcome.NO_TARGET], processed_at__gte=since
    ).aggregate(first=Min("id"))["first"]
    return first if first is not None else (Signal.objects.aggregate(last=Max("id"))["last"] or 0) + 1
