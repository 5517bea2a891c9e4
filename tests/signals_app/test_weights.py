"""Weight sums are floating point: a row of weights that nearly cancel out stays right after an
erasure takes some back, and the verifier accepts sums added in another order."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from signals_app.erasure import user_erase
from signals_app.models import CommunityAggregate
from signals_app.services.processing import signals_process
from tests.helpers import ingest, join, sig

pytestmark = pytest.mark.django_db


def verify() -> str:
    out = io.StringIO()
    call_command("verify_stop_forward", "--no-progress", stdout=out, stderr=out)
    return out.getvalue()


def test_erasing_a_heavy_signal_leaves_the_light_ones_sum_exact(sender, community) -> None:
    join(1, community)
    join(2, community)
    signals_process(signal_ids=ingest(sender, sig(1, weight=1e9), sig(2, weight=0.3), sig(2, weight=0.1)))
    user_erase(user_id=1)
    row = CommunityAggregate.objects.get()
    assert (row.count, row.weight_sum) == (2, 0.3 + 0.1)  # not 1e9 + 0.3 + 0.1 - 1e9
    assert "counterexamples: 0" in verify()


def test_a_light_erasure_keeps_the_subtraction(sender, community) -> None:
    join(1, community)
    join(2, community)
    signals_process(signal_ids=ingest(sender, sig(1, weight=0.5), sig(2, weight=2.0)))
    user_erase(user_id=1)
    assert CommunityAggregate.objects.get().weight_sum == 2.0
    assert "counterexamples: 0" in verify()


def test_weights_that_cancel_out_pass_whatever_order_the_batches_ran_in(sender, community) -> None:
    join(1, community)
    small, big, minus = ingest(sender, sig(1, weight=0.3), sig(1, weight=1e9), sig(1, weight=-1e9))
    signals_process(signal_ids=[big, minus])
    signals_process(signal_ids=[small])
    assert "counterexamples: 0" in verify()


def test_a_weight_sum_off_by_more_than_rounding_is_still_named(sender, community) -> None:
    join(1, community)
    signals_process(signal_ids=ingest(sender, sig(1, weight=1e9), sig(1, weight=-1e9), sig(1, weight=0.3)))
    CommunityAggregate.objects.update(weight_sum=0.3 + 0.01)
    with pytest.raises(Exception, match="1 counterexample"):
        verify()
