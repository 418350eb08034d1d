# NPU stack: build, run and test everything from here.
#
#   make demo     build what is missing, boot the guest, load the driver and
#                 run the example inference script
#   make test     host tests + the guest suite (boots the guest once)
#
# Build products are cached outside the clone, in $(NPU_CACHE), keyed by
# their inputs, so a fresh clone on the same machine rebuilds nothing.

NPU_CACHE ?= $(HOME)/.cache/npu-stack
export NPU_CACHE
VENV := $(NPU_CACHE)/venv
PY := $(VENV)/bin/python
GUEST := $(PY) scripts/guest.py
KVER = $(shell cat $(NPU_CACHE)/guest/current/kver)
DEMO ?= examples/hello_npu.py

.PHONY: all deps qemu guest module demo test test-host test-guest lint bench \
	shell guest-run clean help

all: qemu guest module

help:
	@sed -n '1,12p' Makefile

deps:
	@bash scripts/deps.sh

qemu: deps
	@bash scripts/build-qemu.sh

guest: deps
	@bash scripts/build-guest.sh

module: guest
	@$(MAKE) -s -C kernel_module KVER=$(KVER)

demo: qemu guest module
	@$(GUEST) run -- python3 $(DEMO)

test: qemu guest module
	@$(PY) -m pytest tests

test-host: deps
	@$(PY) -m pytest tests/host

test-guest: qemu guest module
	@$(PY) -m pytest tests --ignore=tests/host

lint: deps qemu module
	@bash scripts/lint.sh

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
