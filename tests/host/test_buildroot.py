"""Static checks of the Buildroot br2-external tree in buildroot_config/.

Buildroot and the sources it downloads are not reachable from the machines
that run these tests (they reach only the Debian and PyPI mirrors), so the
tree is never built here. These tests check, without a Buildroot checkout,
what a build would trip over: Kconfig that does not parse or names unknown
symbols, a defconfig with typos or unmet dependencies, package rules that
Buildroot's utils/check-package rejects, versions and files that drifted
from the Debian guest's, and the wrapper script scripts/buildroot.sh.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import kconfiglib
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXT = ROOT / "buildroot_config"
DEFCONFIG = EXT / "configs" / "npu_qemu_x86_64_defconfig"
POST_BUILD = EXT / "board" / "npu" / "post-build.sh"
BUILDROOT_SH = ROOT / "scripts" / "buildroot.sh"
GUEST = ROOT / "guest"
PACKAGES = sorted(p.name for p in (EXT / "package").iterdir() if p.is_dir())
CONFIG_INS = ["Config.in", *(f"package/{p}/Config.in" for p in PACKAGES)]

# The Buildroot 2025.02 symbols this tree uses, with the relations between
# them that its Config.in files and its defconfig rely on (the selects,
# defaults and dependencies), written from Buildroot's own Config.in files.
# It is deliberately not derived from the defconfig: a symbol the tree uses
# that is not listed here, a typo for instance, fails the tests. Add one
# only after checking its name and relations in Buildroot 2025.02.
BUILDROOT_KCONFIG = """
config BR2_x86_64
	bool "x86_64"

config BR2_TOOLCHAIN_BUILDROOT
	bool "Buildroot toolchain"

config BR2_TOOLCHAIN_BUILDROOT_GLIBC
	bool "glibc"
	depends on BR2_TOOLCHAIN_BUILDROOT
	select BR2_TOOLCHAIN_USES_GLIBC

config BR2_TOOLCHAIN_BUILDROOT_CXX
	bool "Enable C++ support"
	depends on BR2_TOOLCHAIN_BUILDROOT
	select BR2_INSTALL_LIBSTDCPP

config BR2_TOOLCHAIN_USES_GLIBC
	bool

config BR2_TOOLCHAIN_USES_MUSL
	bool

config BR2_INSTALL_LIBSTDCPP
	bool

config BR2_TOOLCHAIN_GCC_AT_LEAST_9
	bool
	default y if BR2_TOOLCHAIN_BUILDROOT

config BR2_PACKAGE_HOST_LINUX_HEADERS_CUSTOM_6_12
	bool "6.12.x"

config BR2_TARGET_GENERIC_HOSTNAME
	string "System hostname"

config BR2_INIT_NONE
	bool "None"

config BR2_ROOTFS_DEVICE_CREATION_DYNAMIC_EUDEV
	bool "Dynamic using devtmpfs + eudev"
	select BR2_PACKAGE_EUDEV

config BR2_TARGET_GENERIC_GETTY
	bool "Run a getty (login prompt) after boot"
	default y

config BR2_TARGET_GENERIC_GETTY_PORT
	string "TTY port"
	depends on BR2_TARGET_GENERIC_GETTY

config BR2_ROOTFS_POST_BUILD_SCRIPT
	string "Custom scripts to run before creating filesystem images"

config BR2_LINUX_KERNEL
	bool "Linux Kernel"

config BR2_LINUX_KERNEL_CUSTOM_VERSION
	bool "Custom version"
	depends on BR2_LINUX_KERNEL

config BR2_LINUX_KERNEL_CUSTOM_VERSION_VALUE
	string "Kernel version"
	depends on BR2_LINUX_KERNEL_CUSTOM_VERSION

config BR2_LINUX_KERNEL_USE_DEFCONFIG
	bool "Using an in-tree defconfig file"
	depends on BR2_LINUX_KERNEL

config BR2_LINUX_KERNEL_DEFCONFIG
	string "Defconfig name"
	depends on BR2_LINUX_KERNEL_USE_DEFCONFIG

config BR2_LINUX_KERNEL_CONFIG_FRAGMENT_FILES
	string "Additional configuration fragment files"
	depends on BR2_LINUX_KERNEL

config BR2_LINUX_KERNEL_BZIMAGE
	bool "bzImage"
	depends on BR2_LINUX_KERNEL

config BR2_LINUX_KERNEL_NEEDS_HOST_LIBELF
	bool "Needs host libelf"
	depends on BR2_LINUX_KERNEL

config BR2_LINUX_KERNEL_NEEDS_HOST_OPENSSL
	bool "Needs host OpenSSL"
	depends on BR2_LINUX_KERNEL

config BR2_PACKAGE_BUSYBOX_SHOW_OTHERS
	bool "Show packages that are also provided by busybox"

config BR2_PACKAGE_BASH
	bool "bash"
	depends on BR2_PACKAGE_BUSYBOX_SHOW_OTHERS

config BR2_PACKAGE_EUDEV
	bool "eudev"
	depends on BR2_ROOTFS_DEVICE_CREATION_DYNAMIC_EUDEV
	select BR2_PACKAGE_HAS_UDEV

config BR2_PACKAGE_HAS_UDEV
	bool

config BR2_PACKAGE_KMOD
	bool "kmod"

config BR2_PACKAGE_KMOD_TOOLS
	bool "kmod utilities"
	depends on BR2_PACKAGE_KMOD

config BR2_PACKAGE_PCIUTILS
	bool "pciutils"

config BR2_PACKAGE_PYTHON3
	bool "python3"

config BR2_PACKAGE_PYTHON_NUMPY_ARCH_SUPPORTS
	bool
	default y if BR2_x86_64

config BR2_PACKAGE_PYTHON_NUMPY
	bool "python-numpy"
	depends on BR2_PACKAGE_PYTHON3
	depends on BR2_PACKAGE_PYTHON_NUMPY_ARCH_SUPPORTS
	depends on BR2_TOOLCHAIN_USES_GLIBC || BR2_TOOLCHAIN_USES_MUSL
	depends on BR2_INSTALL_LIBSTDCPP
	depends on BR2_TOOLCHAIN_GCC_AT_LEAST_9

config BR2_PACKAGE_PYTHON_PYUDEV
	bool "python-pyudev"
	depends on BR2_PACKAGE_PYTHON3
	depends on BR2_PACKAGE_HAS_UDEV

config BR2_TARGET_ROOTFS_EXT2
	bool "ext2/3/4 root filesystem"

config BR2_TARGET_ROOTFS_EXT2_4
	bool "ext4"
	depends on BR2_TARGET_ROOTFS_EXT2

config BR2_TARGET_ROOTFS_EXT2_SIZE
	string "exact size"
	depends on BR2_TARGET_ROOTFS_EXT2

config BR2_TARGET_ROOTFS_TAR
	bool "tar the root filesystem"
	default y
"""
BUILDROOT_SYMBOLS = frozenset(re.findall(r"^config (\w+)", BUILDROOT_KCONFIG, re.M))


def _upper(pkg: str) -> str:
    """Buildroot's variable prefix of a package: python-npu -> PYTHON_NPU."""
    return pkg.replace("-", "_").upper()


def _kconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> kconfiglib.Kconfig:
    """kconfiglib's parse of the stub of Buildroot followed by ``body``.

    References to undefined symbols are reported as warnings
    (KCONFIG_WARN_UNDEF), $BR2_EXTERNAL_NPU_PATH is set as Buildroot sets
    it, .config lines carry no prefix but the symbols' own BR2_ (CONFIG_
    empty, as in Buildroot), and warnings are collected in
    ``Kconfig.warnings``.
    """
    monkeypatch.setenv("KCONFIG_WARN_UNDEF", "y")
    monkeypatch.setenv("CONFIG_", "")
    monkeypatch.setenv("BR2_EXTERNAL_NPU_PATH", str(EXT))
    monkeypatch.delenv("srctree", raising=False)
    top = tmp_path / "Kconfig"
    top.write_text(BUILDROOT_KCONFIG + "\n" + body)
    return kconfiglib.Kconfig(str(top), warn_to_stderr=False)


def _external_kconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> kconfiglib.Kconfig:
    """Buildroot's view of the tree: its Config.in under "External options"."""
    return _kconfig(
        tmp_path,
        monkeypatch,
        'menu "External options"\nsource "$BR2_EXTERNAL_NPU_PATH/Config.in"\nendmenu\n',
    )


def _defconfig() -> dict[str, str]:
    """The defconfig's assignments: symbol -> value ("n" for "is not set")."""
    values: dict[str, str] = {}
    for line in DEFCONFIG.read_text().splitlines():
        if m := re.fullmatch(r"# (BR2_\w+) is not set", line):
            values[m[1]] = "n"
        elif m := re.fullmatch(r"(BR2_\w+)=(.*)", line):
            value = m[2]
            values[m[1]] = value[1:-1] if value.startswith('"') else value
    return values


def _expand_external(value: str) -> Path:
    """A defconfig path with $(BR2_EXTERNAL_NPU_PATH), resolved."""
    return Path(value.replace("$(BR2_EXTERNAL_NPU_PATH)", str(EXT))).resolve()


def _mk_lines(pkg: str) -> list[str]:
    return (EXT / "package" / pkg / f"{pkg}.mk").read_text().splitlines()


def _mk_assignments(pkg: str) -> dict[str, str]:
    """The variables a .mk assigns outside define blocks, continuations joined."""
    values: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    in_define = False
    for line in _mk_lines(pkg):
        if in_define:
            in_define = line.strip() != "endef"
            continue
        if line.startswith("define "):
            in_define = True
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    for line in logical:
        if m := re.fullmatch(r"([A-Z0-9_]+)\s*(\+|:|\?)?=\s*(.*)", line):
            name, op, value = m[1], m[2], m[3].strip()
            values[name] = f"{values.get(name, '')} {value}".strip() if op == "+" else value
    return values


def _mk_value(pkg: str, name: str) -> str:
    """A variable of the .mk with $(VAR) of the same .mk and of the tree expanded."""
    values = _mk_assignments(pkg)
    values["BR2_EXTERNAL_NPU_PATH"] = str(EXT)

    def expand(text: str) -> str:
        return re.sub(
            r"\$\((\w+)\)", lambda m: expand(values[m[1]]) if m[1] in values else m[0], text
        )

    return expand(values[f"{_upper(pkg)}_{name}"])


def _hash_entries(pkg: str) -> list[list[str]]:
    path = EXT / "package" / pkg / f"{pkg}.hash"
    return [
        line.split()
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _runtime_version() -> str:
    project = tomllib.loads((ROOT / "runtime_py" / "pyproject.toml").read_text())["project"]
    return str(project["version"])


def _guest_pin(name: str) -> str:
    for line in (GUEST / "requirements.txt").read_text().splitlines():
        if m := re.fullmatch(rf"{re.escape(name)}==(\S+)", line.strip()):
            return m[1]
    raise AssertionError(f"guest/requirements.txt pins no {name}")


# --- The br2-external tree ---------------------------------------------------


def test_external_desc_name_is_the_one_every_path_variable_uses() -> None:
    desc = dict(
        line.split(":", 1) for line in (EXT / "external.desc").read_text().splitlines() if line
    )
    name = desc["name"].strip()
    assert name == "NPU"
    assert len(desc.get("desc", "").strip()) <= 40, "Buildroot's manual asks for <= 40 chars"
    used = {
        m
        for f in EXT.rglob("*")
        if f.is_file()
        for m in re.findall(r"BR2_EXTERNAL_(\w+?)_PATH", f.read_text(errors="replace"))
    }
    assert used == {name}


def test_external_tree_sources_every_package_config_in_and_mk() -> None:
    sources = re.findall(r'^source "(.*)"$', (EXT / "Config.in").read_text(), re.M)
    assert sources == [f"$BR2_EXTERNAL_NPU_PATH/package/{p}/Config.in" for p in PACKAGES]
    includes = re.findall(r"^include (.*)$", (EXT / "external.mk").read_text(), re.M)
    assert includes == ["$(sort $(wildcard $(BR2_EXTERNAL_NPU_PATH)/package/*/*.mk))"]
    for pkg in PACKAGES:
        assert (EXT / "package" / pkg / f"{pkg}.mk").is_file()


# --- Kconfig -----------------------------------------------------------------


@pytest.mark.parametrize("config_in", CONFIG_INS)
def test_config_in_parses_with_kconfiglib_without_undefined_symbols(
    config_in: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if config_in == "Config.in":
        body = f'source "{EXT / config_in}"\n'
    else:
        # The symbols of the tree's other packages, so that only this file's
        # own references are checked.
        own = set(re.findall(r"^config (\w+)", (EXT / config_in).read_text(), re.M))
        others = {
            sym
            for p in PACKAGES
            for sym in re.findall(
                r"^config (\w+)", (EXT / "package" / p / "Config.in").read_text(), re.M
            )
        } - own
        body = "".join(f'config {s}\n\tbool "{s}"\n\n' for s in sorted(others))
        body += f'source "{EXT / config_in}"\n'
    kconf = _kconfig(tmp_path, monkeypatch, body)
    assert kconf.warnings == []
    assert EXT / config_in in {Path(f).resolve() for f in kconf.kconfig_filenames}


@pytest.mark.parametrize("pkg", PACKAGES)
def test_package_config_in_defines_its_symbol_with_the_package_name_as_prompt(
    pkg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kconf = _external_kconfig(tmp_path, monkeypatch)
    sym = kconf.syms[f"BR2_PACKAGE_{_upper(pkg)}"]
    assert [Path(n.filename).resolve() for n in sym.nodes] == [EXT / "package" / pkg / "Config.in"]
    assert sym.type == kconfiglib.BOOL
    assert [n.prompt[0] for n in sym.nodes if n.prompt] == [pkg]


def test_defconfig_sets_only_known_symbols_and_each_takes_the_value_it_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kconf = _external_kconfig(tmp_path, monkeypatch)
    kconf.warn_assign_undef = True
    # Buildroot's kconfig skips comment lines; kconfiglib, with the empty
    # CONFIG_ prefix, would read a comment holding "=" as an assignment.
    lines = DEFCONFIG.read_text().splitlines()
    config = tmp_path / "defconfig"
    config.write_text(
        "".join(f"{line}\n" for line in lines if not line.startswith("#") or "is not set" in line)
    )
    kconf.load_config(str(config))
    wanted = _defconfig()
    assert wanted, "the defconfig sets nothing"
    # A value other than the one asked for means an unmet dependency (a bool
    # stays n, a string stays empty) or a value of the wrong type.
    got = {name: kconf.syms[name].str_value for name in wanted}
    for sym in kconf.unique_defined_syms:  # evaluates every select, which may warn
        _ = sym.str_value
    assert kconf.warnings == []
    assert got == wanted


def test_defconfig_enables_every_package_of_the_tree_and_no_unknown_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kconf = _external_kconfig(tmp_path, monkeypatch)
    ours = {
        name
        for name in _defconfig()
        if name.startswith("BR2_PACKAGE_") and name not in BUILDROOT_SYMBOLS
    }
    assert ours == {f"BR2_PACKAGE_{_upper(p)}" for p in PACKAGES}
    for name in ours:
        files = {Path(n.filename).resolve() for n in kconf.syms[name].nodes}
        assert files, f"{name} is defined nowhere"
        assert all(f.is_relative_to(EXT / "package") for f in files), name
        assert _defconfig()[name] == "y", name


def test_defconfig_builds_a_6_12_kernel_from_x86_64_defconfig() -> None:
    values = _defconfig()
    assert values["BR2_LINUX_KERNEL_CUSTOM_VERSION"] == "y"
    assert re.fullmatch(r"6\.12\.\d+", values["BR2_LINUX_KERNEL_CUSTOM_VERSION_VALUE"])
    assert values["BR2_LINUX_KERNEL_USE_DEFCONFIG"] == "y"
    assert values["BR2_LINUX_KERNEL_DEFCONFIG"] == "x86_64"
    assert values["BR2_PACKAGE_HOST_LINUX_HEADERS_CUSTOM_6_12"] == "y"


def test_defconfig_kernel_fragment_is_the_debian_guests_npu_config() -> None:
    fragments = _defconfig()["BR2_LINUX_KERNEL_CONFIG_FRAGMENT_FILES"].split()
    assert [_expand_external(f) for f in fragments] == [GUEST / "kernel" / "npu.config"]
    assert (GUEST / "kernel" / "npu.config").is_file()
    # One source: no kernel configuration of its own in the tree.
    own = [
        f
        for f in EXT.rglob("*")
        if f.is_file() and re.search(r"(fragment|\.config|linux.*config)$", f.name)
    ]
    assert own == []


def test_defconfig_post_build_script_is_the_boards_and_executable() -> None:
    scripts = _defconfig()["BR2_ROOTFS_POST_BUILD_SCRIPT"].split()
    assert [_expand_external(s) for s in scripts] == [POST_BUILD]
    # Buildroot runs it directly, not through sh.
    assert POST_BUILD.stat().st_mode & stat.S_IXUSR
    assert POST_BUILD.read_text().startswith("#!/bin/sh\n")


# --- Package rules, as Buildroot's utils/check-package checks them ------------


@pytest.mark.parametrize("pkg", PACKAGES)
def test_mk_variables_are_prefixed_with_the_package_name(pkg: str) -> None:
    prefixes = (f"{_upper(pkg)}_", f"HOST_{_upper(pkg)}_")
    names = []
    in_define = False
    continued = False
    for n, line in enumerate(_mk_lines(pkg), 1):
        if continued:
            continued = line.endswith("\\")
            continue
        if in_define:
            in_define = line.strip() != "endef"
            continue
        if m := re.match(r"define\s+(\S+)", line):
            names.append((n, m[1]))
            in_define = True
        elif m := re.match(r"([A-Za-z0-9_.-]+)\s*(\+|:|\?|!)?=", line):
            names.append((n, m[1]))
        continued = line.endswith("\\")
    assert any(name == f"{_upper(pkg)}_VERSION" for _, name in names)
    bad = [f"{pkg}.mk:{n}: {name}" for n, name in names if not name.startswith(prefixes)]
    assert bad == []


@pytest.mark.parametrize("pkg", PACKAGES)
def test_mk_starts_with_the_standard_header(pkg: str) -> None:
    rule = "#" * 80
    assert _mk_lines(pkg)[:6] == [rule, "#", f"# {pkg}", "#", rule, ""]


@pytest.mark.parametrize("pkg", PACKAGES)
def test_mk_ends_with_the_eval_of_a_package_infrastructure(pkg: str) -> None:
    lines = [line for line in _mk_lines(pkg) if line.strip()]
    assert re.fullmatch(r"\$\(eval \$\((host-)?[a-z0-9]+(-[a-z0-9]+)*-package\)\)", lines[-1])
    evals = [line for line in lines if line.startswith("$(eval")]
    if "$(eval $(kernel-module))" in evals:
        # kernel-module only adds hooks; the package infrastructure comes after.
        assert evals == ["$(eval $(kernel-module))", lines[-1]]
    else:
        assert evals == [lines[-1]]


def _config_in_problems(path: Path) -> list[str]:
    """check-package's Config.in rules: indentation and help text layout."""
    entries = {"config", "menuconfig", "comment", "choice", "endchoice", "if", "endif"}
    entries |= {"menu", "endmenu", "source"}
    attributes = {"bool", "string", "int", "hex", "prompt", "default", "depends", "select"}
    attributes |= {"imply", "range", "help"}
    problems = []
    in_help = first_help_line = continued = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{path.relative_to(EXT)}:{n}"
        if continued:
            if not line.startswith("\t"):
                problems.append(f"{where}: continuation line not indented with a tab")
            continued = line.endswith("\\")
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if in_help and line.startswith("\t  "):
            text = line[3:]
            if first_help_line and text[0].isspace():
                problems.append(f"{where}: help text starts with extra indentation")
            if len(text) > 62 and not re.fullmatch(r"(https?|git)://\S*", text):
                problems.append(f"{where}: help text wider than <tab><2 spaces><62 chars>")
            first_help_line = False
            continue
        in_help = False
        word = line.split()[0]
        if word in entries:
            if line[0].isspace():
                problems.append(f"{where}: {word} should not be indented")
        elif word in attributes:
            if not line.startswith(f"\t{word}"):
                problems.append(f"{where}: {word} should be indented with one tab")
            in_help = first_help_line = word == "help"
        else:
            problems.append(f"{where}: not an entry, an attribute or <tab><2 spaces> help text")
        continued = line.endswith("\\")
    return problems


@pytest.mark.parametrize("config_in", CONFIG_INS)
def test_config_in_is_indented_with_tabs_and_help_text_with_a_tab_and_two_spaces(
    config_in: str,
) -> None:
    path = EXT / config_in
    assert _config_in_problems(path) == []
    if config_in != "Config.in":
        assert "\thelp\n\t  " in path.read_text(), "a package needs help text"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_each_package_has_a_well_formed_hash_file(pkg: str) -> None:
    path = EXT / "package" / pkg / f"{pkg}.hash"
    assert path.is_file()
    lengths = {"md5": 32, "sha1": 40, "sha224": 56, "sha256": 64, "sha384": 96, "sha512": 128}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        assert len(fields) == 3, line
        kind, digest, _ = fields
        assert re.fullmatch(rf"[0-9a-f]{{{lengths[kind]}}}", digest), line
        assert line == "  ".join(fields), "fields are separated by two spaces"
    assert path.read_text().startswith("#"), "say where the hashes come from"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_hash_file_covers_the_download_and_license_files_or_says_why_not(pkg: str) -> None:
    files = [entry[2] for entry in _hash_entries(pkg)]
    if _mk_assignments(pkg).get(f"{_upper(pkg)}_SITE_METHOD") == "local":
        # Nothing is downloaded, and Buildroot checks no hash of a local site.
        assert files == []
        assert "local" in (EXT / "package" / pkg / f"{pkg}.hash").read_text()
    else:
        licenses = _mk_value(pkg, "LICENSE_FILES").split()
        assert licenses, "a downloaded package names its license files"
        assert sorted(files) == sorted([_mk_value(pkg, "SOURCE"), *licenses])


@pytest.mark.parametrize("pkg", ["npu-driver", "python-npu"])
def test_local_package_version_is_the_runtime_version(pkg: str) -> None:
    assert _mk_value(pkg, "VERSION") == _runtime_version()


def test_python_ioctl_opt_version_is_the_debian_guests_pin() -> None:
    assert _mk_value("python-ioctl-opt", "VERSION") == _guest_pin("ioctl-opt")
    assert _mk_value("python-ioctl-opt", "SOURCE").startswith(
        f"ioctl_opt-{_guest_pin('ioctl-opt')}-"
    )


def test_local_packages_build_this_repositorys_driver_and_runtime() -> None:
    assert Path(_mk_value("python-npu", "SITE")).resolve() == ROOT / "runtime_py"
    assert (ROOT / "runtime_py" / "pyproject.toml").is_file()
    site = Path(_mk_value("npu-driver", "SITE")).resolve()
    subdir = _mk_value("npu-driver", "MODULE_SUBDIRS")
    kbuild = (site / subdir / "Kbuild").read_text()
    assert "obj-m" in kbuild
    # Whatever the Kbuild includes next to the driver is copied with it.
    filters = shlex.split(_mk_value("npu-driver", "OVERRIDE_SRCDIR_RSYNC_EXCLUSIONS"))
    wanted = {subdir, *re.findall(r"-I\$\(src\)/\.\./(\w+)", kbuild)}
    assert {f"--include=/{d}/" for d in wanted} <= set(filters)
    assert all((site / d).is_dir() for d in wanted)
    assert filters[-1] == "--exclude=/*", "the rest of the repository stays out"


# --- The root file system: the Debian guest's init and udev rule -------------


def _run_post_build(target: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "BR2_EXTERNAL_NPU_PATH": str(EXT)}
    env["TARGET_DIR"] = str(target)
    return subprocess.run(
        [str(POST_BUILD), str(target)], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A target directory as Buildroot's skeleton and eudev leave it."""
    root = tmp_path / "target"
    for d in ("etc", "sbin", "lib", "mnt", "usr/sbin"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "group").write_text("root:x:0:\ndaemon:x:1:\nusers:x:100:\nlegacy:x:999:\n")
    udevd = root / "sbin" / "udevd"
    udevd.write_text("#!/bin/sh\n")
    udevd.chmod(0o755)
    return root


def test_post_build_copies_the_debian_guests_init_and_udev_rule() -> None:
    # Static: the script's own variable and install lines, read as shell words.
    text = POST_BUILD.read_text()
    m = re.search(r"^guest=\$\{BR2_EXTERNAL_NPU_PATH:\?[^}]*\}(\S*)$", text, re.M)
    assert m, "post-build.sh finds guest/ from BR2_EXTERNAL_NPU_PATH"
    guest = (EXT / m[1].lstrip("/")).resolve()
    assert guest == GUEST
    installs = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] in (["install"], ["cp"]):
            src, dst = words[-2], words[-1]
            installs[src.replace("$guest", str(guest))] = dst
    assert installs == {
        str(GUEST / "npu-init"): "$target/sbin/npu-init",
        str(GUEST / "99-npu.rules"): "$target/etc/udev/rules.d/99-npu.rules",
    }


def test_running_post_build_installs_them_unchanged(target: Path) -> None:
    done = _run_post_build(target)
    assert done.returncode == 0, done.stderr
    init = target / "sbin" / "npu-init"
    assert init.read_bytes() == (GUEST / "npu-init").read_bytes()
    assert init.stat().st_mode & 0o777 == 0o755
    rule = target / "etc" / "udev" / "rules.d" / "99-npu.rules"
    assert rule.read_bytes() == (GUEST / "99-npu.rules").read_bytes()
    assert os.readlink(target / "sbin" / "init") == "npu-init"


def test_post_build_creates_the_npu_group_the_udev_rule_names(target: Path) -> None:
    assert _run_post_build(target).returncode == 0
    rule_groups = re.findall(r'GROUP="(\w+)"', (GUEST / "99-npu.rules").read_text())
    groups = [line.split(":") for line in (target / "etc" / "group").read_text().splitlines()]
    for name in rule_groups:
        gids = [int(g[2]) for g in groups if g[0] == name]
        assert len(gids) == 1, name
        assert 100 <= gids[0] < 1000, "a system group, as groupadd -r makes it"
    assert len({g[2] for g in groups}) == len(groups), "GIDs are unique"


def test_post_build_provides_the_udevd_path_npu_init_starts(target: Path) -> None:
    assert _run_post_build(target).returncode == 0
    commands = re.findall(r"^\s*(\S*udevd)\s+--daemon", (GUEST / "npu-init").read_text(), re.M)
    assert commands, "guest/npu-init starts udevd"
    for cmd in commands:
        if not cmd.startswith("/"):
            continue  # found on PATH
        path = target / cmd.lstrip("/")
        assert path.is_symlink() or path.is_file(), cmd
        if path.is_symlink():
            assert (target / os.readlink(path).lstrip("/")).is_file(), "it points at udevd"


def test_post_build_can_run_again_on_the_same_target(target: Path) -> None:
    # Buildroot runs post-build scripts again on every make.
    assert _run_post_build(target).returncode == 0
    first = (target / "etc" / "group").read_text()
    done = _run_post_build(target)
    assert done.returncode == 0, done.stderr
    assert (target / "etc" / "group").read_text() == first


def test_no_copy_of_the_init_script_or_udev_rule_is_kept_under_buildroot_config() -> None:
    originals = {(GUEST / f).read_bytes() for f in ("npu-init", "99-npu.rules")}
    files = [f for f in EXT.rglob("*") if f.is_file()]
    assert files, "nothing under buildroot_config/"
    by_name = [f for f in files if f.name in ("npu-init", "npu_init") or f.suffix == ".rules"]
    by_content = [f for f in files if f.read_bytes() in originals]
    assert by_name == []
    assert by_content == []


# --- scripts/buildroot.sh ----------------------------------------------------


def _fake_buildroot(root: Path, version: str) -> Path:
    tree = root / "buildroot"
    (tree / "package").mkdir(parents=True)
    (tree / "Makefile").write_text(f"# Buildroot\nexport BR2_VERSION := {version}\n")
    (tree / "package" / "Config.in").write_text("")
    return tree


def _run_buildroot_sh(
    tmp_path: Path,
    buildroot_dir: Path,
    extra_env: dict[str, str] | None = None,
    makes_images: bool = True,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    """Run scripts/buildroot.sh with a fake make that logs its calls.

    Asked for "all", the fake make writes the two images as Buildroot does
    (unless ``makes_images`` is false).
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "make.log"
    fake = bin_dir / "make"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, pathlib, sys\n"
        "args = sys.argv[1:]\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    call = {'args': args, 'makeflags': os.environ.get('MAKEFLAGS')}\n"
        "    f.write(json.dumps(call) + '\\n')\n"
        f"if {makes_images!r} and 'all' in args:\n"
        "    out = pathlib.Path([a[2:] for a in args if a.startswith('O=')][0])\n"
        "    (out / 'images').mkdir(parents=True, exist_ok=True)\n"
        "    for name in ('bzImage', 'rootfs.ext4'):\n"
        "        (out / 'images' / name).write_text('')\n"
    )
    fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "NPU_CACHE": str(tmp_path / "cache"),
        "BUILDROOT_DIR": str(buildroot_dir),
        **(extra_env or {}),
    }
    done = subprocess.run(
        ["bash", str(BUILDROOT_SH)], env=env, capture_output=True, text=True, timeout=60
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def test_buildroot_sh_refuses_a_directory_that_is_not_a_buildroot_tree(tmp_path: Path) -> None:
    not_buildroot = tmp_path / "empty"
    not_buildroot.mkdir()
    (not_buildroot / "Makefile").write_text("all:\n")  # a Makefile alone is not enough
    done, calls = _run_buildroot_sh(tmp_path, not_buildroot)
    assert done.returncode != 0
    assert f"BUILDROOT_DIR={not_buildroot} is not a Buildroot tree" in done.stderr
    assert calls == []


def test_buildroot_sh_runs_the_defconfig_then_the_build_into_npu_cache(tmp_path: Path) -> None:
    tree = _fake_buildroot(tmp_path, "2025.02.3")
    done, calls = _run_buildroot_sh(tmp_path, tree)
    assert done.returncode == 0, done.stderr
    common = ["-C", str(tree), f"BR2_EXTERNAL={EXT}", f"O={tmp_path / 'cache' / 'buildroot'}"]
    assert [c["args"] for c in calls] == [
        [*common, "npu_qemu_x86_64_defconfig"],
        [*common, "all"],
    ]
    assert "warning" not in done.stderr


def test_buildroot_sh_warns_about_a_buildroot_other_than_2025_02(tmp_path: Path) -> None:
    tree = _fake_buildroot(tmp_path, "2024.11.1")
    done, calls = _run_buildroot_sh(tmp_path, tree)
    assert done.returncode == 0, done.stderr
    assert "warning:" in done.stderr
    assert "2024.11.1" in done.stderr
    assert "2025.02" in done.stderr
    assert len(calls) == 2


def test_buildroot_sh_keeps_the_callers_make_flags_from_buildroot(tmp_path: Path) -> None:
    # make buildroot -j4 must not turn into a parallel top-level Buildroot make.
    tree = _fake_buildroot(tmp_path, "2025.02")
    done, calls = _run_buildroot_sh(tmp_path, tree, {"MAKEFLAGS": "-j4 BUILDROOT_DIR=x"})
    assert done.returncode == 0, done.stderr
    assert [c["makeflags"] for c in calls] == [None, None]


def test_buildroot_sh_fails_when_the_build_leaves_no_images(tmp_path: Path) -> None:
    tree = _fake_buildroot(tmp_path, "2025.02.1")
    done, calls = _run_buildroot_sh(tmp_path, tree, makes_images=False)
    assert len(calls) == 2
    assert done.returncode != 0
    assert "images/bzImage" in done.stderr
