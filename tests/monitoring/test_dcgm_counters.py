"""The dcgm-exporter counters file the image installs: what it turns on, and that dcgm-exporter can read it."""

from __future__ import annotations

import pytest

from gpucloud.monitoring import dcgm_fields
from gpucloud.monitoring.dcgm_fields import (
    EXPORTER_METRICS,
    KNOWN_FIELDS,
    REQUIRED_FIELDS,
    counters_csv,
    parse_counters,
    unknown_fields,
)


def test_every_required_field_is_on():
    active = {c.field for c in parse_counters(counters_csv())}
    assert active >= REQUIRED_FIELDS, f"turned off or missing: {sorted(REQUIRED_FIELDS - active)}"


@pytest.mark.parametrize(
    "field",
    [
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ],
)
def test_what_issue_13_asks_for_is_required(field):
    # the fields dcgm-exporter's default file leaves commented out and operators alert on
    assert field in REQUIRED_FIELDS


def test_every_field_is_a_real_dcgm_field_or_an_exporter_metric():
    counters = parse_counters(counters_csv())
    assert unknown_fields(counters) == []
    assert all(c.field in KNOWN_FIELDS or c.field in EXPORTER_METRICS for c in counters)


def test_no_field_is_listed_twice_and_types_suit_the_field():
    counters = parse_counters(counters_csv())
    names = [c.field for c in counters]
    assert len(names) == len(set(names))
    kinds = {c.field: c.prometheus_type for c in counters}
    # running totals are counters (rate() works), levels are gauges, the driver version is a label
    for total in (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ):
        assert kinds[total] == "counter"
    for level in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_DRAM_ACTIVE"):
        assert kinds[level] == "gauge"
    assert kinds["DCGM_FI_DRIVER_VERSION"] == "label"


def test_known_field_ids_are_unique():
    # two names for one id would be an alias we wrote down wrong
    assert len(set(KNOWN_FIELDS.values())) == len(KNOWN_FIELDS)


def test_a_commented_field_is_off():
    text = "# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, off\nDCGM_FI_DEV_GPU_UTIL, gauge, on\n"
    assert [c.field for c in parse_counters(text)] == ["DCGM_FI_DEV_GPU_UTIL"]


def test_a_help_text_with_a_comma_is_a_malformed_row():
    # dcgm-exporter reads the file with Go's encoding/csv: a comma in the help makes a fourth field
    with pytest.raises(ValueError, match="line 2: expected 3 fields"):
        parse_counters("DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_FB_USED, gauge, used, in MiB\n")


def test_an_unknown_type_is_refused():
    with pytest.raises(ValueError, match="line 1: type 'histogram'"):
        parse_counters("DCGM_FI_DEV_GPU_UTIL, histogram, no\n")


def test_a_made_up_field_is_reported():
    assert unknown_fields(parse_counters("DCGM_FI_DEV_GPU_UTILIZATION, gauge, typo\n")) == [
        "DCGM_FI_DEV_GPU_UTILIZATION"
    ]


def test_the_file_ships_as_package_data():
    from importlib import resources

    assert resources.files(dcgm_fields.__package__).joinpath(dcgm_fields.COUNTERS_FILE).is_file()


def test_the_wheel_includes_the_counters_file():
    from pathlib import Path

    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "monitoring/*.csv" in pyproject["tool"]["setuptools"]["package-data"]["gpucloud"]
