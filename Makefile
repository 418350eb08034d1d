# NPU stack: build, run and test everything from here.
#
#   make demo     build what is missing, boot the guest, load the driver and
#                 run the example inference script
#   make test     host tests + the guest suite (boots the guest once)
#   make stress   the reliability suite at full size (tests/stress/; long)
#
# Build products are cached outside the clone, in $(NPU_CACHE), keyed by
# their inputs, so a fresh clone on the same machine rebuilds nothing.

NPU_CACHE ?= $(HOME)/.cache/npu-stack
export NPU_CACHE
VENV := $(NPU_CACHE)/venv
PY := $(VENV)/bin/python
GUEST := $(PY) scripts/guest.py
KVER = $(shell cat $(NPU_CACHE)/guest/current/kver)
# make demo DEMO=examples/hello_npu.py runs the first-contact script instead.
DEMO ?= examples/infer_digits.py

.PHONY: all deps qemu guest module firmware demo test test-host test-guest lint bench \
	shell guest-run models clean help stress

all: qemu guest module

help:
	@sed -n '1,13p' Makefile

deps:
	@bash scripts/deps.sh

qemu: deps
	@mkdir -p $(NPU_CACHE) && flock $(NPU_CACHE)/qemu.lock bash scripts/build-qemu.sh

guest: deps
	@mkdir -p $(NPU_CACHE) && flock $(NPU_CACHE)/guest.lock bash scripts/build-guest.sh

module: guest firmware
	@$(MAKE) -s -C kernel_module KVER=$(KVER)

# The firmware image; the guest installs it into /lib/firmware/npu/ at boot.
firmware: build/firmware/npu/npu_fw.bin

build/firmware/npu/npu_fw.bin: firmware/npu_fw.json scripts/mkfw.py include/npu_hw.h include/npu_fw.h
	@python3 scripts/mkfw.py $< -o $@

demo: qemu guest module
	@$(GUEST) run -- python3 $(DEMO)

test: qemu guest module
	@$(PY) -m pytest tests

test-host: deps
	@$(PY) -m pytest tests/host

test-guest: qemu guest module
	@$(PY) -m pytest tests --ignore=tests/host

# The reliability suite at the issue's sizes (make test runs it short).
stress: qemu guest module
	@NPU_STRESS_SCALE=full $(PY) -m pytest tests/test_stress_suite.py

lint: deps qemu module
	@bash scripts/lint.sh

# Regenerate the example models in examples/models/ (host numpy; deterministic).
models: deps
	@$(PY) examples/models/train_digits.py -q
	@$(PY) examples/models/make_resnet.py

bench: qemu guest module
	@$(PY) scripts/bench.py

shell: qemu guest module
	@$(GUEST) shell

# make guest-run CMD='python3 examples/hello_npu.py'
guest-run: qemu guest module
	@$(GUEST) run -- $(CMD)

clean:
	@$(MAKE) -s -C kernel_module KVER=$(KVER) clean
	rm -rf build
