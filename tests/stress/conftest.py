"""In-guest reliability suite (issue 7): runs inside the QEMU guest, as root.

Run from the project root in the guest (/mnt/npu)::

    NPU_STRESS_SCALE=short python3 -m pytest -q -p no:cacheprovider \\
        --confcutdir=tests/stress tests/stress

Host side: ``tests/test_stress_suite.py`` (``make test``: short sizes) and
``make stress`` (the issue's full sizes).

- every test: the kernel log (/dev/kmsg) is read before and after; a new
  record matching kmsg.BAD_KMSG_RE (tests/guest/kmsg.py) fails it;
- session: the driver is loaded (insmod) if it is not, and /dev/npu0
  awaited; at the end it is loaded again if a test left it unloaded;
- sizes: ``stress_util.size()`` (NPU_STRESS_SCALE=full|short, per-size
  overrides); figures go to the junit XML via ``record_property``.

On the host (outside the guest) nothing here is collected.
"""

from __future__ import annotations

import os
import sys

import pytest

IN_GUEST = os.environ.get("NPU_IN_GUEST") == "1"
if not IN_GUEST:
    # tests/conftest.py only ignores tests/guest; these files need the guest too.
    collect_ignore_glob = ["*.py"]

RUNTIME = "/mnt/npu/runtime_py"
if RUNTIME not in sys.path and os.path.isdir(RUNTIME):
    sys.path.insert(0, RUNTIME)

# The kernel-log gate is shared with tests/guest (tests/guest/kmsg.py).
_GUEST_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "guest")
if _GUEST_TESTS not in sys.path:
    sys.path.insert(0, _GUEST_TESTS)
import kmsg  # noqa: E402


@pytest.fixture(autouse=True)
def _kmsg_gate():
    with kmsg.checked():
        yield


@pytest.fixture(scope="session", autouse=True)
def _npu_module():
    """The driver is loaded during the session, and again after it."""
    from . import stress_util as su

    try:
        su.ensure_loaded()
    except RuntimeError as e:
        pytest.exit(str(e), returncode=3)
    yield
    su.ensure_loaded()
