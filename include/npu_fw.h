/* SPDX-License-Identifier: MIT */
/*
 * NPU firmware image format, shared by the image builder
 * (scripts/mkfw.py), the device model (qemu_device/npu_fw.c) and the
 * driver (kernel_module/npu_fw.c). docs/firmware.md is the prose version.
 *
 * An image is a 64-byte header followed by payload_size bytes of
 * sections, all little endian. The header's CRC-32 (IEEE, zlib's) covers
 * the header with header_crc = 0; payload_crc covers the payload.
 * Sections are {type, length, data padded to 4 bytes}; a section whose
 * type has NPU_FW_SEC_OPTIONAL set may be ignored by a device that does
 * not know it, any other unknown type fails the boot (NPU_FWERR_FORMAT).
 */
#ifndef NPU_FW_H
#define NPU_FW_H

#include <linux/types.h>

#define NPU_FW_MAGIC		0x4657504e	/* "NPWF" */
#define NPU_FW_HEADER_SIZE	64
#define NPU_FW_NAME		"npu/npu_fw.bin"	/* under /lib/firmware */
#define NPU_FW_DEFAULT_HB_US	10000	/* heartbeat period without a section */

struct npu_fw_header {
	__u32 magic;		/* NPU_FW_MAGIC */
	__u32 header_size;	/* NPU_FW_HEADER_SIZE */
	__u32 version;		/* major << 16 | minor */
	__u32 abi_version;	/* NPU_ABI_VERSION it was built for */
	__u32 payload_size;	/* bytes of sections after the header */
	__u32 payload_crc;	/* CRC-32 of the payload */
	__u32 header_crc;	/* CRC-32 of the header with this field 0 */
	__u32 flags;		/* zero */
	char build_id[32];	/* NUL-padded text */
};

struct npu_fw_section {
	__u32 type;		/* NPU_FW_SEC_* */
	__u32 length;		/* data bytes (before padding) */
};

#define NPU_FW_SEC_OPTIONAL	(1u << 31)

enum npu_fw_section_type {
	NPU_FW_SEC_OPCODES	= 1,	/* u32 bit mask: opcodes the firmware runs */
	NPU_FW_SEC_HEARTBEAT	= 2,	/* u32: heartbeat period, us (100..1000000) */
	NPU_FW_SEC_LOG_LEVEL	= 3,	/* u32: initial log level, 0..3 */
	NPU_FW_SEC_NOTE		= 4 | NPU_FW_SEC_OPTIONAL,	/* text, logged at boot */
};

#endif /* NPU_FW_H */
