"""A fixture sysfs tree with the EFA devices of a p5.48xlarge (32) or a p4d.24xlarge (4), shaped the way
node_exporter's infiniband collector reads ``/sys/class/infiniband`` (``--path.sysfs``).

What the collector reads (prometheus/procfs ``sysfs/class_infiniband.go``; node_exporter 1.5 vendors
procfs 0.8): per device ``fw_ver``, ``board_id`` and ``hca_type`` (procfs 0.8 fails the whole collector
when one is missing; later releases skip the last two); per port ``ports/<n>/state``, ``phys_state``,
``rate`` and the ``counters/`` directory (the PMA counters, required to exist); ``hw_counters/`` only
for ``mlx5_*``/``irdma*`` devices in later releases.

What an EFA device has (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-working-monitor.html):
its traffic and error counts in ``ports/1/hw_counters/`` (tx_bytes, rx_bytes, rx_drops, retrans_*,
...), and no PMA port counters: the ``counters`` files of an EFA port give no value, so node_exporter
exports the device's info, state and rate, never ``node_infiniband_port_data_*`` (the gap
node_exporter PR #3670 describes). ``pma_counters=True`` writes IB-style PMA counters anyway, for a
benchmark of the collector's cost with every series present.
"""

from __future__ import annotations

from pathlib import Path

# The counters the EFA driver publishes per port (the AWS page above, "Available EFA driver metrics").
EFA_HW_COUNTERS = (
    "lifespan",
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)
# The IB PMA port counters (Documentation/ABI/stable/sysfs-class-infiniband), for pma_counters=True.
PMA_COUNTERS = (
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "VL15_dropped",
)
EFA_DEVICES = {"p5.48xlarge": 32, "p4d.24xlarge": 4}


def efa_device_names(count: int) -> list[str]:
    """``rdmap<bus>s<slot>``, the names the EFA driver's devices get from their PCI address."""
    return [f"rdmap{16 + 16 * (i // 4) + i % 4}s{27 if count <= 4 else 0}" for i in range(count)]


def write_efa_sysfs(root: Path, devices: int, *, pma_counters: bool = False) -> list[str]:
    """Write ``root/class/infiniband/<device>/...`` for ``devices`` EFA devices; returns their names.
    ``root`` is what node_exporter's ``--path.sysfs`` gets."""
    names = efa_device_names(devices)
    for n, name in enumerate(names):
        device = root / "class" / "infiniband" / name
        port = device / "ports" / "1"
        (port / "hw_counters").mkdir(parents=True)
        (port / "counters").mkdir()
        _write(device / "fw_ver", "0.0.0.0")
        _write(device / "board_id", "efa")
        _write(device / "hca_type", "efa")
        _write(device / "node_type", "6: usNIC UDP")
        _write(port / "state", "4: ACTIVE")
        _write(port / "phys_state", "5: LinkUp")
        _write(port / "rate", "100 Gb/sec (4X EDR)")
        for i, counter in enumerate(EFA_HW_COUNTERS):
            _write(port / "hw_counters" / counter, str(12 if counter == "lifespan" else (n + 1) * 1000003 * i))
        if pma_counters:
            for i, counter in enumerate(PMA_COUNTERS):
                _write(port / "counters" / counter, str((n + 1) * 7919 * i))
    return names


def _write(path: Path, text: str) -> None:
    path.write_text(text + "\n")
