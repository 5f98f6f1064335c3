"""The hub: one deduplicated stream from IMDS, OS signals and publish()."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gpucloud.errors import UserError
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.signals.events import Notice, event_id_for
from gpucloud.signals.hub import SignalHub


def queue_notice(payload: dict) -> Notice:
    return Notice(
        kind="spot-interruption",
        source="queue",
        deadline=time.time() + 120,
        received_at=time.time(),
        event_id=event_id_for("spot-interruption", payload),
        action="terminate",
        payload=payload,
    )


def test_publish_deduplicates_by_event_id():
    hub = SignalHub()
    first = queue_notice({"id": "evt-1"})
    assert hub.publish(first) is True
    assert hub.publish(queue_notice({"id": "evt-1"})) is False
    assert hub.publish(queue_notice({"id": "evt-2"})) is True
    assert hub.get(timeout=0) == first
    assert hub.get(timeout=0).payload == {"id": "evt-2"}
    assert hub.get(timeout=0.05) is None


def test_imds_and_queue_sources_share_one_stream():
    with ImdsEmulator() as emu:
        hub = SignalHub()
        hub.add_imds(emu.endpoint, interval=0.05)
        with hub:
            emu.spot_interruption(with_rebalance=True)
            got = [hub.get(timeout=5), hub.get(timeout=5)]
            assert sorted(n.kind for n in got) == ["rebalance", "spot-interruption"]
            spot = next(n for n in got if n.kind == "spot-interruption")
            # The same notice arriving by another path (e.g. queue mode) is a duplicate.
            assert hub.publish(spot) is False
            assert hub.get(timeout=0.2) is None
        assert not hub.pollers[0].running


def test_bad_imds_endpoint_is_a_user_error():
    with pytest.raises(UserError, match="--imds-endpoint 'localhost' is not an http"):
        SignalHub().add_imds("localhost")


def test_os_signals_need_the_main_thread_and_a_sane_grace():
    import threading

    hub = SignalHub()
    with pytest.raises(ValueError, match="grace"):
        hub.add_os_signals(-1)
    errors: list[BaseException] = []

    def off_the_main_thread() -> None:
        try:
            hub.add_os_signals(5)
        except RuntimeError as err:
            errors.append(err)

    thread = threading.Thread(target=off_the_main_thread)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])


HUB_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from gpucloud.signals.hub import SignalHub
    hub = SignalHub()
    hub.add_os_signals(grace=float(sys.argv[1]))
    hub.start()
    print("ready", flush=True)
    for _ in range(2):
        notice = hub.get(timeout=20)
        print(json.dumps(notice.to_json() if notice else None), flush=True)
    hub.stop()
    """
)


def test_sigterm_to_a_process_using_the_hub_is_a_notice_with_deadline_now_plus_grace():
    proc = subprocess.Popen([sys.executable, "-c", HUB_SCRIPT, "45"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)  # a repeated SIGTERM is the same notice
        first = json.loads(proc.stdout.readline())
        proc.send_signal(signal.SIGINT)  # a different signal is a new one
        second = json.loads(proc.stdout.readline())
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert first["kind"] == "sigterm" and first["action"] == "SIGTERM" and first["source"] == "signal"
    assert first["deadline"] - first["received_at"] == pytest.approx(45)
    assert abs(first["received_at"] - sent) < 5
    assert second["kind"] == "sigterm" and second["action"] == "SIGINT"
