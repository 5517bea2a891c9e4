"""parse_signal_batch: the rules of a signal batch and their error shape (DESIGN.md sections 6 and 7)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signals_app import validation
from signals_app.validation import SignalBatchInvalid, SignalIn, parse_signal_batch
from tests.helpers import examples

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
SKEW = timedelta(minutes=5)
OK = {"user_id": 7, "item_id": 42, "kind": "view"}


def parse(data: Any, *, now: datetime = NOW, max_skew: timedelta = SKEW) -> list[SignalIn]:
    return parse_signal_batch(data, now=now, max_skew=max_skew)


def one(**fields: Any) -> SignalIn:
    (signal,) = parse({"signals": [{**OK, **fields}]})
    return signal


def errors(data: Any, **kwargs: Any) -> Any:
    """The error's detail as plain JSON data."""
    with pytest.raises(SignalBatchInvalid) as exc:
        parse(data, **kwargs)
    return json.loads(json.dumps(exc.value.detail))


REMOVE = object()


def item_errors(index: int = 0, **fields: Any) -> dict[str, list[str]]:
    """The errors of a batch whose item ``index`` is OK updated with ``fields`` (REMOVE drops one)."""
    item = {k: v for k, v in {**OK, **fields}.items() if v is not REMOVE}
    batch = [OK] * index + [item]
    detail = errors({"signals": batch})
    assert list(detail) == ["signals"]
    assert list(detail["signals"]) == [str(index)]
    return detail["signals"][str(index)]


def assert_one_message(errs: dict[str, list[str]], field: str) -> None:
    assert list(errs) == [field], errs
    assert len(errs[field]) == 1 and isinstance(errs[field][0], str) and errs[field][0]


# --- valid batches -----------------------------------------------------------------------


def test_defaults_are_weight_1_now_and_no_key() -> None:
    assert one() == SignalIn(7, 42, "view", 1.0, NOW, None)


def test_all_fields_are_taken() -> None:
    s = one(weight=2.5, occurred_at="2026-03-01T10:00:00Z", idempotency_key="k-1")
    assert s == SignalIn(7, 42, "view", 2.5, datetime(2026, 3, 1, 10, tzinfo=UTC), "k-1")


def test_integer_weight_becomes_a_float() -> None:
    weight = one(weight=3).weight
    assert weight == 3.0 and type(weight) is float


def test_ids_at_the_ends_of_the_range_and_as_digit_strings() -> None:
    assert one(user_id=0, item_id=2**63 - 1)[:2] == (0, 2**63 - 1)
    assert one(user_id="12", item_id="0")[:2] == (12, 0)


def test_negative_and_zero_weight_are_allowed() -> None:
    assert one(weight=-1e9).weight == -1e9
    assert one(weight=0).weight == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01T10:00:00Z", datetime(2026, 3, 1, 10, tzinfo=UTC)),
        ("2026-03-01t10:00:00z", datetime(2026, 3, 1, 10, tzinfo=UTC)),
        ("2026-03-01T12:30:00+02:30", datetime(2026, 3, 1, 10, tzinfo=UTC)),
        ("2026-03-01T05:00:00-05:00", datetime(2026, 3, 1, 10, tzinfo=UTC)),
        ("2026-03-01T10:00:00.5Z", datetime(2026, 3, 1, 10, 0, 0, 500000, tzinfo=UTC)),
        ("2026-03-01T10:00:00.123456Z", datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=UTC)),
        ("2026-03-01T10:00:00.123456789Z", datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=UTC)),
        ("2026-03-01T11:00:00.1+01:00", datetime(2026, 3, 1, 10, 0, 0, 100000, tzinfo=UTC)),
    ],
)
def test_rfc3339_times_become_aware_utc(text: str, expected: datetime) -> None:
    at = one(occurred_at=text).occurred_at
    assert at == expected
    assert at.utcoffset() == timedelta(0)


def test_a_time_within_the_skew_is_accepted() -> None:
    assert one(occurred_at="2026-03-01T12:04:59Z").occurred_at == NOW + timedelta(minutes=4, seconds=59)


def test_1000_signals_are_fine() -> None:
    assert len(parse({"signals": [OK] * 1000})) == 1000


def test_order_of_the_batch_is_kept() -> None:
    signals = parse({"signals": [{**OK, "item_id": i} for i in range(5)]})
    assert [s.item_id for s in signals] == [0, 1, 2, 3, 4]


def test_null_idempotency_key_means_no_key() -> None:
    assert one(idempotency_key=None).idempotency_key is None


def test_128_character_key_is_fine() -> None:
    assert one(idempotency_key="k" * 128).idempotency_key == "k" * 128


# --- the batch ---------------------------------------------------------------------------


@pytest.mark.parametrize("data", [[OK], "signals", 3, None])
def test_batch_must_be_an_object(data: Any) -> None:
    detail = errors(data)
    assert list(detail) == ["non_field_errors"]


def test_unknown_top_level_field_is_named() -> None:
    assert list(errors({"signals": [OK], "extra": 1})) == ["extra"]


def test_signals_is_required() -> None:
    assert list(errors({})) == ["signals"]


@pytest.mark.parametrize("value", [{"0": OK}, "x", None, 5])
def test_signals_must_be_a_list(value: Any) -> None:
    detail = errors({"signals": value})
    assert list(detail) == ["signals"] and isinstance(detail["signals"], list)


def test_empty_list_is_refused() -> None:
    detail = errors({"signals": []})
    assert list(detail) == ["signals"] and isinstance(detail["signals"], list)


def test_1001_signals_are_refused() -> None:
    detail = errors({"signals": [OK] * 1001})
    assert list(detail) == ["signals"] and isinstance(detail["signals"], list)
    assert "1000" in detail["signals"][0]


def test_item_that_is_not_an_object_is_named_by_index() -> None:
    detail = errors({"signals": [OK, [1, 2], OK]})
    assert detail == {"signals": {"1": {"non_field_errors": [detail["signals"]["1"]["non_field_errors"][0]]}}}


def test_every_bad_item_is_named_and_good_ones_are_not() -> None:
    detail = errors({"signals": [OK, {**OK, "kind": "BAD"}, OK, {**OK, "weight": "1"}]})
    assert {i: list(e) for i, e in detail["signals"].items()} == {"1": ["kind"], "3": ["weight"]}


def test_several_bad_fields_of_one_item_are_all_named() -> None:
    errs = item_errors(kind="", weight=None, user_id=-1)
    assert sorted(errs) == ["kind", "user_id", "weight"]


# --- item fields ---------------------------------------------------------------------------


def test_unknown_item_field_is_named() -> None:
    assert_one_message(item_errors(colour="red"), "colour")


@pytest.mark.parametrize("field", ["user_id", "item_id", "kind"])
def test_required_fields(field: str) -> None:
    errs = item_errors(2, **{field: REMOVE})
    assert_one_message(errs, field)
    assert errs[field] == ["This field is required."]


@pytest.mark.parametrize("field", ["user_id", "item_id"])
@pytest.mark.parametrize("value", [True, False, 1.0, 1.5, "1.0", " 1", "", None, {"id": 1}, [1], -1, 2**63, "-1"])
def test_bad_ids(field: str, value: Any) -> None:
    assert_one_message(item_errors(**{field: value}), field)


@pytest.mark.parametrize("value", [True, "1", "1.5", None, {"w": 1}, [1], float("nan"), float("inf"), -float("inf")])
def test_bad_weight_types_and_non_finite(value: Any) -> None:
    assert_one_message(item_errors(weight=value), "weight")


@pytest.mark.parametrize("value", [1e10, -1e10, 1e9 + 1])
def test_weight_beyond_1e9_is_refused(value: float) -> None:
    assert_one_message(item_errors(weight=value), "weight")


def test_weight_integer_too_large_for_a_float_is_refused() -> None:
    # JSON allows integers of any size; json.loads gives a Python int that float() cannot hold.
    assert_one_message(item_errors(weight=10**400), "weight")


@pytest.mark.parametrize("value", ["View", "VIEW", "k" * 33, "", "page-view", "page view", "vïew", 5, None, ["view"]])
def test_bad_kind(value: Any) -> None:
    assert_one_message(item_errors(kind=value), "kind")


def test_kind_of_32_characters_is_fine() -> None:
    assert one(kind="k" * 32).kind == "k" * 32


@pytest.mark.parametrize(
    "value",
    [
        "2026-03-01T10:00:00",  # no offset
        "2026-03-01",  # date only
        "2026-W09-7T10:00:00Z",  # ISO week form
        "2026-02-30T10:00:00Z",  # no such day
        "2026-03-01T25:00:00Z",
        "2026-03-01T10:00:00.1234567890Z",  # 10 fractional digits
        "2026-03-01T10:00:00+0100",  # offset without colon
        "2026-03-01T10:00Z",  # no seconds
        "20260301T100000Z",  # basic form
        1772359200,  # a number
        None,
        "",
    ],
)
def test_bad_occurred_at(value: Any) -> None:
    assert_one_message(item_errors(occurred_at=value), "occurred_at")


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_occurred_at_at_the_ends_of_the_calendar_is_refused_not_a_crash(value: str) -> None:
    assert_one_message(item_errors(occurred_at=value), "occurred_at")


def test_occurred_at_beyond_the_skew_is_refused() -> None:
    errs = item_errors(occurred_at="2026-03-01T12:05:01Z")
    assert_one_message(errs, "occurred_at")
    assert "future" in errs["occurred_at"][0]


def test_skew_is_a_parameter() -> None:
    late = {"signals": [{**OK, "occurred_at": "2026-03-01T13:00:00Z"}]}
    assert list(errors(late)["signals"]["0"]) == ["occurred_at"]
    assert parse(late, max_skew=timedelta(hours=1))[0].occurred_at == NOW + timedelta(hours=1)
    assert list(errors({"signals": [{**OK, "occurred_at": "2026-03-01T12:00:01Z"}]}, max_skew=timedelta(0)))


@pytest.mark.parametrize("value", ["", "k" * 129, 5, True, ["k"], {"k": 1}])
def test_bad_idempotency_key(value: Any) -> None:
    assert_one_message(item_errors(idempotency_key=value), "idempotency_key")


# --- never anything but a list or a SignalBatchInvalid ------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
field_values = st.one_of(
    json_values,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=10**300, max_value=10**400),
    st.sampled_from(["view", "like", "2026-03-01T10:00:00Z", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.text(alphabet="0123456789-:T.Z+ ", max_size=35),
)
signal_items = st.dictionaries(
    st.sampled_from(["user_id", "item_id", "kind", "weight", "occurred_at", "idempotency_key", "other"]),
    field_values,
    max_size=7,
)
batches = st.one_of(
    json_values,
    st.fixed_dictionaries({"signals": st.lists(signal_items | json_values, max_size=5)}),
    st.fixed_dictionaries({"signals": json_values}),
)


@settings(max_examples=examples(400), deadline=None)
@given(batches)
def test_any_json_gives_signals_or_a_validation_error(data: Any) -> None:
    try:
        result = parse(data)
    except SignalBatchInvalid:
        return
    assert isinstance(result, list) and all(isinstance(s, SignalIn) for s in result)


plain_items = st.fixed_dictionaries(
    {
        "user_id": field_values,
        "item_id": field_values,
        "kind": st.sampled_from(["view", "like", "Bad", ""]) | field_values,
    },
    optional={
        "weight": field_values,
        "occurred_at": field_values,
        "idempotency_key": field_values,
        "other": field_values,
    },
)


@settings(max_examples=examples(600), deadline=None)
@given(signal_items | plain_items | json_values)
def test_the_one_pass_check_agrees_with_the_field_by_field_check(item: Any) -> None:
    """The fast path takes only what the thorough check takes, and makes the same signal of it."""
    latest = NOW + SKEW
    plain = validation._plain_signal(item, NOW, latest)
    checked, errs = validation._checked_signal(item, NOW, latest)
    if plain is not None:
        assert plain == checked and not errs


def test_the_one_pass_check_takes_the_common_signal() -> None:
    item = {**OK, "weight": 2, "occurred_at": "2026-03-01T11:59:59.5Z", "idempotency_key": "k"}
    assert validation._plain_signal(item, NOW, NOW + SKEW) == SignalIn(
        7, 42, "view", 2.0, datetime(2026, 3, 1, 11, 59, 59, 500000, tzinfo=UTC), "k"
    )
