#!/usr/bin/env python3
"""Boot the QEMU guest and drive its serial console.

Module use (the host test harness)::

    from guest import Guest
    with Guest() as g:              # boots; QEMU is killed on every exit path
        g.load_module()             # insmod /mnt/npu/build/module/<kver>/npu.ko
        rc, out = g.run("lspci -n")

CLI::

    guest.py run [--no-module] [--timeout S] -- CMD...   # boot, run, exit with CMD's rc
    guest.py shell [--no-module]                         # interactive console

A single CMD argument is a shell command line as is (``-- 'ls | wc -l'``);
several are quoted and joined (``-- python3 -m pytest tests/guest``).

Each ``run()`` executes in a fresh subshell of the guest's root shell, with
stdin from /dev/null, cwd /mnt/npu (the project tree over 9p),
PYTHONPATH=/mnt/npu/runtime_py and /mnt/npu/guest/bin (``npu-smi``) on
PATH. stdout and stderr are merged. The kernel's console log level is
lowered to 1 after boot so that printk lines do not interleave with
command output; use ``dmesg()`` for the kernel log.

Environment:
    NPU_CACHE        build products (default ~/.cache/npu-stack)
    NPU_KERNEL       guest kernel: "distro" (default; Debian 13's 6.12) or
                     "debug" (KASAN, lockdep, kmemleak...: make kernel-debug)
    NPU_GUEST        guest image: "debian" (default) or "buildroot" (the
                     image of make buildroot, with its own kernel)
    NPU_QEMU         QEMU binary (default $NPU_CACHE/bin/qemu-system-x86_64)
    NPU_DEVICES      device arguments (default "-device npu"; "" for none)
    NPU_MEM          guest memory (default 2G)
    NPU_SMP          guest CPUs (default 1)
    NPU_KVM=1        use KVM instead of TCG
    NPU_IOMMU=1      add an emulated Intel VT-d IOMMU (-device intel-iommu,
                     kernel intel_iommu=on): the NPU's DMA is translated
    NPU_QEMU_EXTRA   extra QEMU arguments (shell-split)
    NPU_CMDLINE_EXTRA  extra kernel command line
    NPU_BOOT_TIMEOUT seconds to wait for the shell (default 300)
    NPU_GUEST_LOG    console log (default <root>/build/guest-console.log)
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import importlib.util
import os
import re
import shlex
import signal
import sys
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NPU_CACHE = Path(os.environ.get("NPU_CACHE") or Path.home() / ".cache" / "npu-stack")
GUEST_DIR = NPU_CACHE / "guest" / "current"
DEBUG_KERNEL_DIR = NPU_CACHE / "kernel-debug" / "current"
BUILDROOT_IMAGES = NPU_CACHE / "buildroot" / "images"
GUEST_ROOT = "/mnt/npu"  # where the project tree is mounted in the guest
KERNEL_CMDLINE = "console=ttyS0 root=/dev/vda rw init=/sbin/npu-init quiet"
# Coldplug would load these for q35's stock devices; they only cost boot time.
BOOT_BLACKLIST = (
    "kvm,kvm_amd,kvm_intel,iTCO_wdt,iTCO_vendor_support,pcspkr,powernow_k8,"
    "i2c_i801,lpc_ich,joydev,serio_raw,evdev,button,ahci,libahci"
)
READY_LINE = "npu-init: ready"
# Commands of the project tree for the guest's shell (guest/bin: npu-smi).
GUEST_BIN = f"{GUEST_ROOT}/guest/bin"


def _load_reports() -> Any:
    """tests/kernel_reports.py: the one pattern list of the host's and the
    in-guest kernel-log gates."""
    spec = importlib.util.spec_from_file_location(
        "npu_kernel_reports", ROOT / "tests" / "kernel_reports.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Kernel log lines that fail a test. The unsigned/out-of-tree module taint
# messages do not match.
BAD_DMESG_RE: re.Pattern[str] = _load_reports().BAD_KMSG_RE
# The guest tty turns LF into CRLF and QEMU's stdio adds another CR.
_CRLF_RE = re.compile(r"\r+\n")


class GuestError(RuntimeError):
    """The guest misbehaved (died, failed to boot, a helper failed)."""


class GuestSetupError(GuestError):
    """QEMU, the guest image or the module is not built."""


class GuestTimeout(GuestError):
    """A command did not finish in time; .output holds what it printed."""

    def __init__(self, msg: str, output: str = ""):
        super().__init__(msg)
        self.output = output


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name, "").strip()
    return int(v) if v else default


def qemu_binary() -> Path:
    return Path(os.environ.get("NPU_QEMU") or NPU_CACHE / "bin" / "qemu-system-x86_64")


class GuestKernel:
    """The guest image and kernel that NPU_GUEST and NPU_KERNEL select."""

    def __init__(self, kind: str | None = None) -> None:
        self.guest = os.environ.get("NPU_GUEST", "").strip() or "debian"
        self.kind = kind or os.environ.get("NPU_KERNEL", "").strip() or "distro"
        if self.guest not in ("debian", "buildroot"):
            raise GuestSetupError(f"NPU_GUEST={self.guest!r}: expected 'debian' or 'buildroot'")
        if self.kind not in ("distro", "debug"):
            raise GuestSetupError(f"NPU_KERNEL={self.kind!r}: expected 'distro' or 'debug'")
        self.initrd: Path | None = None
        if self.guest == "buildroot":
            self.kind = "buildroot"
            self.vmlinuz = BUILDROOT_IMAGES / "bzImage"
            self.rootfs = BUILDROOT_IMAGES / "rootfs.ext4"
            self.kver_file: Path | None = None
            self.build = "make buildroot BUILDROOT_DIR=<a Buildroot checkout>"
        elif self.kind == "debug":
            self.vmlinuz = DEBUG_KERNEL_DIR / "vmlinuz"
            self.rootfs = GUEST_DIR / "rootfs.ext4"
            self.kver_file = DEBUG_KERNEL_DIR / "kver"
            self.build = "make kernel-debug"
        else:
            self.vmlinuz = GUEST_DIR / "vmlinuz"
            self.initrd = GUEST_DIR / "initrd.img"
            self.rootfs = GUEST_DIR / "rootfs.ext4"
            self.kver_file = GUEST_DIR / "kver"
            self.build = "make guest"

    @property
    def kver(self) -> str:
        """The kernel release (uname -r in the guest)."""
        if self.kver_file is None or not self.kver_file.is_file():
            return ""
        return self.kver_file.read_text().strip()

    @property
    def load_command(self) -> str:
        """The guest command that loads the driver built for this kernel."""
        if self.kind == "buildroot":  # installed into the image by package/npu-driver
            return "modprobe npu"
        # insmod does not load what npu.ko needs: DRM's GEM shmem helpers
        # (a module on the distribution kernel; a no-op where built in).
        return f"modprobe -q drm_shmem_helper; insmod {GUEST_ROOT}/build/module/{self.kver}/npu.ko"

    @property
    def host_module_path(self) -> Path | None:
        """npu.ko on the host (None: it lives in the image)."""
        if self.kind == "buildroot":
            return None
        return ROOT / "build" / "module" / self.kver / "npu.ko"


def check_prerequisites(need_module: bool = False, kernel: GuestKernel | None = None) -> None:
    """Raise GuestSetupError naming what is missing and how to build it."""
    missing = []
    q = qemu_binary()
    if not (q.is_file() and os.access(q, os.X_OK)):
        missing.append(f"QEMU binary {q} (build: make qemu / bash scripts/build-qemu.sh)")
    k = kernel or GuestKernel()
    for f in (k.vmlinuz, k.initrd, k.rootfs):
        if f is not None and not f.is_file():
            missing.append(f"guest {f} (build: {k.build})")
    hm = k.host_module_path
    if need_module and hm is not None and not hm.is_file():
        missing.append(f"kernel module {hm} (build: make module)")
    if missing:
        raise GuestSetupError(
            "guest prerequisites missing (`make test` builds them):\n  " + "\n  ".join(missing)
        )


def qemu_argv(
    extra_cmdline: str = "",
    console_args: list | None = None,
    kernel: GuestKernel | None = None,
    smp: int | None = None,
) -> list:
    """The QEMU command line (argv[0] included); smp overrides NPU_SMP."""
    kvm = os.environ.get("NPU_KVM", "") == "1"
    cmdline = f"{KERNEL_CMDLINE} modprobe.blacklist={BOOT_BLACKLIST}"
    for extra in (os.environ.get("NPU_CMDLINE_EXTRA", ""), extra_cmdline):
        if extra.strip():
            cmdline += " " + extra.strip()
    iommu = os.environ.get("NPU_IOMMU", "") == "1"
    if iommu:
        cmdline += " intel_iommu=on"
    k = kernel or GuestKernel()
    argv = [str(qemu_binary())]
    # Our QEMU build has no firmware of its own: use Debian's (qemu-system-data,
    # seabios, ipxe-qemu), which live in several directories.
    for d in ("/usr/share/qemu", "/usr/share/seabios", "/usr/lib/ipxe/qemu"):
        if Path(d).is_dir():
            argv += ["-L", d]
    argv += [
        "-machine",
        "q35",
        # TCG: "max" (what TCG implements: SSE4.2, AVX2, FMA...). Under the
        # default qemu64 model trixie's OpenBLAS picks kernels that die with
        # SIGILL, and the numpy baseline would be unfairly slow.
        *(["-accel", "kvm", "-cpu", "host"] if kvm else ["-accel", "tcg", "-cpu", "max"]),
        "-m",
        os.environ.get("NPU_MEM", "") or "2G",
        "-smp",
        str(smp or _env_int("NPU_SMP", 1)),
        "-nodefaults",
        "-display",
        "none",
        "-monitor",
        "none",
        "-no-reboot",
        # A vIOMMU must come before the PCI devices it translates for.
        *(["-device", "intel-iommu,intremap=on"] if iommu else []),
        # signal=off: a Ctrl-C we send must reach the guest, not stop QEMU.
        *(
            console_args
            if console_args is not None
            else ["-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con"]
        ),
        "-kernel",
        str(k.vmlinuz),
        *(["-initrd", str(k.initrd)] if k.initrd is not None else []),
        "-append",
        cmdline,
        "-drive",
        f"file={k.rootfs},if=virtio,format=raw,snapshot=on",
        "-fsdev",
        f"local,id=npufs,path={ROOT},security_model=none",
        "-device",
        "virtio-9p-pci,fsdev=npufs,mount_tag=npu",
    ]
    devices = os.environ.get("NPU_DEVICES")
    argv += shlex.split("-device npu" if devices is None else devices)
    argv += shlex.split(os.environ.get("NPU_QEMU_EXTRA", ""))
    return argv


def _set_pdeathsig() -> None:
    """In the QEMU child: get SIGTERM when the parent dies, however it dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


_live_guests: weakref.WeakSet[Guest] = weakref.WeakSet()


@atexit.register
def _kill_all() -> None:
    for g in list(_live_guests):
        g.kill()


def bad_dmesg_lines(lines: list) -> list:
    """The kernel reports among dmesg lines (tests/kernel_reports.py)."""
    return [ln for ln in lines if BAD_DMESG_RE.search(ln)]


class Guest:
    """A booted guest with a root shell on its serial console."""

    def __init__(
        self,
        log_path: Path | None = None,
        boot_timeout: float | None = None,
        extra_cmdline: str = "",
        kernel: str | None = None,
        smp: int | None = None,
    ):
        self.kernel = GuestKernel(kernel)
        self.smp = smp  # guest CPUs; None: NPU_SMP (default 1)
        self.log_path = Path(
            log_path or os.environ.get("NPU_GUEST_LOG") or ROOT / "build" / "guest-console.log"
        )
        self.boot_timeout = boot_timeout or float(_env_int("NPU_BOOT_TIMEOUT", 300))
        self.extra_cmdline = extra_cmdline
        self.boot_s: float | None = None
        self.child = None
        self._log = None
        self._buf = ""  # console text received but not yet consumed
        self._busy = False  # a command may still be running in the guest
        self.dead_reason: str | None = None

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> Guest:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> Guest:
        import pexpect

        check_prerequisites(kernel=self.kernel)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
        argv = qemu_argv(self.extra_cmdline, kernel=self.kernel, smp=self.smp)
        self._log.write("[guest.py] " + shlex.join(argv) + "\n")
        self._log.flush()
        t0 = time.monotonic()
        self.child = pexpect.spawn(
            argv[0],
            argv[1:],
            encoding="utf-8",
            codec_errors="replace",
            echo=False,
            timeout=None,
            preexec_fn=_set_pdeathsig,
            dimensions=(50, 200),
        )
        self.child.logfile_read = self._log
        _live_guests.add(self)
        deadline = t0 + self.boot_timeout
        try:
            self._read_until(
                re.compile(re.escape(READY_LINE)), deadline, what="npu-init ready line"
            )
            # Then the shell's first prompt (bash --norc as root: "bash-5.2# ").
            self._read_until(re.compile(r"[#$] "), deadline, what="shell prompt")
            self._setup_shell(deadline)
        except GuestTimeout as e:
            self._died(f"guest did not boot in {self.boot_timeout:g} s ({e})")
        self.boot_s = time.monotonic() - t0
        return self

    def _setup_shell(self, deadline: float) -> None:
        # No echo, no line editing, empty prompts: the console then carries
        # just command output and our markers. Kernel messages stay off the
        # console (level 1 = emergencies only) and go to dmesg. The
        # project's guest commands (npu-smi) are on PATH: the image is not
        # rebuilt for them.
        setup = (
            "stty -echo -ixon; set +o emacs +o vi +o history; PS1=''; PS2=''; "
            "PROMPT_COMMAND=''; unset HISTFILE; export TERM=dumb; "
            f'export PATH="$PATH:{GUEST_BIN}"; dmesg -n 1'
        )
        self._send_line(setup)
        self.resync(deadline - time.monotonic())

    def resync(self, timeout: float = 30.0) -> None:
        """Wait until the shell answers; discards console output before that."""
        tag = uuid.uuid4().hex
        self._send_line(f"printf '__NPU_%s_%s__\\n' SYNC {tag}")
        self._read_until(
            re.compile(f"__NPU_SYNC_{tag}__\r*\n"), time.monotonic() + timeout, what="shell sync"
        )

    @property
    def alive(self) -> bool:
        return self.child is not None and self.child.isalive() and self.dead_reason is None

    def close(self, timeout: float = 10.0) -> None:
        """Power the guest off (kill QEMU if it does not go quickly)."""
        if self.child is None:
            return
        try:
            if self.child.isalive() and self.dead_reason is None and not self._busy:
                # minbase has no poweroff(8): sysrq "o" powers off at once.
                self._send_line("sync; echo o >/proc/sysrq-trigger")
                end = time.monotonic() + timeout
                while self.child.isalive() and time.monotonic() < end:
                    try:
                        self.child.read_nonblocking(65536, timeout=0.5)
                    except Exception:
                        break
        except Exception:
            pass
        finally:
            self.kill()

    def kill(self) -> None:
        """Kill QEMU now (idempotent)."""
        child, self.child = self.child, None
        if child is not None:
            try:
                if child.isalive():
                    child.terminate(force=True)
            except Exception:
                with contextlib.suppress(OSError):
                    os.kill(child.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                child.close(force=True)
        _live_guests.discard(self)
        if self._log is not None:
            with contextlib.suppress(Exception):
                self._log.close()
            self._log = None

    # -- console I/O -------------------------------------------------------

    def _send_line(self, line: str) -> None:
        if self.child is None:
            raise GuestError(f"guest is not running ({self.dead_reason or 'closed'})")
        if self._log is not None:
            self._log.write(f"\n[guest.py] $ {line}\n")
            self._log.flush()
        self.child.send(line + "\n")

    def _fill(self, timeout: float) -> str:
        """Read what the console has (up to `timeout` s); '' on timeout."""
        import pexpect

        try:
            data = self.child.read_nonblocking(65536, timeout=max(timeout, 0.0))
        except pexpect.TIMEOUT:
            return ""
        except pexpect.EOF:
            self._died("QEMU exited")
        return data

    def _died(self, why: str):
        tail = self.console_tail()
        self.dead_reason = why
        self.kill()
        raise GuestError(f"{why}; last console output:\n{tail}")

    def console_tail(self, n: int = 40) -> str:
        try:
            if self._log is not None:
                self._log.flush()
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(_CRLF_RE.sub("\n", text).split("\n")[-n:])

    def _read_until(
        self,
        pattern: re.Pattern[str],
        deadline: float,
        what: str,
        on_data: Callable[[str], None] | None = None,
        hold: int = 0,
    ) -> re.Match[str]:
        """Consume console output up to and including `pattern`.

        Text before the match is handed to on_data as it arrives, except the
        last `hold` characters (a marker may be split across reads)."""
        if self.child is None:
            raise GuestError(f"guest is not running ({self.dead_reason or 'closed'})")
        searched = 0
        while True:
            m = pattern.search(self._buf, max(0, searched - 200))
            if m:
                if on_data is not None and m.start() > 0:
                    on_data(self._buf[: m.start()])
                self._buf = self._buf[m.end() :]
                return m
            if on_data is not None and len(self._buf) > hold:
                cut = len(self._buf) - hold
                on_data(self._buf[:cut])
                self._buf = self._buf[cut:]
            searched = len(self._buf)
            left = deadline - time.monotonic()
            if left <= 0:
                raise GuestTimeout(f"timed out waiting for {what}", self._buf)
            self._buf += self._fill(min(left, 1.0))

    def run(
        self, cmd: str, timeout: float = 60.0, stream: Callable[[str], None] | None = None
    ) -> tuple:
        """Run a shell command line in the guest: (exit code, output).

        On timeout the command is interrupted (Ctrl-C) and GuestTimeout is
        raised; if the shell does not come back, QEMU is killed."""
        if not self.alive:
            raise GuestError(f"guest is not running ({self.dead_reason or 'closed'})")
        tag = uuid.uuid4().hex
        script = f"/tmp/.npu-cmd-{tag}"
        # The command travels base64-encoded through a here-document: no
        # quoting issues, no tty line-length limit, multi-line commands work.
        import base64

        b64 = base64.b64encode(cmd.encode()).decode()
        lines = [f"base64 -d >{script} <<'__B64_{tag}'"]
        lines += [b64[i : i + 76] for i in range(0, len(b64), 76)]
        lines.append(f"__B64_{tag}")
        # Markers are built by printf so their echo (if any) cannot match.
        lines.append(
            f"printf '__NPU_%s_%s__\\n' S {tag}; ( . {script} ) </dev/null; "
            f"printf '__NPU_%s_%s_%d__\\n' E {tag} $?; rm -f {script}"
        )
        self._buf = ""
        self._busy = True
        for ln in lines:
            self._send_line(ln)
        deadline = time.monotonic() + timeout
        out: list = []
        carry = [""]  # trailing CRs: the LF that follows may come in the next chunk

        def collect(s: str) -> None:
            s = carry[0] + s
            stripped = s.rstrip("\r")
            carry[0] = s[len(stripped) :]
            s = _CRLF_RE.sub("\n", stripped)
            out.append(s)
            if stream is not None and s:
                stream(s)

        try:
            self._read_until(re.compile(f"__NPU_S_{tag}__\r*\n"), deadline, what="command start")
            m = self._read_until(
                re.compile(f"__NPU_E_{tag}_(\\d+)__\r*\n"),
                deadline,
                what="command end",
                on_data=collect,
                hold=80,
            )
        except GuestTimeout as e:
            rest = _CRLF_RE.sub("\n", carry[0] + e.output)
            if stream is not None and rest:
                stream(rest)
            partial = "".join(out) + rest
            self._recover_after_timeout()
            self._busy = False
            raise GuestTimeout(f"command timed out after {timeout:g} s: {cmd}", partial) from None
        self._busy = False
        tail = _CRLF_RE.sub("\n", carry[0])
        if tail and stream is not None:
            stream(tail)
        return int(m.group(1)), "".join(out) + tail

    def _recover_after_timeout(self) -> None:
        try:
            self.child.send("\x03")
            time.sleep(0.5)
            self.child.send("\x03")
            self.resync(30.0)
        except GuestError:
            self._died("guest shell unresponsive after a command timeout; QEMU killed")

    def check(self, cmd: str, timeout: float = 60.0) -> str:
        """run(), raising GuestError unless the exit code is 0; returns output."""
        rc, out = self.run(cmd, timeout=timeout)
        if rc != 0:
            raise GuestError(f"`{cmd}` exited {rc}:\n{out}")
        return out

    # -- kernel helpers ----------------------------------------------------

    def dmesg(self) -> str:
        rc, out = self.run("dmesg", timeout=60)
        if rc != 0:
            raise GuestError(f"dmesg failed ({rc}): {out}")
        return out

    def dmesg_lines(self) -> list:
        return self.dmesg().splitlines()

    def dmesg_mark(self) -> str:
        """A position in the kernel log (its last line) for new_dmesg()."""
        rc, out = self.run("dmesg | tail -n 1", timeout=60)
        if rc != 0:
            raise GuestError(f"dmesg failed ({rc}): {out}")
        return out.rstrip("\n")

    def new_dmesg(self, mark: str) -> list:
        """Kernel log lines added since `mark` (from dmesg_mark()).

        Lines carry timestamps, so the last line is a unique position. Should
        the ring buffer have wrapped past it, the whole log is returned."""
        rc, out = self.run(
            f"M={shlex.quote(mark)}; "
            'n=$(dmesg | grep -n -F -x -e "$M" | tail -n 1 | cut -d: -f1); '
            "dmesg | tail -n +$(( ${n:-0} + 1 ))",
            timeout=60,
        )
        if rc != 0:
            raise GuestError(f"dmesg failed ({rc}): {out}")
        return out.splitlines()

    def module_loaded(self) -> bool:
        return self.run("test -d /sys/module/npu", timeout=30)[0] == 0

    def load_module(self, params: str = "", path: str | None = None) -> None:
        """insmod the driver (by default the one built for this guest's
        kernel) and wait for udev; GuestError (with dmesg) on failure."""
        if path is None:
            hm = self.kernel.host_module_path
            if hm is not None and not hm.is_file():
                raise GuestSetupError(f"kernel module {hm} is not built (make module)")
            cmd = self.kernel.load_command
        else:
            cmd = f"modprobe -q drm_shmem_helper; insmod {shlex.quote(path)}"
        mark = self.dmesg_mark()
        rc, out = self.run(f"{cmd} {params}".rstrip(), timeout=120)
        new = self.new_dmesg(mark)
        if rc != 0:
            raise GuestError(f"{cmd} failed ({rc}): {out.strip()}\ndmesg:\n" + "\n".join(new[-40:]))
        self.run("udevadm settle -t 30", timeout=60)
        bad = bad_dmesg_lines(new)
        if bad:
            raise GuestError("kernel log after insmod has errors:\n" + "\n".join(new[-60:]))

    def unload_module(self) -> None:
        rc, out = self.run("rmmod npu", timeout=120)
        if rc != 0:
            raise GuestError(f"rmmod npu failed ({rc}): {out.strip()}")
        self.run("udevadm settle -t 30", timeout=60)


# -- CLI -------------------------------------------------------------------


def _cmd_run(args) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("guest.py run: no command given", file=sys.stderr)
        return 2
    line = cmd[0] if len(cmd) == 1 else shlex.join(cmd)
    try:
        with Guest() as g:
            print(f"guest.py: booted in {g.boot_s:.1f} s", file=sys.stderr)
            if not args.no_module:
                g.load_module()
            rc, _ = g.run(
                line,
                timeout=args.timeout,
                stream=lambda s: (sys.stdout.write(s), sys.stdout.flush()),
            )
            return rc
    except GuestTimeout as e:
        print(f"\nguest.py: {e}", file=sys.stderr)
        return 124
    except GuestError as e:
        print(f"guest.py: {e}", file=sys.stderr)
        return 125
    except KeyboardInterrupt:
        print("\nguest.py: interrupted", file=sys.stderr)
        return 130


def _cmd_shell(args) -> int:
    check_prerequisites(need_module=not args.no_module)
    extra = [] if args.no_module else ["npu_autoload"]
    term = os.environ.get("TERM", "")
    if re.fullmatch(r"[\w.+-]+", term):
        extra.append(f"npu_term={term}")
    try:
        sz = os.get_terminal_size(sys.stdout.fileno())
        extra.append(f"npu_size={sz.lines}x{sz.columns}")
    except OSError:
        pass
    argv = qemu_argv(
        " ".join(extra),
        console_args=["-chardev", "stdio,id=con,mux=on,signal=off", "-serial", "chardev:con"],
    )
    print(
        "guest.py shell: Ctrl-A X (or `poweroff`) quits; the disk is a snapshot.", file=sys.stderr
    )
    os.execv(argv[0], argv)
    return 127


def _reexec_in_venv() -> None:
    """The CLI needs pexpect: fall back to the project venv's Python."""
    try:
        import pexpect  # noqa: F401
    except ImportError:
        venv_py = Path(os.environ.get("NPU_VENV") or NPU_CACHE / "venv") / "bin" / "python3"
        if venv_py.is_file() and Path(sys.executable).resolve() != venv_py.resolve():
            os.execv(str(venv_py), [str(venv_py), str(Path(__file__).resolve()), *sys.argv[1:]])
        raise


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="guest.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="boot, run a command, exit with its exit code")
    r.add_argument("--no-module", action="store_true", help="do not insmod npu.ko")
    r.add_argument("--timeout", type=float, default=600.0, help="command timeout (s)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD...")
    s = sub.add_parser("shell", help="interactive shell on the serial console")
    s.add_argument("--no-module", action="store_true", help="do not insmod npu.ko at boot")
    args = p.parse_args(argv)
    if args.what == "run":
        _reexec_in_venv()
    # SIGTERM/SIGHUP: unwind so that QEMU is killed by the context manager.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, f: sys.exit(128 + n))
    return _cmd_run(args) if args.what == "run" else _cmd_shell(args)


if __name__ == "__main__":
    sys.exit(main())
