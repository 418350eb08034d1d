// SPDX-License-Identifier: GPL-2.0
/*
 * NPU firmware: load the image with request_firmware(), hand it to the
 * device by DMA and boot it; the mailbox (one request at a time, with a
 * timeout); the firmware log ring; the heartbeat the watchdog checks.
 * The image format is include/npu_fw.h (docs/firmware.md).
 */
#include <linux/crc32.h>
#include <linux/dma-mapping.h>
#include <linux/firmware.h>
#include <linux/iopoll.h>
#include <linux/moduleparam.h>
#include <linux/unaligned.h>

#include "npu_drv.h"
#include "npu_fw.h"

#define NPU_FW_LOG_BYTES	SZ_16K
#define NPU_FW_BOOT_US		USEC_PER_SEC
#define NPU_MBOX_TIMEOUT_US	(100 * USEC_PER_MSEC)

static char *fw_name = NPU_FW_NAME;
module_param(fw_name, charp, 0444);
MODULE_PARM_DESC(fw_name, "Firmware image, relative to /lib/firmware");

static const char * const npu_fw_errors[] = {
	[NPU_FWERR_NONE] = "no error",
	[NPU_FWERR_DMA] = "image unreadable by DMA",
	[NPU_FWERR_SIZE] = "bad size",
	[NPU_FWERR_MAGIC] = "bad magic",
	[NPU_FWERR_ABI] = "built for another ABI",
	[NPU_FWERR_CHECKSUM] = "checksum mismatch",
	[NPU_FWERR_FORMAT] = "malformed sections",
};

static const char *npu_fw_error_str(u32 err)
{
	return err < ARRAY_SIZE(npu_fw_errors) ? npu_fw_errors[err] : "unknown error";
}

/*
 * The heartbeat period the image asks for (NPU_FW_SEC_HEARTBEAT), or the
 * device's default; the device validates the sections.
 */
static u32 npu_fw_heartbeat_us(const u8 *p, size_t len)
{
	while (len >= sizeof(struct npu_fw_section)) {
		u32 type = get_unaligned_le32(p), n = get_unaligned_le32(p + 4);
		size_t padded = round_up((size_t)n, 4);

		p += sizeof(struct npu_fw_section);
		len -= sizeof(struct npu_fw_section);
		if (padded > len)
			break;
		if (type == NPU_FW_SEC_HEARTBEAT && n == 4)
			return get_unaligned_le32(p);
		p += padded;
		len -= padded;
	}
	return NPU_FW_DEFAULT_HB_US;
}

/*
 * The checks the driver can make before the device sees the image, for a
 * clear message; the device checks everything again.
 */
static int npu_fw_check(struct npu_device *ndev, const struct firmware *fw)
{
	const struct npu_fw_header *h = (const void *)fw->data;
	struct device *dev = &ndev->pdev->dev;

	if (fw->size < sizeof(*h) || fw->size > NPU_FW_MAX_SIZE) {
		dev_err(dev, "firmware %s: size %zu outside %zu..%u\n", fw_name,
			fw->size, sizeof(*h), NPU_FW_MAX_SIZE);
		return -EINVAL;
	}
	if (get_unaligned_le32(&h->magic) != NPU_FW_MAGIC) {
		dev_err(dev, "firmware %s: not an NPU image (magic 0x%08x)\n", fw_name,
			get_unaligned_le32(&h->magic));
		return -EINVAL;
	}
	if (get_unaligned_le32(&h->abi_version) != NPU_ABI_VERSION) {
		dev_err(dev, "firmware %s: built for ABI %u, the driver speaks %u\n",
			fw_name, get_unaligned_le32(&h->abi_version), NPU_ABI_VERSION);
		return -EINVAL;
	}
	if (get_unaligned_le32(&h->payload_size) != fw->size - sizeof(*h) ||
	    ~crc32_le(~0, fw->data + sizeof(*h), fw->size - sizeof(*h)) !=
	    get_unaligned_le32(&h->payload_crc)) {
		dev_err(dev, "firmware %s: corrupt (size or checksum)\n", fw_name);
		return -EINVAL;
	}
	ndev->fw_hb_us = npu_fw_heartbeat_us(fw->data + sizeof(*h), fw->size - sizeof(*h));
	return 0;
}

/* Boot the kept image; the device is reset and its firmware not running. */
int npu_fw_boot(struct npu_device *ndev)
{
	struct device *dev = &ndev->pdev->dev;
	u32 st;
	int ret;

	if (!ndev->fw_image)
		return -ENOENT;
	if (ndev->fw_log) {
		memset(ndev->fw_log, 0, sizeof(*ndev->fw_log));
		npu_wr(ndev, NPU_REG_FW_LOG_LO, lower_32_bits(ndev->fw_log_dma));
		npu_wr(ndev, NPU_REG_FW_LOG_HI, upper_32_bits(ndev->fw_log_dma));
		npu_wr(ndev, NPU_REG_FW_LOG_SIZE, NPU_FW_LOG_BYTES);
	}
	npu_wr(ndev, NPU_REG_FW_ADDR_LO, lower_32_bits(ndev->fw_image_dma));
	npu_wr(ndev, NPU_REG_FW_ADDR_HI, upper_32_bits(ndev->fw_image_dma));
	npu_wr(ndev, NPU_REG_FW_SIZE, ndev->fw_image_size);
	npu_wr(ndev, NPU_REG_FW_CONTROL, NPU_FW_BOOT);
	ret = readl_poll_timeout(ndev->regs + NPU_REG_FW_STATUS, st,
				 st != NPU_FW_OFF, 10, NPU_FW_BOOT_US);
	if (ret) {
		dev_err(dev, "firmware did not start\n");
		return ret;
	}
	if (st != NPU_FW_RUNNING) {
		dev_err(dev, "firmware %s rejected by the device: %s\n", fw_name,
			npu_fw_error_str(npu_rd(ndev, NPU_REG_FW_ERROR)));
		return -ENOEXEC;
	}
	ndev->fw_version = npu_rd(ndev, NPU_REG_FW_VERSION);
	npu_fw_heartbeat_reset(ndev);
	return 0;
}

/*
 * Load and boot the firmware at probe. The image stays (device-managed
 * DMA memory) to boot it again after a crash.
 */
int npu_fw_init(struct npu_device *ndev)
{
	struct device *dev = &ndev->pdev->dev;
	const struct firmware *fw;
	int ret;

	mutex_init(&ndev->mbox_lock);
	ndev->fw_log = dmam_alloc_coherent(dev, sizeof(*ndev->fw_log) + NPU_FW_LOG_BYTES,
					   &ndev->fw_log_dma, GFP_KERNEL);
	if (!ndev->fw_log)
		return -ENOMEM;
	/* A firmware left running (by an earlier binding, or a ROM) goes. */
	npu_wr(ndev, NPU_REG_FW_CONTROL, NPU_FW_STOP);
	ret = request_firmware(&fw, fw_name, dev);
	if (ret) {
		dev_err(dev, "firmware %s unavailable: %d\n", fw_name, ret);
		return ret;
	}
	ret = npu_fw_check(ndev, fw);
	if (ret)
		goto out_release;
	ndev->fw_image = dmam_alloc_coherent(dev, fw->size, &ndev->fw_image_dma, GFP_KERNEL);
	if (!ndev->fw_image) {
		ret = -ENOMEM;
		goto out_release;
	}
	memcpy(ndev->fw_image, fw->data, fw->size);
	ndev->fw_image_size = fw->size;
	ret = npu_fw_boot(ndev);
	if (!ret)
		dev_info(dev, "firmware %s %u.%u booted\n", fw_name,
			 ndev->fw_version >> 16, ndev->fw_version & 0xffff);
out_release:
	release_firmware(fw);
	return ret;
}

/*
 * One mailbox request: -ETIMEDOUT when the firmware does not answer, else
 * the errno of its status, with its two result words in @resp.
 */
int npu_mbox_call(struct npu_device *ndev, u32 cmd, u32 arg0, u32 arg1, u32 *resp)
{
	u32 seq, got, st;
	int ret;

	mutex_lock(&ndev->mbox_lock);
	seq = ++ndev->mbox_seq;
	npu_wr(ndev, NPU_REG_MBOX_CMD, cmd);
	npu_wr(ndev, NPU_REG_MBOX_ARG0, arg0);
	npu_wr(ndev, NPU_REG_MBOX_ARG1, arg1);
	npu_wr(ndev, NPU_REG_MBOX_SEQ, seq);
	ret = readl_poll_timeout(ndev->regs + NPU_REG_MBOX_RESP_SEQ, got, got == seq,
				 10, NPU_MBOX_TIMEOUT_US);
	if (!ret) {
		st = npu_rd(ndev, NPU_REG_MBOX_RESP_STATUS);
		resp[0] = npu_rd(ndev, NPU_REG_MBOX_RESP0);
		resp[1] = npu_rd(ndev, NPU_REG_MBOX_RESP1);
		ret = st == NPU_MBOX_OK ? 0 : st == NPU_MBOX_BAD_ARG ? -EINVAL :
		      st == NPU_MBOX_BUSY ? -EBUSY : -EOPNOTSUPP;
	}
	mutex_unlock(&ndev->mbox_lock);
	return ret;
}

/* Start watching the heartbeat afresh (after a boot or a recovery). */
void npu_fw_heartbeat_reset(struct npu_device *ndev)
{
	ndev->hb_last = npu_rd(ndev, NPU_REG_FW_HEARTBEAT);
	ndev->hb_since = jiffies;
}

/*
 * Called by the watchdog every period: true when the heartbeat stood
 * still for NPU_HB_MISSES heartbeat periods of the image, and at least
 * NPU_HB_MISSES watchdog periods (the firmware is lost).
 */
bool npu_fw_heartbeat_lost(struct npu_device *ndev)
{
	u32 hb = npu_rd(ndev, NPU_REG_FW_HEARTBEAT);
	unsigned long grace = max(usecs_to_jiffies(ndev->fw_hb_us * NPU_HB_MISSES),
				  NPU_HB_MISSES * msecs_to_jiffies(100));

	if (hb != ndev->hb_last) {
		ndev->hb_last = hb;
		ndev->hb_since = jiffies;
		return false;
	}
	return time_after(jiffies, ndev->hb_since + grace);
}

/* The log ring as text, oldest first, into @buf; returns the length. */
size_t npu_fw_log_read(struct npu_device *ndev, char *buf, size_t len)
{
	u32 w = READ_ONCE(ndev->fw_log->write);
	u32 n = min_t(u32, w, NPU_FW_LOG_BYTES);
	const char *text = (const char *)(ndev->fw_log + 1);
	u32 i;

	n = min_t(u32, n, len);
	for (i = 0; i < n; i++)
		buf[i] = text[(w - n + i) & (NPU_FW_LOG_BYTES - 1)];
	return n;
}

/* The driver lets go of the device: stop the firmware. */
void npu_fw_stop(struct npu_device *ndev)
{
	npu_wr(ndev, NPU_REG_FW_CONTROL, NPU_FW_STOP);
}
