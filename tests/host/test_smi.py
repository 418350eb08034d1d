"""npu-smi: the device table, the processes from fdinfo, utilisation, --json, top.

Each test lays out a fake /sys and /proc (smi_fake.FakeTree) and runs the
tool on it through ``--root`` or the library functions.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from npu.smi import cli
from npu.smi.fdinfo import parse_value, processes
from npu.smi.sysfs import Sample, find_devices, utilisation
from smi_fake import FakeTree


@pytest.fixture
def tree(tmp_path: Path) -> FakeTree:
    t = FakeTree(tmp_path)
    t.add_device(0, "0000:00:03.0")
    return t


def run(tree: FakeTree, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = cli.main([*args, "--root", str(tree.root)], out=out)
    return rc, out.getvalue()


def run_json(tree: FakeTree, *args: str) -> dict:  # type: ignore[type-arg]
    rc, text = run(tree, *args, "--json")
    assert rc == 0, text
    doc: dict = json.loads(text)  # type: ignore[type-arg]
    return doc


# --------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------


def test_a_device_is_found_by_its_npu_attribute_group(tree: FakeTree) -> None:
    (found,) = find_devices(tree.roots)
    assert (found.index, found.pci_address, found.node) == (0, "0000:00:03.0", "/dev/accel/accel0")


def test_an_accel_device_of_another_driver_is_not_an_npu(tree: FakeTree) -> None:
    other = tree.roots.sys / "devices" / "pci0000:00" / "0000:00:05.0"
    other.mkdir(parents=True)
    (tree.roots.accel_class / "accel1").mkdir()
    (tree.roots.accel_class / "accel1" / "device").symlink_to(other)
    assert [d.index for d in find_devices(tree.roots)] == [0]


def test_the_device_table_shows_each_field(tree: FakeTree) -> None:
    rc, text = run(tree)
    assert rc == 0
    header, row = text.splitlines()[2:4]
    for column in ("NPU", "PCI address", "HW", "FW", "Driver", "Memory used/total", "Util",
                   "Power", "Hangs", "Resets"):  # fmt: skip
        assert column in header
    cells = row.split()
    assert cells[:5] == ["0", "0000:00:03.0", "1.0", "1.0", "1.4"]
    assert "16.0MiB / 256MiB" in row
    assert cells[-3:] == ["active", "2", "3"]  # power, hangs, resets


def test_the_json_device_has_every_documented_key(tree: FakeTree) -> None:
    doc = run_json(tree)
    assert set(doc) == {"schema", "timestamp", "devices", "processes"}
    assert doc["schema"] == 1
    (dev,) = doc["devices"]
    assert set(dev) == {
        "index", "node", "pci_address", "hw_version", "fw_version", "driver_version",
        "abi_version", "num_queues", "num_cores", "memory", "utilization_percent", "busy_us",
        "device_time_us", "power_state", "hangs", "resets", "op_errors", "irq_count",
    }  # fmt: skip
    assert dev["memory"] == {
        "device_used_bytes": 16 << 20,
        "device_total_bytes": 256 << 20,
        "bo_bytes": 3 << 20,
        "bo_count": 4,
    }
    assert (dev["index"], dev["pci_address"], dev["power_state"]) == (0, "0000:00:03.0", "active")
    assert (dev["hangs"], dev["resets"], dev["driver_version"]) == (2, 3, "1.4")


def test_the_json_process_has_every_documented_key(tree: FakeTree) -> None:
    tree.add_fd(100, 3, client_id=7, engine_ns=5000, host_kib=8, device_kib=4)
    (proc,) = run_json(tree)["processes"]
    assert proc == {
        "pid": 100,
        "name": "python3",
        "device": 0,
        "pci_address": "0000:00:03.0",
        "client_ids": [7],
        "fds": [3],
        "memory_host_bytes": 8 << 10,
        "memory_device_bytes": 4 << 10,
        "memory_bytes": 12 << 10,
        "engine_ns": 5000,
    }


def test_an_attribute_the_driver_lacks_is_null(tree: FakeTree) -> None:
    (tree.pci[0] / "npu" / "busy_us").unlink()
    (dev,) = run_json(tree)["devices"]
    assert dev["busy_us"] is None and dev["utilization_percent"] is None


def test_power_state_comes_from_runtime_pm(tree: FakeTree) -> None:
    tree.set_power(0, "suspended")
    assert run_json(tree)["devices"][0]["power_state"] == "suspended"


def test_i_selects_one_device(tree: FakeTree) -> None:
    tree.add_device(1, "0000:00:04.0")
    assert [d["index"] for d in run_json(tree)["devices"]] == [0, 1]
    assert [d["pci_address"] for d in run_json(tree, "-i", "1")["devices"]] == ["0000:00:04.0"]


def test_i_of_a_missing_device_is_an_error_with_exit_2(
    tree: FakeTree, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _ = run(tree, "-i", "4")
    assert rc == 2
    assert "no NPU with index 4 (devices: 0)" in capsys.readouterr().err


def test_no_device_is_a_clear_error_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["--root", str(FakeTree(tmp_path).root)], out=io.StringIO())
    err = capsys.readouterr().err
    assert rc == 2
    assert "no NPU found" in err and "driver loaded" in err and "Traceback" not in err


# --------------------------------------------------------------------------
# Utilisation
# --------------------------------------------------------------------------


def test_utilisation_is_busy_time_over_device_time_between_two_samples() -> None:
    a = Sample(busy_us=1_000, device_time_us=100_000, monotonic_s=1.0)
    b = Sample(busy_us=26_000, device_time_us=200_000, monotonic_s=1.1)
    assert utilisation(a, b) == pytest.approx(25.0)


def test_utilisation_is_clamped_to_100_percent() -> None:
    # Concurrent groups overlap: busy time can exceed the elapsed time.
    a = Sample(busy_us=0, device_time_us=0, monotonic_s=1.0)
    b = Sample(busy_us=300, device_time_us=100, monotonic_s=1.1)
    assert utilisation(a, b) == 100.0


def test_utilisation_uses_the_host_clock_when_the_device_clock_restarted() -> None:
    a = Sample(busy_us=0, device_time_us=900_000, monotonic_s=1.0)
    b = Sample(busy_us=50_000, device_time_us=1_000, monotonic_s=1.1)  # a resume reset it
    assert utilisation(a, b) == pytest.approx(50.0)


def test_utilisation_without_busy_us_is_unknown() -> None:
    a = Sample(busy_us=None, device_time_us=0, monotonic_s=1.0)
    assert utilisation(a, a) is None


def test_the_table_shows_utilisation_between_its_two_samples(
    tree: FakeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The single-shot run samples twice SAMPLE_S apart: advance the counters in between.
    def later(_: float) -> None:
        tree.set_attr(0, "busy_us", 1000 + 40_000)
        tree.set_attr(0, "device_time_us", 50_000 + 100_000)

    monkeypatch.setattr(cli.time, "sleep", later)
    assert run_json(tree)["devices"][0]["utilization_percent"] == 40.0


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------


def test_fdinfo_values_are_read_with_their_units() -> None:
    assert parse_value("12 KiB") == 12 << 10
    assert parse_value("3 MiB") == 3 << 20
    assert parse_value("4096") == 4096
    assert parse_value("5000 ns") == 5000
    assert parse_value("x") is None


def test_two_files_of_one_process_are_one_row(tree: FakeTree) -> None:
    tree.add_fd(100, 3, client_id=7, engine_ns=1000, host_kib=8, device_kib=0)
    tree.add_fd(100, 5, client_id=8, engine_ns=2000, host_kib=4, device_kib=16)
    (p,) = processes(tree.roots, {"0000:00:03.0": 0})
    assert (p.pid, p.client_ids, p.fds) == (100, (7, 8), (3, 5))
    assert (p.memory_host, p.memory_device, p.engine_ns) == (12 << 10, 16 << 10, 3000)


def test_a_duplicated_descriptor_of_one_file_counts_once(tree: FakeTree) -> None:
    tree.add_fd(100, 3, client_id=7, engine_ns=1000, host_kib=8)
    tree.add_fd(100, 9, client_id=7, engine_ns=1000, host_kib=8)  # dup(3)
    (p,) = processes(tree.roots, {"0000:00:03.0": 0})
    assert (p.client_ids, p.fds, p.memory_host, p.engine_ns) == ((7,), (3, 9), 8 << 10, 1000)


def test_processes_are_named_from_comm_and_split_by_pid(tree: FakeTree) -> None:
    tree.add_fd(100, 3, client_id=7, comm="infer")
    tree.add_fd(200, 4, client_id=9, comm="trainer")
    tree.add_other_fd(200, 1)
    rows = processes(tree.roots, {"0000:00:03.0": 0})
    assert [(p.pid, p.name, p.device) for p in rows] == [(100, "infer", 0), (200, "trainer", 0)]


def test_another_drivers_drm_file_is_not_a_process_of_the_npu(tree: FakeTree) -> None:
    tree.add_fd(300, 3, client_id=1, driver="i915")
    assert processes(tree.roots, {"0000:00:03.0": 0}) == []


def test_a_process_row_goes_to_the_device_of_its_pci_address(tree: FakeTree) -> None:
    tree.add_device(1, "0000:00:04.0")
    tree.add_fd(100, 3, client_id=7, address="0000:00:04.0")
    doc = run_json(tree)
    assert [(p["pid"], p["device"]) for p in doc["processes"]] == [(100, 1)]
    assert run_json(tree, "-i", "0")["processes"] == []


def test_the_table_lists_the_processes(tree: FakeTree) -> None:
    tree.add_fd(100, 3, client_id=7, engine_ns=12_300_000, host_kib=2048, comm="infer")
    rc, text = run(tree)
    assert rc == 0
    row = text.splitlines()[-1].split()
    assert row == ["0", "100", "infer", "1", "2.0MiB", "0B", "12.3ms"]


def test_no_process_says_so(tree: FakeTree) -> None:
    assert "No running processes found" in run(tree)[1]


# --------------------------------------------------------------------------
# -l and top
# --------------------------------------------------------------------------


def test_loop_refreshes_count_times_one_json_document_a_line(tree: FakeTree) -> None:
    rc, text = run(tree, "-l", "0.01", "-c", "3", "--json")
    assert rc == 0
    docs = [json.loads(line) for line in text.splitlines()]
    assert len(docs) == 3 and all(d["devices"][0]["index"] == 0 for d in docs)


def test_top_once_draws_one_frame_without_escape_codes_off_a_terminal(tree: FakeTree) -> None:
    tree.add_fd(100, 3, client_id=7, comm="infer")
    rc, text = run(tree, "top", "--once", "-d", "0.01")
    assert rc == 0
    assert text.count("npu-smi top") == 1 and "\x1b" not in text
    assert "NPU 0 [" in text and "infer" in text and "Engine" in text


def test_top_iterations_draws_that_many_frames(tree: FakeTree) -> None:
    rc, text = run(tree, "top", "--iterations", "2", "-d", "0.01")
    assert rc == 0 and text.count("npu-smi top") == 2


def test_the_engine_share_in_top_is_the_engine_time_between_frames(
    tree: FakeTree,
) -> None:
    from npu.smi.monitor import Monitor

    tree.add_fd(100, 3, client_id=7, engine_ns=0)
    m = Monitor(tree.roots)
    m.prime()
    tree.add_fd(100, 4, client_id=8, engine_ns=10**12)  # far beyond the elapsed time
    snap = m.refresh()
    assert snap.engine_percent[(100, 0)] == 100.0


def test_npu_smi_is_installed_as_a_console_script_of_the_runtime() -> None:
    import tomllib

    project = Path(__file__).resolve().parents[2] / "runtime_py" / "pyproject.toml"
    scripts = tomllib.loads(project.read_text())["project"]["scripts"]
    assert scripts["npu-smi"] == "npu.smi.cli:main"
    assert callable(cli.main)
