"""Run the onnx package's backend test data through an inference engine.

Usage (in the guest, where ``npu`` and the data are, or on the host with
``--device cpu``: the runtime's CPU backend)::

    python3 tests/conformance/onnx_suite.py DATA_DIR --out results.json \
        [--engine npu|cpu|ort] [--device cpu] [--where all|host|guest] \
        [--kinds node,simple,...] [--only SUBSTRING]

DATA_DIR is ``onnx/backend/test/data`` of the same onnx version as the
guest's (the suite's expected outputs are onnx's reference results). Each
case directory holds ``model.onnx`` and ``test_data_set_N/`` with
``input_i.pb`` and ``output_i.pb`` (a light model is ``light/light_NAME.onnx``
with ``light_NAME_output_0.pb``, its input onnx's dummy ``arange(n) / n``);
each case is run once per data set and
compared as onnx's own runner does (``assert_allclose`` with the case's
``rtol``/``atol`` from ``data.json``, default 1e-3/1e-7; equal dtypes;
exact equality for non-numeric outputs; sequences element by element).

Every case gets one verdict:

- ``pass``: every output of every data set within tolerance;
- ``wrong``: the engine ran and returned a wrong value, shape or dtype;
- ``unsupported``: the engine refused the model when loading it with its
  documented error (``npu.ModelError``; onnxruntime's load errors);
- ``error``: anything else (an exception while running, a time-out);
- ``nondeterministic``: the model draws random numbers (Bernoulli,
  RandomNormal, ...), so its stored outputs are one draw of onnx's
  generator that no other engine reproduces: the outputs were checked for
  shape, dtype and values inside the distribution's support (Bernoulli: 0
  or 1) instead; a failure there is ``wrong``.

For the runtime's engines the result also says where the model's nodes
ran (after the session's rewrites; folded constants are gone): ``nodes``
in all, ``npu_nodes`` on the NPU, ``numpy_nodes`` on the CPU provider's
numpy kernels and ``reference_nodes`` on its ``onnx.reference`` fallback
(the library that also computed the expected outputs). A case refused at
load has no counts. The JSON written is
``{"meta": {...}, "cases": {"node/test_abs": {"verdict": ..., ...}}}``.

``--where`` picks the cases by the placement the committed list
(``--expected``, tests/conformance/expected.json) records: ``host`` the
cases with no NPU node (run on the host with ``--device cpu``), ``guest``
the others, cases the list does not have and the :data:`GUEST_ONLY` ones;
``all`` every case.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "light")
CASE_TIMEOUT_S = 120
EXPECTED = Path(__file__).resolve().parent / "expected.json"

#: Cases that stay in the guest whatever their placement, by name prefix: why.
GUEST_ONLY = {
    "node/test_regex_full_match_": "onnx.reference's RegexFullMatch imports re2: "
    "the guest's Python has it, the host venv does not",
}


def load_expected(path: Path = EXPECTED) -> dict[str, dict[str, Any]]:
    """The committed list: case name -> ``{"verdict", "npu", "numpy", "reference"}``.

    An entry of the older form (a bare verdict) has no placement.
    """
    cases = json.loads(path.read_text())["cases"]
    return {k: v if isinstance(v, dict) else {"verdict": v} for k, v in cases.items()}


def runs_on_host(name: str, entry: Mapping[str, Any] | None) -> bool:
    """Whether a case belongs to the host run: its listed placement has no
    NPU node (a case not listed, or without a placement, runs in the guest)."""
    if entry is None or entry.get("npu") != 0:
        return False
    return not any(name.startswith(prefix) for prefix in GUEST_ONLY)


class CaseTimeout(Exception):
    """A case ran longer than CASE_TIMEOUT_S."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout(f"timed out after {CASE_TIMEOUT_S} s")


def load_value(path: Path, type_proto: onnx.TypeProto) -> Any:
    """One input or output file, as the type in the model says."""
    data = path.read_bytes()
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if kind == "optional_type":
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    if kind == "map_type":
        mp = onnx.MapProto()
        mp.ParseFromString(data)
        return numpy_helper.to_dict(mp)
    t = onnx.TensorProto()
    t.ParseFromString(data)
    return numpy_helper.to_array(t)


def compare(want: Any, got: Any, rtol: float, atol: float, where: str) -> str | None:
    """None when ``got`` matches ``want`` as onnx's runner checks it, else why not."""
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{where}: a sequence expected, got {type(got).__name__}"
        if len(got) != len(want):
            return f"{where}: {len(got)} elements, expected {len(want)}"
        for j, (w, g) in enumerate(zip(want, got, strict=True)):
            why = compare(w, g, rtol, atol, f"{where}[{j}]")
            if why:
                return why
        return None
    if want is None:
        return None if got is None else f"{where}: None expected, got {type(got).__name__}"
    if isinstance(want, dict):
        return None if want == got else f"{where}: maps differ"
    want = np.asarray(want)
    if got is None:
        return f"{where}: no value"
    got = np.asarray(got)
    if not np.issubdtype(want.dtype, np.number) and want.dtype != np.bool_:
        if want.tolist() != got.tolist():
            return f"{where}: values differ"
        return None
    if want.dtype.fields is not None or got.dtype.fields is not None:
        # bfloat16, float8, int4 (onnx.reference's dtypes; numpy_helper gives
        # bfloat16 as uint16): the same bits.
        if want.dtype.names and got.dtype.names and want.dtype.names != got.dtype.names:
            return f"{where}: dtype {got.dtype.names}, expected {want.dtype.names}"
        if got.dtype.itemsize != want.dtype.itemsize or got.shape != want.shape:
            return f"{where}: {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
        base = np.dtype(f"u{want.dtype.itemsize}")
        if not np.array_equal(got.view(base), want.view(base)):
            return f"{where}: bits differ"
        return None
    if got.dtype != want.dtype:
        return f"{where}: dtype {got.dtype}, expected {want.dtype}"
    if got.shape != want.shape:
        return f"{where}: shape {got.shape}, expected {want.shape}"
    try:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    except AssertionError as exc:
        lines = [ln for ln in str(exc).splitlines() if ln.strip()][:4]
        return f"{where}: " + " | ".join(ln.strip() for ln in lines)
    return None


class Engine:
    """One way of running a model: the NPU runtime (both providers or CPU only) or ORT."""

    def __init__(self, name: str, device: str | None = None) -> None:
        self.name = name
        self.device = device
        if name in ("npu", "cpu"):
            import npu
            from npu.inference.cpu import numpy_kernel_ok

            self.npu = npu
            self.numpy_kernel_ok = numpy_kernel_ok
            self.load_errors: tuple[type[BaseException], ...] = (npu.ModelError,)
        else:
            import onnxruntime as ort
            from onnxruntime.capi import onnxruntime_pybind11_state as st

            self.ort = ort
            self.load_errors = (st.Fail, st.InvalidGraph, st.NotImplemented, st.InvalidArgument)

    def load(self, path: Path) -> Any:
        if self.name == "npu":
            return self.npu.InferenceSession(str(path), device=self.device)
        if self.name == "cpu":
            return self.npu.InferenceSession(str(path), providers=["CPU"])
        opts = self.ort.SessionOptions()
        opts.intra_op_num_threads = 1
        return self.ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def placement(self, sess: Any, model: onnx.ModelProto) -> dict[str, int]:
        if self.name == "ort":
            return {"nodes": len(model.graph.node)}
        # The nodes that run, after the session's rewrites (folded constants
        # are gone), and where each ran. A CPU node runs a numpy kernel when
        # the CPU provider has one that covers it, else onnx.reference: the
        # test cpu_kernel makes (npu.inference.cpu).
        placement = sess.placement
        graph = sess.graph
        cpu = [n for n in graph.nodes if placement.get(n.name) == "CPU"]
        numpy_nodes = sum(1 for n in cpu if self.numpy_kernel_ok(n, graph))
        return {
            "nodes": len(placement),
            "npu_nodes": sum(1 for p in placement.values() if p == "NPU"),
            "numpy_nodes": numpy_nodes,
            "reference_nodes": len(cpu) - numpy_nodes,
        }

    def describe(self) -> dict[str, Any]:
        """The device the NPU engine ran on: its name and capability bits."""
        if self.name != "npu":
            return {}
        from npu.core.device import resolve_device

        dev = resolve_device(self.device)
        return {"device": dev.name, "caps": hex(int(dev.info.caps))}


#: onnx's tolerances for its light models (backend/test/case/model/__init__.py).
LIGHT_RTOL = {"densenet121": 2e-3}


def light_cases(kind_dir: Path) -> list[Path]:
    """The light models: real architectures whose weights are ConstantOfShape nodes."""
    return sorted(kind_dir.glob("light_*.onnx"))


def light_inputs(model: onnx.ModelProto) -> dict[str, Any]:
    """onnx's input for a light model: arange(n) / n in the input's shape (the runner's dummy)."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


DataSet = tuple[str, dict[str, Any], list[Path | None]]


def light_data(path: Path, model: onnx.ModelProto) -> list[DataSet]:
    """A light model's one data set: onnx's dummy input and its stored output."""
    outs = [path.with_name(f"{path.stem}_output_{j}.pb") for j in range(len(model.graph.output))]
    return [("dummy input", light_inputs(model), [f if f.exists() else None for f in outs])]


def case_data(case: Path, model: onnx.ModelProto) -> list[DataSet]:
    """A case directory's data sets: (name, feeds, output files)."""
    init_names = {t.name for t in model.graph.initializer}
    feedable = {i.name for i in model.graph.input if i.name not in init_names}
    sets = []
    for ds in sorted(case.glob("test_data_set_*")):
        feeds = {}
        for i, vi in enumerate(model.graph.input):
            f = ds / f"input_{i}.pb"
            # Inputs a data set leaves out are optional ones.
            if f.exists() and vi.name in feedable:
                feeds[vi.name] = load_value(f, vi.type)
        outs = [ds / f"output_{j}.pb" for j in range(len(model.graph.output))]
        sets.append((ds.name, feeds, [f if f.exists() else None for f in outs]))
    return sets


#: Ops whose outputs are random draws (the case is judged by compare_draw).
RANDOM_OPS = frozenset(
    {"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform",
     "RandomUniformLike"}
)  # fmt: skip


def _random_ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node if n.op_type in RANDOM_OPS}


def compare_draw(want: Any, got: Any, ops: set[str], where: str) -> str | None:
    """A random output against the stored draw: same shape and dtype, values in the support."""
    if not isinstance(got, np.ndarray) or not isinstance(want, np.ndarray):
        return f"{where}: got {type(got).__name__}, expected an array"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{where}: {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if ops == {"Bernoulli"} and not np.isin(got, (0, 1)).all():
        return f"{where}: Bernoulli values other than 0 and 1"
    if not np.isfinite(got.astype(np.float64)).all():
        return f"{where}: non-finite random values"
    return None


def check(
    sess: Any, model: onnx.ModelProto, sets: list[DataSet], rtol: float, atol: float
) -> dict[str, Any]:
    """Run every data set; the verdict (pass, wrong, error or nondeterministic) and why."""
    random_ops = _random_ops(model)
    try:
        for ds_name, feeds, outs in sets:
            got = sess.run(None, feeds)
            for j, (vo, f) in enumerate(zip(model.graph.output, outs, strict=True)):
                if f is None:
                    continue
                want = load_value(f, vo.type)
                g = got[j] if j < len(got) else None
                if random_ops:
                    why = compare_draw(want, g, random_ops, vo.name)
                else:
                    why = compare(want, g, rtol, atol, vo.name)
                if why:
                    return {"verdict": "wrong", "why": f"{ds_name}: {why}"[:400]}
    except CaseTimeout as exc:
        return {"verdict": "error", "why": str(exc)}
    except Exception as exc:  # every failure is a verdict
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        return {"verdict": "error", "why": f"{type(exc).__name__}: {_first_line(exc)}{where}"}
    if random_ops:
        ops = ", ".join(sorted(random_ops))
        return {"verdict": "nondeterministic", "why": f"{ops}: shape, dtype and support checked"}
    return {"verdict": "pass"}


def run_case(engine: Engine, case: Path) -> dict[str, Any]:
    """One case (a case directory, or a light model's .onnx file), judged."""
    light = case.suffix == ".onnx"
    model_path = case if light else case / "model.onnx"
    model = onnx.load(str(model_path))
    rtol, atol = 1e-3, 1e-7
    if light:
        rtol = LIGHT_RTOL.get(case.stem.removeprefix("light_"), rtol)
    elif (case / "data.json").exists():
        data = json.loads((case / "data.json").read_text())
        rtol, atol = data.get("rtol", rtol), data.get("atol", atol)
    sets = light_data(case, model) if light else case_data(case, model)
    try:
        sess = engine.load(model_path)
    except engine.load_errors as exc:
        return {"verdict": "unsupported", "why": _first_line(exc)}
    try:
        res = check(sess, model, sets, rtol, atol)
        # Where the nodes ran, after the runs (a partition the NPU could
        # not plan moved to the CPU during the first).
        res.update(engine.placement(sess, model))
    finally:
        close = getattr(sess, "close", None)
        if close is not None:
            close()
    return res


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--engine", choices=("npu", "cpu", "ort"), default="npu")
    ap.add_argument(
        "--device", default=None, help="the npu engine's device (default: npu's default; cpu)"
    )
    ap.add_argument("--where", choices=("all", "host", "guest"), default="all")
    ap.add_argument("--expected", type=Path, default=EXPECTED, help="the list --where reads")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--only", default="", help="run only cases whose name contains this")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    engine = Engine(args.engine, args.device)
    expected = load_expected(args.expected) if args.where != "all" else {}
    signal.signal(signal.SIGALRM, _on_alarm)
    cases: dict[str, Any] = {}
    t0 = time.monotonic()
    for kind in args.kinds.split(","):
        kind_dir = args.data_dir / kind
        if kind == "light":
            found = light_cases(kind_dir)
        else:
            found = sorted(p for p in kind_dir.iterdir() if (p / "model.onnx").exists())
        for case in found:
            name = f"{kind}/{case.stem if kind == 'light' else case.name}"
            if args.only and args.only not in name:
                continue
            if args.where != "all" and runs_on_host(name, expected.get(name)) != (
                args.where == "host"
            ):
                continue
            signal.alarm(CASE_TIMEOUT_S)
            t = time.monotonic()
            try:
                res = run_case(engine, case)
            except CaseTimeout as exc:
                res = {"verdict": "error", "why": str(exc)}
            except Exception as exc:  # a case that breaks loading
                res = {"verdict": "error", "why": f"{type(exc).__name__}: {_first_line(exc)}"}
            finally:
                signal.alarm(0)
            res["seconds"] = round(time.monotonic() - t, 3)
            cases[name] = res
    counts: dict[str, int] = {}
    for res in cases.values():
        counts[res["verdict"]] = counts.get(res["verdict"], 0) + 1
    meta = {
        "engine": args.engine,
        **engine.describe(),
        "where": args.where,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "seconds": round(time.monotonic() - t0, 1),
        "counts": counts,
        "pid": os.getpid(),
    }
    if args.engine == "ort":
        meta["onnxruntime"] = engine.ort.__version__
    args.out.write_text(json.dumps({"meta": meta, "cases": cases}, indent=1, sort_keys=True))
    print(json.dumps(meta), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
