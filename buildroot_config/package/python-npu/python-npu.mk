################################################################################
#
# python-npu
#
################################################################################

# The runtime of this repository; its version is the one of
# runtime_py/pyproject.toml (tests/host/test_buildroot.py keeps them equal).
PYTHON_NPU_VERSION = 0.1.0
PYTHON_NPU_SITE = $(BR2_EXTERNAL_NPU_PATH)/../runtime_py
PYTHON_NPU_SITE_METHOD = local
PYTHON_NPU_SETUP_TYPE = setuptools
PYTHON_NPU_LICENSE = MIT
# Leave out what a host checkout accumulates (byte code, build trees).
PYTHON_NPU_OVERRIDE_SRCDIR_RSYNC_EXCLUSIONS = \
	--exclude=__pycache__ --exclude='*.egg-info' --exclude=/build \
	--exclude=/dist

$(eval $(python-package))
