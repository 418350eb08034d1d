"""The PyTorch front end in the guest (issue 17, item 4): torch.compile(backend="npu")
against eager torch on the CPU, torch nodes the NPU lacks, weights uploaded once,
replays, and npu.from_torch / Tensor.to_torch sharing memory. Debian 13's torch."""

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import npu  # noqa: E402
import npu.dynamo  # noqa: E402  (registers the "npu" backend)


class SmallCnn(torch.nn.Module):
    """conv-bn-relu, max pool, a strided conv, a residual add of a slice, global pool, fc."""

    def __init__(self, odd_op=None):
        super().__init__()
        self.odd_op = odd_op
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(8, 5)
        with torch.no_grad():  # batchnorm statistics that do something
            self.b1.weight.uniform_(0.5, 1.5)
            self.b1.bias.uniform_(-0.2, 0.2)
            self.b1.running_mean.uniform_(-0.2, 0.2)
            self.b1.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.nn.functional.max_pool2d(y, 2)
        z = self.c2(y)
        if self.odd_op is not None:
            z = self.odd_op(z)
        y = z + y[:, :, ::2, ::2]
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return torch.softmax(self.fc(y), -1)


def _model(seed, odd_op=None):
    torch.manual_seed(seed)
    return SmallCnn(odd_op).eval()


def _last_graph():
    return npu.dynamo.compiled_graphs()[-1]


def test_a_compiled_cnn_runs_wholly_on_the_npu_and_matches_eager_torch():
    m = _model(0)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        got = torch.compile(m, backend="npu")(x)
        want = m(x)
    g = _last_graph()
    assert g.cpu_nodes == {} and len(g.npu_nodes) >= 10
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_an_op_without_an_npu_lowering_runs_in_torch_with_one_note(caplog):
    m = _model(1, odd_op=torch.sin)
    x = torch.randn(2, 3, 16, 16)
    with caplog.at_level(logging.INFO, logger="npu.dynamo.compiler"), torch.no_grad():
        f = torch.compile(m, backend="npu")
        got = [f(x) for _ in range(3)]
        want = m(x)
    notes = [r.getMessage() for r in caplog.records if "runs on the CPU" in r.getMessage()]
    assert len(notes) == 1 and "aten.sin" in notes[0], notes
    assert list(_last_graph().cpu_nodes) == ["sin"]
    assert _last_graph().num_graphs == 2  # NPU before the sin, NPU after it
    for y in got:
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)


def test_replays_upload_the_weights_once_and_see_in_place_updates():
    m = _model(2)
    f = torch.compile(m, backend="npu")
    with torch.no_grad():
        f(torch.randn(1, 3, 16, 16))
        g = _last_graph()
        first = g.uploads
        for _ in range(3):
            x = torch.randn(1, 3, 16, 16)
            torch.testing.assert_close(f(x), m(x), rtol=1e-5, atol=1e-6)
        assert g.uploads == first + 3  # only the input each time
        m.fc.weight.mul_(-2.0)  # an in-place update bumps the tensor's version
        x = torch.randn(1, 3, 16, 16)
        torch.testing.assert_close(f(x), m(x), rtol=1e-5, atol=1e-6)
    assert g.uploads == first + 5  # the input and the changed weight


def test_outputs_are_fresh_tensors_not_views_of_the_graph():
    m = _model(3)
    f = torch.compile(m, backend="npu")
    with torch.no_grad():
        a = f(torch.randn(1, 3, 16, 16))
        keep = a.clone()
        f(torch.randn(1, 3, 16, 16))
    torch.testing.assert_close(a, keep, rtol=0, atol=0)


def test_from_torch_shares_the_tensors_memory():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    x = npu.from_torch(t)
    t[0, 0] = 100.0
    assert x.numpy()[0, 0] == 100.0
    y = npu.from_torch(t.double())  # float64: copied as float32
    assert y.dtype == np.float32 and np.array_equal(y.numpy(), t.numpy())


def test_to_torch_is_a_view_of_the_device_tensor():
    x = npu.tensor(np.ones((2, 3), np.float32)) * 3.0
    t = x.to_torch()
    assert t.dtype == torch.float32 and t.tolist() == [[3.0] * 3] * 2
    t[1, 2] = -1.0
    assert x.numpy()[1, 2] == -1.0
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        npu.from_torch(np.ones(3))


def test_the_backend_leaves_onnxruntime_unimported_so_onnx_reference_still_loads():
    import subprocess
    import sys

    code = (
        "import torch, npu.dynamo, sys\n"
        "m = torch.nn.Linear(4, 2).eval()\n"
        "with torch.no_grad(): torch.compile(m, backend='npu')(torch.ones(1, 4))\n"
        "assert 'onnxruntime' not in sys.modules, 'onnxruntime was imported'\n"
        "import onnx.reference\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
