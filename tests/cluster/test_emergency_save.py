"""The emergency-save model: notice -> durable commit at cluster sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.cluster import emergency_save as es
from gpucloud.jobs.supervisor import SupervisorConfig

P4D = es.Node("p4d.24xlarge", nvme_drives=8)
P4D_SPOT_FSX = es.FsxTier(size_gib=2400, throughput_per_tib=250)


def test_budget_is_the_notice_lead_minus_the_supervisors_stop_margin() -> None:
    assert SupervisorConfig().stop_margin == es.STOP_MARGIN_SECONDS
    assert es.budget_seconds() == 120.0 - SupervisorConfig().stop_margin


def test_p4d_spot_fsx_gives_about_0_6_gb_per_second_for_the_whole_cluster() -> None:
    rate = P4D_SPOT_FSX.cluster_bytes_per_second(P4D, 4)
    assert rate == pytest.approx(2400 / 1024 * 250e6)  # 2.34 TiB x 250 MB/s/TiB = 0.59 GB/s
    # the file system's throughput is shared: more nodes do not make it faster
    assert P4D_SPOT_FSX.cluster_bytes_per_second(P4D, 40) == rate


def test_13b_adamw_state_through_p4d_spot_fsx_takes_about_350_s_and_does_not_fit() -> None:
    e = es.estimate(208 * es.GB, 4, P4D, P4D_SPOT_FSX)
    assert 340 < e.seconds < 370
    assert not e.fits
    assert e.durable and e.tier == "fsx"


def test_s3_scales_with_the_number_of_nodes() -> None:
    one = es.estimate(208 * es.GB, 1, P4D, es.S3Tier())
    four = es.estimate(208 * es.GB, 4, P4D, es.S3Tier())
    assert four.bytes_per_second == pytest.approx(4 * one.bytes_per_second)
    assert four.seconds < one.seconds
    assert four.max_bytes == pytest.approx(4 * one.max_bytes, rel=1e-9)


def test_small_instance_s3_rate_is_its_own_line_rate_share_after_the_nvme_staging() -> None:
    g6 = es.Node("g6.xlarge", nvme_drives=1)
    e = es.estimate(70 * es.GB, 2, g6, es.S3Tier())
    upload = 2 * 2.5e9 / 8 * es.S3_LINE_EFFICIENCY
    staging = 2 * es.NVME_GBPS_PER_DRIVE * es.GB
    assert e.bytes_per_second == pytest.approx(1 / (1 / upload + 1 / staging))
    assert not e.fits


def test_without_nvme_the_s3_save_is_staged_on_the_gp3_root_volume_and_slow() -> None:
    with_nvme = es.estimate(208 * es.GB, 4, P4D, es.S3Tier())
    without = es.estimate(208 * es.GB, 4, es.Node("p4d.24xlarge", nvme_drives=0), es.S3Tier())
    assert with_nvme.fits and not without.fits
    assert without.bytes_per_second < 4 * es.ROOT_GP3_BYTES_PER_SECOND


def test_nvme_is_fast_but_not_durable_and_never_chosen_as_the_durable_copy() -> None:
    estimates = [es.estimate(208 * es.GB, 4, P4D, t) for t in es.cluster_tiers(P4D_SPOT_FSX, P4D)]
    assert [e.tier for e in estimates] == ["fsx", "s3", "nvme"]
    nvme = estimates[-1]
    assert not nvme.durable and nvme.seconds < estimates[0].seconds
    best = es.fastest_durable(estimates)
    assert best is not None and best.tier == "s3"


def test_fastest_durable_tier_is_chosen_by_rate_even_for_an_empty_state() -> None:
    estimates = [es.estimate(0, 4, P4D, t) for t in es.cluster_tiers(P4D_SPOT_FSX, P4D)]
    best = es.fastest_durable(estimates)
    assert best is not None and best.tier == "s3"


def test_no_nvme_drives_means_no_nvme_tier() -> None:
    assert [t.name for t in es.cluster_tiers(None, es.Node("g6.xlarge"))] == ["s3"]


def test_max_bytes_is_what_commits_exactly_at_the_budget() -> None:
    e = es.estimate(0, 4, P4D, P4D_SPOT_FSX)
    at_max = es.estimate(e.max_bytes, 4, P4D, P4D_SPOT_FSX)
    assert at_max.fits
    assert at_max.seconds == pytest.approx(e.budget_seconds, abs=1e-6)
    assert not es.estimate(e.max_bytes + 10**9, 4, P4D, P4D_SPOT_FSX).fits


def test_a_larger_stop_margin_shrinks_the_largest_checkpoint() -> None:
    default = es.estimate(0, 4, P4D, P4D_SPOT_FSX)
    wider = es.estimate(0, 4, P4D, P4D_SPOT_FSX, stop_margin=30.0)
    assert wider.max_bytes < default.max_bytes
    assert wider.budget_seconds == 90.0


def test_unknown_instance_type_gets_the_small_default_rate() -> None:
    assert es.Node("x9.metal").ip_bytes_per_second == es.UNKNOWN_IP_CARD_GBPS * es.GB / 8


@pytest.mark.parametrize(("state", "nodes"), [(-1, 1), (1, 0)])
def test_nonsense_inputs_are_refused(state: int, nodes: int) -> None:
    with pytest.raises(ValueError):
        es.estimate(state, nodes, P4D, es.S3Tier())


def test_measured_rate_estimate() -> None:
    assert es.estimate_seconds_at_rate(10 * es.GB, 1 * es.GB) == pytest.approx(
        es.DETECT_SECONDS + 10 + es.COMMIT_SECONDS
    )
    assert es.estimate_seconds_at_rate(1, 0) == float("inf")


@fuzz_settings(200)
@given(
    state=st.integers(min_value=0, max_value=10**15),
    nodes=st.integers(min_value=1, max_value=5000),
    size_steps=st.integers(min_value=1, max_value=100),
    per_tib=st.sampled_from([125, 250, 500, 1000]),
    itype=st.sampled_from(sorted(es.IP_CARD_GBPS)),
)
def test_fuzz_fits_exactly_when_state_is_at_most_max_bytes(state, nodes, size_steps, per_tib, itype) -> None:
    node = es.Node(itype, nvme_drives=8)
    for tier in (es.FsxTier(2400 * size_steps, per_tib), es.S3Tier(), es.NvmeTier()):
        e = es.estimate(state, nodes, node, tier)
        assert e.seconds >= es.DETECT_SECONDS + es.COMMIT_SECONDS
        if state <= e.max_bytes:
            assert e.fits
        if state > e.max_bytes + 1:
            assert not e.fits
