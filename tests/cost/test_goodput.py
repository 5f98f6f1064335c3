"""The goodput estimator: the model against hand-computed cases, its edges, monotonicity in the rate,
the per-group inputs it takes from the stack, and `gpucloud estimate` (output and bad flags)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.catalog import load_catalog
from gpucloud.cli import main
from gpucloud.cost.estimate import (
    DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR,
    REPLACEMENT_SECONDS,
    SENSITIVITY_RATES,
    estimate_stack,
)
from gpucloud.cost.goodput import (
    MAX_SAVE_INTERVAL_SECONDS,
    JobModel,
    Rates,
    daly_interval,
    goodput,
    notice_driven,
    periodic_only,
    usd_per_useful_gpu_hour,
)
from gpucloud.errors import UserError
from gpucloud.planning.cluster_plan import plan_cluster
from gpucloud.spec import load_stack_file, stack_file_for


def run_main(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def shipped(name: str):
    catalog = load_catalog()
    return load_stack_file(stack_file_for(name), catalog), catalog


# --- the interval ------------------------------------------------------------------------------


def test_daly_interval_by_hand() -> None:
    # C = 200 s, M = 900 s: C/(2M) = 1/9, sqrt(C/(2M)) = 1/3, sqrt(2CM) = sqrt(360000) = 600
    # T = 600 * (1 + 1/3 * 1/3 + 1/9 * 1/9) - 200 = 600 * 91/81 - 200 = 474.074...
    assert daly_interval(200.0, 900.0) == pytest.approx(600 * 91 / 81 - 200)
    assert daly_interval(200.0, 900.0) == pytest.approx(474.0741, abs=1e-4)


def test_daly_is_young_when_the_save_is_small_and_the_mtbf_when_it_is_not() -> None:
    # C = 1 s, M = 1e8 s: Daly's correction terms vanish, Young's sqrt(2CM) = sqrt(2e8) = 14142.1 s
    assert daly_interval(1.0, 1e8) == pytest.approx(math.sqrt(2e8), rel=1e-3)
    # C >= 2M: Daly says save every M
    assert daly_interval(100.0, 50.0) == 50.0
    assert daly_interval(10.0, math.inf) == math.inf


# --- both strategies, by hand --------------------------------------------------------------------

# A job: 10 s steps, a 450 s save, 300 s restart; 0.75 noticed + 0.25 un-noticed interruptions an hour.
JOB = JobModel(step_seconds=10.0, save_seconds=450.0, save_fits_notice=True, restart_seconds=300.0)
RATES = Rates(noticed_per_hour=0.75, unnoticed_per_hour=0.25)


def test_periodic_only_by_hand() -> None:
    # Every interruption counts: 1/h, M = 3600 s. C/(2M) = 450/7200 = 1/16, sqrt = 1/4;
    # sqrt(2CM) = sqrt(2 * 450 * 3600) = 1800; T = 1800 * (1 + 1/12 + 1/144) - 450 = 1962.5 - 450 = 1512.5 s
    # loss per interruption = T/2 + restart = 756.25 + 300 = 1056.25 s
    # goodput = (1 - 1 * 1056.25 / 3600) * 1512.5 / (1512.5 + 450) = 0.706597 * 0.770701 = 0.544575
    p = periodic_only(JOB, RATES)
    assert p.interval_seconds == pytest.approx(1512.5)
    assert p.noticed_loss_seconds == p.unnoticed_loss_seconds == pytest.approx(1056.25)
    assert p.goodput == pytest.approx(0.544575, abs=1e-6)
    assert not p.fallback and p.note is None


def test_notice_driven_by_hand() -> None:
    # Periodic saves only against the 0.25/h without a notice: M = 14400 s, C/(2M) = 1/64, sqrt = 1/8;
    # sqrt(2 * 450 * 14400) = 3600; T = 3600 * (1 + 1/24 + 1/576) - 450 = 3756.25 - 450 = 3306.25 s (< 1 h)
    # noticed loss = step + save + restart = 10 + 450 + 300 = 760 s; un-noticed = 3306.25/2 + 300 = 1953.125 s
    # lost share = (0.75 * 760 + 0.25 * 1953.125) / 3600 = 1058.28125 / 3600 = 0.293967
    # goodput = 0.706033 * 3306.25 / 3756.25 = 0.706033 * 0.880200 = 0.621450
    n = notice_driven(JOB, RATES)
    assert n.interval_seconds == pytest.approx(3306.25)
    assert n.noticed_loss_seconds == pytest.approx(760.0)
    assert n.unnoticed_loss_seconds == pytest.approx(1953.125)
    assert n.goodput == pytest.approx(0.621450, abs=1e-6)
    assert n.goodput > periodic_only(JOB, RATES).goodput


def test_a_save_that_misses_the_notice_falls_back_to_the_periodic_loss_and_says_so() -> None:
    # Same job, but the save does not commit within the notice: every interruption loses what a
    # periodic-only job loses, at the same interval (1512.5 s) and goodput (0.544575).
    job = JobModel(step_seconds=10.0, save_seconds=450.0, save_fits_notice=False, restart_seconds=300.0)
    n, p = notice_driven(job, RATES), periodic_only(job, RATES)
    assert n.fallback
    assert (n.interval_seconds, n.noticed_loss_seconds, n.goodput) == (
        p.interval_seconds,
        p.noticed_loss_seconds,
        p.goodput,
    )
    assert n.goodput == pytest.approx(0.544575, abs=1e-6)
    assert n.note is not None and "does not fit in the notice" in n.note


def test_rate_zero_leaves_only_the_periodic_save_overhead() -> None:
    # Nothing interrupts: both save every MAX_SAVE_INTERVAL_SECONDS (3600 s) at 60 s a save:
    # goodput = 3600 / (3600 + 60) = 0.983607
    job = JobModel(step_seconds=2.0, save_seconds=60.0, save_fits_notice=True, restart_seconds=600.0)
    for strategy in (periodic_only, notice_driven):
        e = strategy(job, Rates(0.0, 0.0))
        assert e.interval_seconds == MAX_SAVE_INTERVAL_SECONDS == 3600.0
        assert e.goodput == pytest.approx(3600 / 3660)


def test_a_save_happens_at_most_once_a_step() -> None:
    # C = 0.01 s, 1/h: Young's sqrt(2 * 0.01 * 3600) = 8.5 s is shorter than a 30 s step: save every step
    job = JobModel(step_seconds=30.0, save_seconds=0.01, save_fits_notice=True, restart_seconds=0.0)
    assert periodic_only(job, Rates(1.0, 0.0)).interval_seconds == 30.0


def test_no_progress_is_goodput_zero_and_no_price_per_useful_hour() -> None:
    # 10 interruptions an hour, each losing at least the 600 s restart: 10 * 600 / 3600 > 1
    job = JobModel(step_seconds=2.0, save_seconds=60.0, save_fits_notice=True, restart_seconds=600.0)
    for strategy in (periodic_only, notice_driven):
        assert strategy(job, Rates(10.0, 0.0)).goodput == 0.0
    assert usd_per_useful_gpu_hour(100.0, 16, 0.0) is None


def test_cost_per_useful_gpu_hour_by_hand() -> None:
    # $100/h for 16 GPUs at 80% goodput: 100 / (16 * 0.8) = $7.8125 per useful GPU-hour
    assert usd_per_useful_gpu_hour(100.0, 16, 0.8) == pytest.approx(7.8125)
    assert usd_per_useful_gpu_hour(None, 16, 0.8) is None  # a price the catalog does not know
    # goodput itself: interval 900, save 100, one 0.5/h interruption losing 720 s:
    # (1 - 0.5 * 720 / 3600) * 900 / 1000 = 0.9 * 0.9 = 0.81
    assert goodput(900.0, 100.0, [(0.5, 720.0)]) == pytest.approx(0.81)


positive = st.floats(min_value=1e-3, max_value=1e5, allow_nan=False, allow_infinity=False)
rate = st.floats(min_value=0.0, max_value=50.0, allow_nan=False, allow_infinity=False)


@fuzz_settings()
@given(
    step=positive,
    save=positive,
    restart=st.floats(min_value=0.0, max_value=1e5),
    fits=st.booleans(),
    unnoticed=st.floats(min_value=0.0, max_value=1.0),
    r1=rate,
    r2=rate,
)
def test_fuzz_goodput_never_rises_as_the_rate_rises(
    step: float, save: float, restart: float, fits: bool, unnoticed: float, r1: float, r2: float
) -> None:
    low, high = sorted((r1, r2))
    job = JobModel(step_seconds=step, save_seconds=save, save_fits_notice=fits, restart_seconds=restart)
    for strategy in (periodic_only, notice_driven):
        at_low, at_high = strategy(job, Rates(low, unnoticed)), strategy(job, Rates(high, unnoticed))
        assert 0.0 <= at_high.goodput <= at_low.goodput + 1e-12 <= 1.0 + 1e-12


# --- per node group, from the stack ----------------------------------------------------------------


def test_p5_capacity_block_group_by_hand() -> None:
    spec, catalog = shipped("p5-capacity-block")
    (g,) = estimate_stack(spec, catalog, model_gib=500, step_seconds=2)
    # 2 x p5.48xlarge, S3 (the fastest durable tier): each node 100 Gbps = 12.5 GB/s x 0.5 line efficiency,
    # staged on 8 NVMe drives x 2 GB/s: cluster 1 / (1/32 + 1/12.5) = 8.98876 GB/s
    # 500 GiB = 536.870912 GB -> 59.727 s + 1 s detect + 1 s commit = 61.727 s (FSx: 4.6875 TiB x 500 MB/s is slower)
    assert (g.nodes, g.gpus, g.save.tier) == (2, 16, "s3")
    assert g.save.seconds == pytest.approx(61.7269, abs=1e-3) and g.save.fits
    # restart = 600 s replacement + the restore read back at the same 8.98876 GB/s = 659.727 s
    assert g.restart_seconds == pytest.approx(REPLACEMENT_SECONDS + 59.7269, abs=1e-3)
    # a capacity block is not reclaimed: 0 with a notice; hardware 2 nodes x 419 / (54 d x 24 h x 2048 nodes)
    assert g.rates.noticed_per_hour == 0.0
    assert g.rates.unnoticed_per_hour == pytest.approx(2 * 419 / (54 * 24 * 2048))
    # the price is plan's, for the group at maxNodes; cost per useful GPU-hour = price / (16 x goodput)
    assert g.usd_per_hour == plan_cluster(spec, catalog).cost.groups[0].as_configured.max
    assert g.usd_per_hour is not None
    for s in (g.periodic, g.notice):
        assert s.usd_per_useful_gpu_hour(g.usd_per_hour, g.gpus) == pytest.approx(g.usd_per_hour / (16 * s.goodput))
    # the sensitivity rows: 0, 0.05, 0.1, 0.25, 0.5, 1 (the group's own 0 already among them)
    assert [r.interruptions_per_hour for r in g.sensitivity] == list(SENSITIVITY_RATES)


def test_spot_group_defaults_to_the_documented_rate_and_a_given_rate_wins() -> None:
    spec, catalog = shipped("p4d-spot")
    (default,) = estimate_stack(spec, catalog, model_gib=500, step_seconds=2)
    assert default.rates.noticed_per_hour == DEFAULT_SPOT_INTERRUPTIONS_PER_HOUR == pytest.approx(1 / 6)
    assert "assumption" in default.rate_source
    (given_,) = estimate_stack(spec, catalog, model_gib=500, step_seconds=2, interruptions_per_hour=0.2)
    assert given_.rates.noticed_per_hour == 0.2 and given_.rate_source == "given"
    rates = [r.interruptions_per_hour for r in given_.sensitivity]
    assert rates == [0.0, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0]
    for strategy in ("periodic", "notice"):  # the table's rows never gain goodput as the rate rises
        values = [getattr(r, strategy).goodput for r in given_.sensitivity]
        assert values == sorted(values, reverse=True)
    assert given_.notice.goodput > given_.periodic.goodput  # the notice pays off on spot
    # priced as plan prices the group as configured (1 on-demand base node + 3 spot), below all on-demand
    cost = plan_cluster(spec, catalog).cost.groups[0]
    assert cost.on_demand.max is not None
    assert given_.usd_per_hour == cost.as_configured.max and given_.usd_per_hour < cost.on_demand.max


def test_a_checkpoint_too_big_for_the_notice_gives_the_notice_no_advantage() -> None:
    spec, catalog = shipped("p5-capacity-block")
    # 5000 GiB = 5368.7 GB at 8.98876 GB/s = 597 s + 2 s: far over the 115 s budget
    (g,) = estimate_stack(spec, catalog, model_gib=5000, step_seconds=2, interruptions_per_hour=0.5)
    assert not g.save.fits
    assert g.notice.fallback and g.notice.goodput == g.periodic.goodput


def test_restart_seconds_given_replaces_the_estimate() -> None:
    spec, catalog = shipped("dev")
    (g,) = estimate_stack(spec, catalog, model_gib=16, step_seconds=1, restart_seconds=120)
    assert (g.restart_seconds, g.restart_source) == (120, "given")


def test_estimate_stack_refuses_bad_numbers() -> None:
    spec, catalog = shipped("dev")
    with pytest.raises(UserError, match=r"--step-seconds must be a finite number > 0"):
        estimate_stack(spec, catalog, model_gib=16, step_seconds=float("nan"))


# --- the command --------------------------------------------------------------------------------


def test_estimate_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--stack", "p4d-spot", "--model-gib", "500", "--step-seconds", "2"]
    assert run_main([*argv, "--interruptions-per-hour", "0.2", "--output", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["stack"], data["model_gib"], data["step_seconds"]) == ("p4d-spot", 500, 2)
    (g,) = data["groups"]
    assert (g["node_group"], g["capacity"], g["nodes"], g["gpus"]) == ("a100", "spot", 4, 32)
    assert g["interruptions_per_hour"] == 0.2 and g["interruptions_source"] == "given"
    assert set(g["strategies"]) == {"periodic", "notice"}
    notice = g["strategies"]["notice"]
    assert {"goodput", "usd_per_useful_gpu_hour", "save_interval_seconds", "note"} <= set(notice)
    assert notice["goodput"] > g["strategies"]["periodic"]["goodput"]
    assert [row["interruptions_per_hour"] for row in g["sensitivity"]] == [0.0, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0]


def test_estimate_table_names_the_strategies_and_the_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--stack", "p5-capacity-block", "--model-gib", "5000", "--step-seconds", "2"]
    assert run_main(argv) == 0
    out = capsys.readouterr().out
    assert "Node group h100: 2 x p5.48xlarge (16 GPUs, capacity-block)" in out
    assert "periodic: checkpoints at the Young/Daly interval only; notice: gpucloud's notice-driven save" in out
    assert "does NOT fit" in out
    assert "note (notice): the emergency save does not fit in the notice" in out
    assert "sensitivity to the interruption rate" in out


def test_estimate_stack_file_takes_its_name_from_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "Pulumi.mine.yaml"
    path.write_text(stack_file_for("dev").read_text(encoding="utf-8"), encoding="utf-8")
    argv = ["estimate", "--stack-file", str(path), "--model-gib", "16", "--step-seconds", "1", "-o", "json"]
    assert run_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["stack"] == "mine"


def flags(gib: str = "16", step: str = "1", *extra: str, stack: str = "dev") -> list[str]:
    return ["estimate", "--stack", stack, "--model-gib", gib, "--step-seconds", step, *extra]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (flags(step="-1"), "--step-seconds must be a finite number > 0 (seconds one training step takes), got -1.0"),
        (flags(step="0"), "--step-seconds must be a finite number > 0"),
        (flags(step="nan"), "--step-seconds must be a finite number > 0"),
        (flags(step="inf"), "--step-seconds must be a finite number > 0"),
        (flags(gib="0"), "--model-gib must be a finite number > 0"),
        (flags(gib="-3"), "--model-gib must be a finite number > 0"),
        (flags("16", "1", "--interruptions-per-hour", "-0.1"), "--interruptions-per-hour must be a finite number >= 0"),
        (flags("16", "1", "--interruptions-per-hour", "nan"), "--interruptions-per-hour must be a finite number >= 0"),
        (flags("16", "1", "--restart-seconds", "-1"), "--restart-seconds must be a finite number >= 0"),
        (flags(stack="nope"), "no stack named 'nope'"),
        (["estimate", "--model-gib", "16", "--step-seconds", "1"], "give exactly one of --stack NAME or --stack-file"),
        (flags(step="abc"), "'abc' is not a valid float"),
        (["estimate", "--stack", "dev", "--step-seconds", "1"], "Missing option '--model-gib'"),
    ],
)
def test_bad_flags_are_one_line_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("gpucloud: error: ") and message in err, err


def test_the_estimate_imports_neither_pulumi_nor_torch() -> None:
    """It is pure planning: it must run without the deploy extra (no Pulumi) and without torch."""
    script = (
        "import sys\n"
        "from gpucloud.cli import main\n"
        "try:\n"
        "    main(['estimate', '--stack', 'p4d-spot', '--model-gib', '500', '--step-seconds', '2', '-o', 'json'])\n"
        "except SystemExit as done:\n"
        "    assert not done.code, done.code\n"
        "heavy = [m for m in ('pulumi', 'pulumi_aws', 'torch', 'boto3') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["groups"][0]["node_group"] == "a100"


def test_help_teaches_and_the_command_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(["estimate", "--help"]) == 0
    text = capsys.readouterr().out
    for expected in ("Young/Daly", "notice-driven save", "--interruptions-per-hour", "Examples:", "docs/cost.md"):
        assert expected in text
    assert run_main(["--help"]) == 0
    assert "estimate" in capsys.readouterr().out
