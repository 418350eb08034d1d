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
	test-host test-guest lint bench shell guest-run models resnet50 zoo clean help stress buildroot

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

build/firmware/npu/npu_fw.bin: firmware/npu_fw.json scripts/mkfw.py include/npu_hw.h include/npu_fw.h
	@python3 scripts/mkfw.py $< -o $@

demo: $(GUEST_DEPS) resnet50
	@$(GUEST) run -- python3 $(DEMO)

# Host tests (qtests on the ASan QEMU), the guest suite on the distribution
# kernel, then on the debug kernel behind an IOMMU, then fault injection.
test: qemu qemu-asan guest module module-debug resnet50 zoo
	@NPU_KERNEL=distro $(PY) -m pytest -n 2 --dist loadfile tests

test-host: deps qemu-asan zoo
	@$(PY) -m pytest tests/host

test-guest: $(GUEST_DEPS) resnet50
	@$(PY) -m pytest tests --ignore=tests/host

# The reliability suite at the issue's sizes (make test runs it short),
# then 10 minutes of coverage-guided fuzzing of the device (docs/fuzzing.md).
stress: $(GUEST_DEPS) fuzz-build
	@NPU_STRESS_SCALE=full $(PY) -m pytest tests/test_stress_suite.py
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

shell: $(GUEST_DEPS)
	@$(GUEST) shell

# make guest-run CMD='python3 examples/hello_npu.py'
guest-run: $(GUEST_DEPS)
	@$(GUEST) run -- $(CMD)

clean:
	rm -rf build

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
