"""The selector reader the end-to-end test judges expressions with: it finds every metric an
expression reads, and nothing that is a function, keyword, label or number."""

from __future__ import annotations

import pytest

from .promql import Selector, metric_names, selectors


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (instance_id) (rate(DCGM_FI_DEV_POWER_VIOLATION{job="dcgm-exporter"}[5m])) > 1e9',
            {"DCGM_FI_DEV_POWER_VIOLATION"},
        ),
        (
            'max by (instance_id, gpu, xid) (DCGM_EXP_XID_ERRORS_COUNT{xid=~"48|63"}) > 0\n'
            "  and on(instance_id) group_left(node_group) max by (instance_id) (gpucloud_attempt_running) == 1",
            {"DCGM_EXP_XID_ERRORS_COUNT", "gpucloud_attempt_running"},
        ),
        (
            "changes(gpucloud_training_step[10m]) == 0 unless ignoring(kind) up offset 1h30m",
            {"gpucloud_training_step", "up"},
        ),
        (
            "histogram_quantile(0.9, sum without(gpu) (rate(gpucloud_step_seconds_bucket[1m:15s])))",
            {"gpucloud_step_seconds_bucket"},
        ),
        ('{__name__="up", job="x"} * 100 - 0.5', {"up"}),
        ('label_replace(a, "dst", "$1", "src", "(.*)") / count(b) + bottomk(3, c)', {"a", "b", "c"}),
        (
            "avg(DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)) * 100",
            {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"},
        ),
        ("vector(1) and 0x1F > bool 3", set()),
    ],
)
def test_metric_names_are_the_selectors_names(expr, names):
    assert metric_names(expr) == names


def test_matchers_are_read_with_their_operators_and_escaped_quotes():
    assert selectors('gpucloud_notices_total{kind!="rebalance", job=~"a\\"b",}') == [
        Selector("gpucloud_notices_total", (("kind", "!=", "rebalance"), ("job", "=~", 'a\\"b')))
    ]


def test_an_unreadable_matcher_is_refused():
    with pytest.raises(ValueError, match="cannot read the label matchers"):
        selectors("up{job=x}")
