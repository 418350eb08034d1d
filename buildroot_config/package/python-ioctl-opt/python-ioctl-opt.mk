################################################################################
#
# python-ioctl-opt
#
################################################################################

# The version guest/requirements.txt pins for the Debian guest. PyPI has
# ioctl-opt 1.3.1 as a wheel only (1.3 is the last release with an sdist),
# so this installs that pure-Python wheel, the same file pip installs into
# the Debian guest, with Buildroot's wheel installer (the one the
# python-package infrastructure runs for pep517 packages) instead of
# building an sdist with setuptools.
PYTHON_IOCTL_OPT_VERSION = 1.3.1
PYTHON_IOCTL_OPT_SOURCE = ioctl_opt-$(PYTHON_IOCTL_OPT_VERSION)-py3-none-any.whl
PYTHON_IOCTL_OPT_SITE = https://files.pythonhosted.org/packages/7f/ba/2a8796dfa24e8ac9fbbffe4e70c9cdab6fa088122b258ab53354ba8af490
PYTHON_IOCTL_OPT_LICENSE = LGPL-2.0+
PYTHON_IOCTL_OPT_LICENSE_FILES = \
	ioctl_opt-$(PYTHON_IOCTL_OPT_VERSION).dist-info/licenses/COPYING \
	ioctl_opt-$(PYTHON_IOCTL_OPT_VERSION).dist-info/licenses/COPYING.LESSER
PYTHON_IOCTL_OPT_DEPENDENCIES = host-python3 host-python-installer python3

# A wheel is a zip archive: unpack it for the license files, install the
# wheel itself.
define PYTHON_IOCTL_OPT_EXTRACT_CMDS
	$(UNZIP) -d $(@D) $(PYTHON_IOCTL_OPT_DL_DIR)/$(PYTHON_IOCTL_OPT_SOURCE)
endef

define PYTHON_IOCTL_OPT_INSTALL_TARGET_CMDS
	$(HOST_DIR)/bin/python3 $(TOPDIR)/support/scripts/pyinstaller.py \
		$(PYTHON_IOCTL_OPT_DL_DIR)/$(PYTHON_IOCTL_OPT_SOURCE) \
		--interpreter=/usr/bin/python \
		--script-kind=posix \
		--purelib=$(TARGET_DIR)/usr/lib/python$(PYTHON3_VERSION_MAJOR)/site-packages \
		--headers=$(TARGET_DIR)/usr/include/python$(PYTHON3_VERSION_MAJOR) \
		--scripts=$(TARGET_DIR)/usr/bin \
		--data=$(TARGET_DIR)/usr
endef

$(eval $(generic-package))
