"""Property-based: any value of any configuration field ends in a configuration or in one line naming the field,
never in a traceback: from load_config, and from app.py's main as the CDK CLI runs it."""

import contextlib
import functools
import io
import math
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, find, given, settings
from hypothesis import strategies as st

import app
from config import ConfigError, load_config
from config.environment import _TYPES, FIELD_NAMES
from config.regions import REGION_ZONES
from tests.synthesis import CDK_JSON_CONTEXT

# What cdk.json (JSON) and `-c FIELD=VALUE` (strings) can hold.
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40)
)
JSON_VALUES = st.one_of(
    JSON_SCALARS, st.lists(JSON_SCALARS, max_size=4), st.dictionaries(st.text(max_size=5), JSON_SCALARS, max_size=2)
)
NUMERIC_TEXT = st.one_of(
    st.text(alphabet=st.characters(categories=["Nd", "No", "Pd", "Po", "Zs"]), min_size=1, max_size=12),
    st.sampled_from(
        [
            "inf",
            "-inf",
            "nan",
            "NaN",
            "Infinity",
            "1e309",
            "-1e309",
            "1_000",
            "0x10",
            "１２",
            "٣",
            "1e3",
            "2.5",
            " 7 ",
            "+8",
            "-0",
            "9" * 40,
        ]
    ),
)


def _outcome(field: str, value: object) -> str | None:
    """None when the configuration loads; otherwise its one-line refusal. Any other exception fails the test."""
    try:
        load_config({**CDK_JSON_CONTEXT, field: value})
    except ConfigError as error:
        return str(error)
    return None


def _assert_one_line_naming(message: str, field: str) -> None:
    assert "\n" not in message and "\r" not in message, message
    assert field in message, message


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELD_NAMES), value=JSON_VALUES)
def test_any_value_of_any_field_loads_or_is_refused_in_one_line(field, value):
    message = _outcome(field, value)
    if message is not None:
        _assert_one_line_naming(message, field)


@pytest.mark.parametrize("field", FIELD_NAMES)
def test_every_field_refuses_some_value_in_one_line_naming_it(field):
    # The property above holds as well for a loader that accepts everything: here each field must refuse a value.
    refused = find(JSON_VALUES, lambda value: _outcome(field, value) is not None, settings=settings(database=None))
    _assert_one_line_naming(str(_outcome(field, refused)), field)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from([f for f in FIELD_NAMES if _TYPES[f] in (int, float)]), text=NUMERIC_TEXT)
def test_numbers_are_ascii_digits_and_finite(field, text):
    message = _outcome(field, text)
    stripped = text.strip()
    if not stripped.isascii() or "_" in stripped or stripped.lower().lstrip("+-") in ("inf", "nan", "infinity"):
        assert message is not None, f"{field}={text!r} was accepted"
        _assert_one_line_naming(message, field)
    if message is None:  # accepted: a finite number written in ASCII
        value = getattr(load_config({**CDK_JSON_CONTEXT, field: text}), field)
        assert math.isfinite(value) and stripped.isascii()


@settings(max_examples=200, deadline=None)
@given(region=st.text(max_size=20), zone=st.text(max_size=3))
def test_regions_and_zones_come_from_the_shipped_list_and_agree(region, zone):
    message = _outcome("region", region)
    if region.strip() not in REGION_ZONES:
        assert message is not None and "region" in message
    config_or_error = _outcome("availability_zone", "us-east-1" + zone)  # dev is us-east-1
    if zone.strip() and not (len(zone.strip()) == 1 and zone.strip() in REGION_ZONES["us-east-1"]):
        assert config_or_error is not None and "availability_zone" in config_or_error


@pytest.mark.parametrize(
    "field, values",
    [
        ("alert_emails", ["ops@example.com", "ops@example.com"]),
        ("eks_admin_role_arns", ["arn:aws:iam::123456789012:role/Admin"] * 2),
    ],
)
def test_list_fields_refuse_duplicates(field, values):
    message = _outcome(field, values)
    assert message is not None and field in message and "each once" in message


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("alert_emails", ["opš@example.com"], "alert_emails='opš@example.com'"),
        ("alert_emails", "ops@example.com\n", None),  # a trailing newline is stripped, not smuggled in
        ("image_tag", "v1\u00e9", "image_tag='v1é'"),
        ("image_tag", "x" * 129, "image_tag="),
        ("eks_admin_role_arns", ["arn:aws:iam::123456789012:role/Ädmin"], "eks_admin_role_arns="),
        ("account", "１２３４５６７８９０１２", "account="),
        ("region", "us-east-9", "region='us-east-9'"),
        ("availability_zone", "us-east-1z", "availability_zone='us-east-1z'"),
        ("fsx_storage_gib", "240000", "fsx_storage_gib=240000"),
        ("budget_monthly_usd", "1e12", "budget_monthly_usd="),
        ("nodes", "٣", "nodes='٣'"),
        ("budget_monthly_usd", "inf", "budget_monthly_usd='inf'"),
        ("budget_monthly_usd", "1e309", "budget_monthly_usd='1e309'"),
    ],
)
def test_service_limits_and_patterns(field, value, words):
    message = _outcome(field, value)
    if words is None:
        assert message is None, message
    else:
        assert message is not None and words in message and "\n" not in message, message


# ---- through app.py's main: what a user running `cdk synth -c FIELD=VALUE` sees ----------------------------------
# In-process: main() with the context the CDK CLI would hand it (through jsii and back, as the CLI's context does).
# The process itself (exit status, stderr, the context read from CDK_CONTEXT_JSON) is test_config.py's
# test_app_exits_non_zero_with_one_line_and_no_traceback.


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELD_NAMES), value=st.one_of(st.text(min_size=1, max_size=20), NUMERIC_TEXT))
def test_app_prints_the_same_one_line_and_no_traceback(field, value):
    expected = _outcome(field, value)
    assume(expected is not None)  # a valid value would synthesize the whole app
    printed, build = io.StringIO(), functools.partial(app.build_app, context={**CDK_JSON_CONTEXT, field: value})
    with mock.patch.object(app, "build_app", build), contextlib.redirect_stderr(printed):
        code = app.main()
    assert code == 2
    assert [line for line in printed.getvalue().splitlines() if line.strip()] == [f"error: {expected}"]
