################################################################################
#
# npu-driver
#
################################################################################

# The driver of this repository, versioned with the runtime
# (runtime_py/pyproject.toml; tests/host/test_buildroot.py keeps them equal).
NPU_DRIVER_VERSION = 0.1.0
# The site is the repository top, not kernel_module/: the driver's Kbuild
# adds -I$(src)/../include, so include/ must sit beside kernel_module/ in
# the build directory as it does in the repository.
NPU_DRIVER_SITE = $(BR2_EXTERNAL_NPU_PATH)/..
NPU_DRIVER_SITE_METHOD = local
NPU_DRIVER_LICENSE = GPL-2.0
NPU_DRIVER_MODULE_SUBDIRS = kernel_module

# Copy only kernel_module/ and include/ (not the rest of the repository),
# and none of the in-tree kbuild products of a Debian guest build: they are
# built for another kernel. rsync stops at the first rule that matches.
NPU_DRIVER_OVERRIDE_SRCDIR_RSYNC_EXCLUSIONS = \
	--exclude='*.o' --exclude='*.ko' --exclude='*.mod' --exclude='*.mod.c' \
	--exclude='.*.cmd' --exclude=Module.symvers --exclude=modules.order \
	--exclude=.tmp_versions \
	--include=/include/ --include=/kernel_module/ --exclude='/*'

$(eval $(kernel-module))
$(eval $(generic-package))
