"""Finding /dev/npuN nodes and opening devices."""

from __future__ import annotations

import builtins
import errno
from pathlib import Path
from typing import Any

import pytest

import npu
from npu.core import device as device_mod


@pytest.fixture
def dev_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty stand-in for /dev that glob discovery and index paths use."""
    monkeypatch.setattr(device_mod, "_DEV_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def no_udev(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_mod, "_udev_nodes", lambda: [])


def test_devices_is_empty_when_no_npu_exists(dev_dir: Path, no_udev: None) -> None:
    assert npu.devices() == []


def test_devices_is_empty_without_pyudev_and_without_nodes(
    dev_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_pyudev(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pyudev":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyudev)
    assert npu.devices() == []


def test_devices_falls_back_to_globbing_dev(dev_dir: Path, no_udev: None) -> None:
    for name in ("npu10", "npu2", "npu0", "npux", "null"):
        (dev_dir / name).touch()
    assert npu.devices() == [str(dev_dir / n) for n in ("npu0", "npu2", "npu10")]


def test_devices_prefers_udev_nodes(dev_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (dev_dir / "npu0").touch()
    monkeypatch.setattr(device_mod, "_udev_nodes", lambda: ["/dev/npu3", "/dev/npu1"])
    assert npu.devices() == ["/dev/npu1", "/dev/npu3"]


def test_open_device_without_any_npu_raises_enodev(dev_dir: Path, no_udev: None) -> None:
    with pytest.raises(npu.DeviceNotFoundError) as info:
        npu.open_device(0)
    assert info.value.errno == errno.ENODEV


def test_opening_a_missing_node_raises_enoent_with_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "npu7"
    with pytest.raises(npu.DeviceNotFoundError) as info:
        npu.Device(missing)
    assert info.value.errno == errno.ENOENT
    assert info.value.context == f"open({missing})"


def test_an_index_means_dev_npu_n(dev_dir: Path) -> None:
    assert device_mod.node_path(3) == str(dev_dir / "npu3")


def test_default_device_honours_the_npu_device_variable(
    dev_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = dev_dir / "npu5"
    node.touch()
    monkeypatch.setenv("NPU_DEVICE", "5")
    npu.set_default_device(None)
    try:
        assert npu.default_device().path == str(node)
    finally:
        npu.close_default_device()


def test_default_device_is_opened_once_and_reused(
    dev_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (dev_dir / "npu0").touch()
    monkeypatch.delenv("NPU_DEVICE", raising=False)
    npu.set_default_device(None)
    try:
        assert npu.default_device() is npu.default_device()
    finally:
        npu.close_default_device()


def test_default_device_is_reopened_after_being_closed(
    dev_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (dev_dir / "npu0").touch()
    monkeypatch.delenv("NPU_DEVICE", raising=False)
    npu.set_default_device(None)
    try:
        first = npu.default_device()
        first.close()
        assert npu.default_device() is not first
    finally:
        npu.close_default_device()
