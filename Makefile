# NPU stack: build, run and test everything from here.
#
#   make demo     build what is missing, boot the guest, load the driver and
#                 run the example inference script
#   make test     host tests + the guest suite (boots the guest once)
#   make stress   the reliability suite at full size (tests/stress/; long)
#
# NPU_KERNEL=debug runs any guest command (demo, shell, guest-run, bench,
# test-guest) on the debug kernel (KASAN, lockdep, kmemleak, fault injection).
#
# Build products are cached outside the clone, in $(NPU_CACHE), keyed by
# their inputs, so a fresh clone on the same machine rebuilds nothing.

NPU_CACHE ?= $(HOME)/.cache/npu-stack
export NPU_CACHE
VENV := $(NPU_CACHE)/venv
PY := $(VENV)/bin/python
GUEST := $(PY) scripts/guest.py
# The kernel the guest commands boot: distro (Debian 13's) or debug.
NPU_KERNEL ?= distro
export NPU_KERNEL
ifeq ($(NPU_KERNEL),debug)
GUEST_DEPS := qemu guest module-debug
else
GUEST_DEPS := qemu guest module
endif
# make demo DEMO=examples/hello_npu.py runs the first-contact script instead.
DEMO ?= examples/infer_digits.py

.PHONY: all deps qemu qemu-asan guest kernel-debug module module-debug firmware demo test \
	test-host test-guest coverage-debug-full lint bench bench-guest-baselines ci-times shell guest-run models resnet50 zoo clean help stress buildroot \
	fresh-check

all: qemu guest module

help:
	@sed -n '1,16p' Makefile

deps:
	@bash scripts/deps.sh

qemu: deps
	@mkdir -p $(NPU_CACHE) && flock $(NPU_CACHE)/qemu.lock bash scripts/build-qemu.sh

# QEMU with AddressSanitizer and UBSan: the qtest suite runs against it.
qemu-asan: deps
	@mkdir -p $(NPU_CACHE) && flock $(NPU_CACHE)/qemu-asan.lock bash scripts/build-qemu.sh asan

guest: deps
	@mkdir -p $(NPU_CACHE) && flock $(NPU_CACHE)/guest.lock bash scripts/build-guest.sh

# The debug kernel (guest/kernel/*.config), built from Debian 13's source.
kernel-debug: guest
	@flock $(NPU_CACHE)/kernel.lock bash scripts/build-kernel.sh

# npu.ko for the distribution kernel / the debug kernel (build/module/<kver>/).
module: guest firmware
	@bash scripts/build-module.sh distro

module-debug: kernel-debug firmware
	@bash scripts/build-module.sh debug

# The firmware image; the guest installs it into /lib/firmware/npu/ at boot.
firmware: build/firmware/npu/npu_fw.bin

# deps first (order only): on a new machine python3 comes with it, and
# make -j2 would otherwise start mkfw.py before it is there.
build/firmware/npu/npu_fw.bin: firmware/npu_fw.json scripts/mkfw.py include/npu_hw.h include/npu_fw.h | deps
	@python3 scripts/mkfw.py $< -o $@

demo: $(GUEST_DEPS) resnet50
	@$(GUEST) run -- python3 $(DEMO)

# Host tests (qtests on the ASan QEMU), the guest suite on the distribution
# kernel, then the driver's files on the debug kernel behind an IOMMU, then
# fault injection. Two workers, in tests/conftest.py's order (no xdist
# reordering): the debug pass starts at once on one, the distribution
# kernel's guest files on the other, the host tests fill in after.
# Short soak sizes and a fixed seed (make stress: full sizes, a new seed).
test: qemu qemu-asan guest module module-debug resnet50 zoo
	@NPU_MAKE_TEST=1 NPU_KERNEL=distro NPU_STRESS_SCALE=short $(PY) -m pytest -n 2 --dist loadfile \
		--no-loadscope-reorder --durations=40 tests

# The debug pass over every guest file, not only the driver's (about twice
# as long): its npu.ko line coverage (build/debug-pass-full.json) is the
# figure the debug pass of make test (build/debug-pass.json) must not fall
# below (docs/benchmarks.md).
coverage-debug-full: qemu guest module-debug resnet50
	@NPU_DEBUG_PASS=full $(PY) -m pytest tests/test_guest_debug.py

# The host tests; the guest's root tree (make guest) is where the ONNX
# conformance suite's host part runs (in a chroot: the guest's own Python).
test-host: deps qemu-asan guest zoo
	@$(PY) -m pytest tests/host

test-guest: $(GUEST_DEPS) resnet50
	@$(PY) -m pytest tests --ignore=tests/host

# The reliability suite at the issue's sizes and the guest suite with its
# soak loops at full size on two vCPUs (make test runs both short, with a fixed seed;
# here each run draws a new seed, printed), then 10 minutes of
# coverage-guided fuzzing of the device (docs/fuzzing.md).
stress: $(GUEST_DEPS) fuzz-build
	@NPU_SMP=2 NPU_STRESS_SCALE=full $(PY) -m pytest tests/test_stress_suite.py tests/test_guest_suite.py
	@$(PY) tests/fuzz/run_fuzz.py --time 600

lint: deps qemu module
	@bash scripts/lint.sh

# The Buildroot image (buildroot_config/); needs a Buildroot 2025.02 tree
# and internet access: make buildroot BUILDROOT_DIR=~/buildroot-2025.02.x
buildroot: deps
	@mkdir -p $(NPU_CACHE) && BUILDROOT_DIR="$(BUILDROOT_DIR)" flock $(NPU_CACHE)/buildroot.lock bash scripts/buildroot.sh

# Regenerate the example models in examples/models/ (host numpy; deterministic),
# and make ResNet-50 and the benchmark zoo (build/models/, not committed).
models: deps resnet50 zoo
	@$(PY) examples/models/train_digits.py -q
	@$(PY) examples/models/make_resnet.py
	@$(PY) examples/models/quantize_models.py -q

# ResNet-50 with seeded weights and its sample (about 15 s; skipped when up to date).
resnet50: deps
	@$(PY) examples/models/make_resnet50.py

# The benchmark zoo: DenseNet-121, Inception v2, SqueezeNet 1.1, ShuffleNet v2,
# MobileNet v2 and VGG-19 with seeded weights, and onnxruntime's logits of the
# ResNet-50 sample (about a minute, ~700 MB; each model skipped when up to date).
zoo: deps resnet50
	@$(PY) examples/models/make_zoo.py

bench: $(GUEST_DEPS) resnet50 zoo
	@$(PY) scripts/bench.py

# CI's figures (fresh-machine and cached make test times, the debug pass,
# npu.ko's line coverage) from the runs' files in build/, as JSON
# (build/ci-times.json; make bench merges them).
ci-times: deps
	@$(PY) scripts/ci_times.py

# make bench plus ResNet-50 on the guest's own onnxruntime and numpy (TCG:
# over 15 minutes more).
bench-guest-baselines: $(GUEST_DEPS) resnet50 zoo
	@$(PY) scripts/bench.py --guest-baselines

shell: $(GUEST_DEPS)
	@$(GUEST) shell

# make guest-run CMD='python3 examples/hello_npu.py'
guest-run: $(GUEST_DEPS)
	@$(GUEST) run -- $(CMD)

clean:
	rm -rf build

# The proof that `make demo` works on a new machine: a clean Debian root
# (debootstrap; cached, copied afresh each time), this working tree copied
# in, an empty cache, `make demo` in a chroot (about 30 min). FRESH_RELEASE:
# bookworm, trixie or auto (this host's release); FRESH_ARGS=--head checks
# the last commit instead, FRESH_ARGS=--test runs make test there too (about
# an hour more). Results: build/fresh-check-<release>.{log,json}.
# See scripts/fresh-check.sh (also: its key, and its ci mode).
FRESH_RELEASE ?= auto
FRESH_ARGS ?=
fresh-check:
	@bash scripts/fresh-check.sh $(FRESH_ARGS) $(FRESH_RELEASE)

# Coverage-guided fuzzing of the device model (docs/fuzzing.md; not part of
# make test): QEMU's libFuzzer binary with ASan and UBSan
# (scripts/build-qemu-fuzz.sh), the generic-fuzz-npu configuration and the
# seeds of tests/fuzz/corpus/; findings go to build/fuzz/crashes/ and fail
# the target. make fuzz-device FUZZ_TIME=1800 FUZZ_ARGS='--jobs 2'
FUZZ_TIME ?= 600
FUZZ_ARGS ?=
.PHONY: fuzz-build fuzz-device

fuzz-build: deps
	@bash scripts/build-qemu-fuzz.sh

fuzz-device: fuzz-build
	@$(PY) tests/fuzz/run_fuzz.py --time $(FUZZ_TIME) $(FUZZ_ARGS)
