"""The PyTorch-familiar surface of npu.Tensor (CPU backend): printing, basic
indexing, in-place operators, powers, devices by name, dtypes by name, and
out-of-memory as a MemoryError."""

from __future__ import annotations

import errno

import numpy as np
import pytest

import npu

A = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.fixture
def t(default_device: npu.Device) -> npu.Tensor:
    return npu.tensor(A)


# -- printing ----------------------------------------------------------------


def test_repr_shows_the_values_and_the_device_like_pytorch(t: npu.Tensor) -> None:
    assert repr(t) == (
        "tensor([[ 0.,  1.,  2.,  3.],\n"
        "        [ 4.,  5.,  6.,  7.],\n"
        "        [ 8.,  9., 10., 11.]], device='cpu')"
    )
    assert str(t) == repr(t)


def test_repr_names_a_dtype_other_than_float32(default_device: npu.Device) -> None:
    assert (
        repr(npu.tensor([1, 2], dtype=npu.int8)) == "tensor([1, 2], device='cpu', dtype=npu.int8)"
    )
    assert "dtype=npu.bfloat16" in repr(npu.tensor([1.5], dtype=npu.bfloat16))


def test_repr_summarises_a_large_tensor(default_device: npu.Device) -> None:
    text = repr(npu.tensor(np.arange(5000, dtype=np.float32)))
    assert "..." in text and len(text) < 200


def test_repr_of_an_empty_tensor_gives_its_size(default_device: npu.Device) -> None:
    assert repr(npu.tensor(np.zeros((0, 3), np.float32))) == "tensor([], size=(0, 3), device='cpu')"


def test_repr_during_a_capture_does_not_wait(t: npu.Tensor) -> None:
    g = npu.Graph()
    with g.capture():
        y = t + 1
        assert repr(y) == "tensor(<captured>, shape=(3, 4), device='cpu')"


# -- indexing ----------------------------------------------------------------


def test_an_integer_index_is_a_view_of_one_row(t: npu.Tensor) -> None:
    row = t[1]
    assert row.shape == (4,) and row.buffer is t.buffer
    np.testing.assert_array_equal(row.numpy(), A[1])
    assert t[-1, -2].item() == A[-1, -2]


@pytest.mark.parametrize(
    "key",
    [
        (slice(None), slice(1, 3)),
        (slice(None, None, 2),),
        (Ellipsis, 1),
        (None, 1),
        (1, None, slice(None, None, 3)),
        (slice(5, 9),),
    ],
    ids=["cols", "step", "ellipsis", "newaxis", "mixed", "empty"],
)
def test_basic_indexing_matches_numpy(t: npu.Tensor, key: tuple[object, ...]) -> None:
    got, want = t[key], A[key]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (3, "out of bounds"),
        ((0, 0, 0), "too many indices"),
        (slice(None, None, -1), "step must be positive"),
        ([0, 1], "advanced indexing"),
        ((Ellipsis, Ellipsis), "single ellipsis"),
    ],
)
def test_bad_indices_raise_index_error(t: npu.Tensor, key: object, error: str) -> None:
    with pytest.raises(IndexError, match=error):
        t[key]


def test_setitem_writes_through_a_view(t: npu.Tensor) -> None:
    want = A.copy()
    t[0] = 100
    want[0] = 100
    t[:, 1] = npu.tensor(np.array([7, 8, 9], np.float32))  # a strided view: a host write
    want[:, 1] = [7, 8, 9]
    t[2, 1:3] = npu.tensor(np.array([-1, -2], np.float32))  # contiguous: a device copy
    want[2, 1:3] = [-1, -2]
    np.testing.assert_array_equal(t.numpy(), want)


# -- operators ---------------------------------------------------------------


def test_in_place_operators_write_into_the_tensor_and_its_views(t: npu.Tensor) -> None:
    view = t[1:]
    t += 1
    t *= 2
    t -= 3
    t /= 4
    want = ((A + 1) * 2 - 3) / 4
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(view.numpy(), want[1:], rtol=1e-6)


@pytest.mark.parametrize("p", [0, 1, 2, 3, 0.5, -1, 1.7])
def test_powers_match_numpy(default_device: npu.Device, p: float) -> None:
    x = np.linspace(0.5, 4, 8, dtype=np.float32)
    np.testing.assert_allclose((npu.tensor(x) ** p).numpy(), x**p, rtol=1e-5)


def test_a_tensor_exponent_and_a_scalar_base(default_device: npu.Device) -> None:
    x = np.linspace(0.5, 2, 4, dtype=np.float32)
    np.testing.assert_allclose((2.0 ** npu.tensor(x)).numpy(), 2.0**x, rtol=1e-5)


def test_abs_numel_and_dim(t: npu.Tensor) -> None:
    np.testing.assert_array_equal(abs(t - 5).numpy(), np.abs(A - 5))
    assert (t.numel(), t.dim()) == (12, 2)


# -- devices and dtypes by name ------------------------------------------------


def test_device_accepts_cpu_and_returns_one_shared_device(no_default_device: None) -> None:
    a = npu.tensor([1.0], device="cpu")
    b = npu.tensor([2.0], device="cpu")
    assert a.device is b.device and a.device.name == "cpu"


def test_a_device_index_that_does_not_exist_is_device_not_found(no_default_device: None) -> None:
    with pytest.raises(npu.DeviceNotFoundError):
        npu.tensor([1.0], device="npu:97")
    with pytest.raises(npu.DeviceNotFoundError):
        npu.tensor([1.0], device=97)


def test_to_a_device_copies_and_to_the_same_device_is_free(t: npu.Tensor) -> None:
    assert t.to(t.device) is t and t.cpu() is t
    with npu.Device("cpu") as other:
        moved = t.to(other, npu.float16)
        assert moved.device is other and moved.dtype == npu.float16
        np.testing.assert_array_equal(moved.numpy(), A.astype(np.float16))
        again = npu.tensor(moved, device=t.device)
        assert again.device is t.device


def test_the_dtype_names_are_numpy_dtypes(t: npu.Tensor) -> None:
    assert t.dtype == npu.float32 == np.float32
    assert npu.tensor([1], dtype=npu.int32).dtype == np.dtype(np.int32)
    assert t.to(npu.int8).dtype == npu.int8


# -- out of memory --------------------------------------------------------------


def test_out_of_memory_is_both_an_npu_error_and_a_memory_error(
    device: npu.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_memory(size: int, flags: int) -> object:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(device.backend, "bo_create", no_memory)
    with pytest.raises(MemoryError) as info:
        device.alloc(4096)
    assert isinstance(info.value, npu.NpuOutOfMemoryError)
    assert isinstance(info.value, npu.NpuError)
    assert info.value.errno == errno.ENOMEM and "BO_CREATE" in info.value.context


def test_npu_power_takes_a_scalar_base_as_numpy_power_does(t: npu.Tensor) -> None:
    np.testing.assert_allclose(npu.power(2.0, t).numpy(), np.power(2.0, A), rtol=1e-5)


# -- operators: registered by the op modules ---------------------------------


def test_every_operator_the_tensor_calls_is_registered_by_an_op_module() -> None:
    import ast
    import inspect

    from npu.tensors import tensor as tensor_module

    called = {
        node.slice.value
        for node in ast.walk(ast.parse(inspect.getsource(tensor_module)))
        if isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "OPERATORS"
        and isinstance(node.slice, ast.Constant)
    }
    assert called, "the scan found no operator call"
    assert called <= set(tensor_module.OPERATORS), called - set(tensor_module.OPERATORS)
    for name in called:
        fn = tensor_module.OPERATORS[name]
        assert (fn.__module__.startswith("npu.tensors."), fn.__name__) == (True, name)


# -- views: view() and as_strided() ------------------------------------------


def test_view_gives_a_contiguous_tensor_another_shape_sharing_memory(t: npu.Tensor) -> None:
    v = t.view(2, 6)
    assert v.shape == (2, 6) and v.buffer is t.buffer
    np.testing.assert_array_equal(v.numpy(), A.reshape(2, 6))


def test_view_of_a_transposed_tensor_is_a_value_error(t: npu.Tensor) -> None:
    with pytest.raises(ValueError, match="not contiguous"):
        t.T.view(12)


def test_as_strided_makes_a_broadcast_view_with_stride_zero(t: npu.Tensor) -> None:
    row = t.as_strided((3, 4), (0, 1))
    np.testing.assert_array_equal(row.numpy(), np.broadcast_to(A[0], (3, 4)))


def test_as_strided_past_the_end_of_the_buffer_is_a_value_error(t: npu.Tensor) -> None:
    room = t.buffer.size // 4  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="reaches element"):
        t.as_strided((2,), (room,))


@pytest.mark.parametrize(
    ("size", "stride"), [((2, 2), (1,)), ((2,), (-1,)), ((-1,), (1,)), ((1, 1, 1, 1, 2), (0,) * 5)]
)
def test_as_strided_with_a_bad_size_or_stride_is_a_value_error(
    t: npu.Tensor, size: tuple[int, ...], stride: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError):
        t.as_strided(size, stride)
