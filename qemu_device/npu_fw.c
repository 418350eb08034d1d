/*
 * NPU firmware: image validation and boot, the heartbeat, the mailbox
 * and the firmware log ring (include/npu_fw.h, docs/firmware.md).
 *
 * The model's "firmware" is the part of the device a real NPU runs in
 * its microcontroller: the scheduler's gate (no command runs before a
 * boot), the set of opcodes it implements (from the image), the
 * heartbeat, the mailbox protocol and the log.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/units.h"
#include "qemu/cutils.h"
#include "qemu/log.h"
#include "qemu/timer.h"
#include "hw/pci/pci.h"
#include <zlib.h>
#include "npu_dev.h"
#include "npu_fw.h"
#include "hw/misc/trace.h"

#define NPU_FW_LOG_MIN          256
#define NPU_FW_LOG_MAX          (1 * MiB)

/* Append one line to the log ring, if the driver gave one (any thread). */
void npu_fw_log(NpuState *s, uint32_t level, const char *fmt, ...)
{
    struct npu_fw_log head;
    uint64_t base, size, off;
    uint32_t w, n, first;
    char line[160];
    va_list ap;
    int len;

    va_start(ap, fmt);
    len = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    len = MIN(len, (int)sizeof(line) - 2);
    line[len++] = '\n';

    qemu_mutex_lock(&s->log_lock);
    qemu_mutex_lock(&s->lock);
    base = s->fw_log_base;
    size = s->fw_log_size;
    w = s->fw_log_write;
    if (!base || level > s->fw_log_level || !npu_fw_log_config_ok(s)) {
        qemu_mutex_unlock(&s->lock);
        qemu_mutex_unlock(&s->log_lock);
        return;
    }
    s->fw_log_write = w + len;
    s->fw_log_writing = true;   /* the ring stays while we write */
    qemu_mutex_unlock(&s->lock);

    /* The text wraps round the ring; the head says how far it got. */
    off = w & (size - 1);
    n = len;
    first = MIN(n, size - off);
    npu_dma_write(s, "firmware log", base + sizeof(head) + off, line, first);
    if (first < n) {
        npu_dma_write(s, "firmware log", base + sizeof(head), line + first,
                      n - first);
    }
    head.write = cpu_to_le32(w + len);
    head.size = cpu_to_le32(size);
    npu_dma_write(s, "firmware log", base, &head, sizeof(head));
    qemu_mutex_lock(&s->lock);
    s->fw_log_writing = false;
    qemu_cond_broadcast(&s->log_idle);
    qemu_mutex_unlock(&s->lock);
    qemu_mutex_unlock(&s->log_lock);
}

/* Is the log ring configuration usable? (lock held) */
bool npu_fw_log_config_ok(NpuState *s)
{
    uint64_t n = s->fw_log_size;

    if (!s->fw_log_base) {
        return true;
    }
    return !(s->fw_log_base & 7) && is_power_of_2(n) &&
           n >= NPU_FW_LOG_MIN && n <= NPU_FW_LOG_MAX &&
           npu_dma_range_ok_locked(s, s->fw_log_base,
                                   sizeof(struct npu_fw_log) + n, true);
}

static uint32_t npu_fw_parse(NpuState *s, const uint8_t *p, uint32_t len,
                             uint32_t *opcodes, uint32_t *hb_us,
                             uint32_t *level, char *note, size_t note_len)
{
    while (len) {
        struct npu_fw_section sec;
        uint32_t padded, v = 0;

        if (len < sizeof(sec)) {
            return NPU_FWERR_FORMAT;
        }
        memcpy(&sec, p, sizeof(sec));
        sec.type = le32_to_cpu(sec.type);
        sec.length = le32_to_cpu(sec.length);
        p += sizeof(sec);
        len -= sizeof(sec);
        padded = ROUND_UP((uint64_t)sec.length, 4);
        if (sec.length > len || padded > len) {
            return NPU_FWERR_FORMAT;
        }
        if (sec.length == 4) {
            v = ldl_le_p(p);
        }
        switch (sec.type) {
        case NPU_FW_SEC_OPCODES:
            if (sec.length != 4 || !(v & 1)) {  /* NOP is mandatory */
                return NPU_FWERR_FORMAT;
            }
            *opcodes = v;
            break;
        case NPU_FW_SEC_HEARTBEAT:
            if (sec.length != 4 || v < 100 || v > 1000000) {
                return NPU_FWERR_FORMAT;
            }
            *hb_us = v;
            break;
        case NPU_FW_SEC_LOG_LEVEL:
            if (sec.length != 4 || v > 3) {
                return NPU_FWERR_FORMAT;
            }
            *level = v;
            break;
        case NPU_FW_SEC_NOTE: {
            /* Up to its first NUL; it need not have one (nor fit). */
            size_t n = strnlen((const char *)p,
                               MIN(note_len - 1, (size_t)sec.length));

            memcpy(note, p, n);
            note[n] = '\0';
            break;
        }
        default:
            if (!(sec.type & NPU_FW_SEC_OPTIONAL)) {
                return NPU_FWERR_FORMAT;
            }
            break;
        }
        p += padded;
        len -= padded;
    }
    return *opcodes ? NPU_FWERR_NONE : NPU_FWERR_FORMAT;
}

/* Validate an image; on success fill the firmware parameters. */
static uint32_t npu_fw_validate(NpuState *s, uint8_t *img, uint32_t size,
                                uint32_t *version, uint32_t *opcodes,
                                uint32_t *hb_us, uint32_t *level,
                                char *note, size_t note_len)
{
    struct npu_fw_header h;
    uint32_t crc;

    if (size < sizeof(h)) {
        return NPU_FWERR_SIZE;
    }
    memcpy(&h, img, sizeof(h));
    if (le32_to_cpu(h.magic) != NPU_FW_MAGIC) {
        return NPU_FWERR_MAGIC;
    }
    if (le32_to_cpu(h.header_size) != NPU_FW_HEADER_SIZE ||
        le32_to_cpu(h.payload_size) != size - sizeof(h)) {
        return NPU_FWERR_SIZE;
    }
    crc = le32_to_cpu(h.header_crc);
    memset(img + offsetof(struct npu_fw_header, header_crc), 0, 4);
    if (crc32(0, img, sizeof(h)) != crc ||
        crc32(0, img + sizeof(h), size - sizeof(h)) !=
        le32_to_cpu(h.payload_crc)) {
        return NPU_FWERR_CHECKSUM;
    }
    if (le32_to_cpu(h.abi_version) != NPU_ABI_VERSION || h.flags) {
        return NPU_FWERR_ABI;
    }
    *version = le32_to_cpu(h.version);
    return npu_fw_parse(s, img + sizeof(h), size - sizeof(h), opcodes, hb_us,
                        level, note, note_len);
}

/* Put the defaults of a running firmware in place (boot-rom, lock held). */
void npu_fw_start_rom_locked(NpuState *s)
{
    s->fw_state = NPU_FW_RUNNING;
    s->fw_error = NPU_FWERR_NONE;
    s->fw_version = 0;
    s->fw_opcodes = UINT32_MAX;
    s->fw_queues = MAKE_64BIT_MASK(0, NPU_NUM_QUEUES);
    s->fw_hb_period_ns = NPU_FW_DEFAULT_HB_US * 1000ull;
    s->fw_boot_ns = npu_now_ns();
    s->fw_log_level = 1;
}

/* FW_CONTROL.BOOT: read, check and start the image (BQL, no lock). */
void npu_fw_boot(NpuState *s)
{
    uint32_t version = 0, opcodes = 0, hb_us = NPU_FW_DEFAULT_HB_US;
    uint32_t level = 1, err, size;
    char note[64] = "";
    uint64_t addr;
    uint8_t *img;
    bool in_range;

    qemu_mutex_lock(&s->lock);
    addr = s->fw_addr;
    size = s->fw_size;
    in_range = npu_dma_range_ok_locked(s, addr, size, false);
    qemu_mutex_unlock(&s->lock);

    img = NULL;
    if (!size || size > NPU_FW_MAX_SIZE) {
        err = NPU_FWERR_SIZE;
    } else if (!in_range) {
        err = NPU_FWERR_DMA;
    } else {
        img = g_malloc(size);
        err = npu_dma_read(s, "firmware", addr, img, size) != MEMTX_OK ?
              NPU_FWERR_DMA :
              npu_fw_validate(s, img, size, &version, &opcodes, &hb_us,
                              &level, note, sizeof(note));
    }
    g_free(img);
    trace_npu_fw_boot(size, err);

    qemu_mutex_lock(&s->lock);
    if (err) {
        /* No image runs: nothing of an earlier (crashed) one stays. */
        s->fw_state = NPU_FW_FAILED;
        s->fw_error = err;
        s->fw_version = 0;
        s->fw_opcodes = 0;
        s->fw_queues = 0;
    } else {
        s->fw_state = NPU_FW_RUNNING;
        s->fw_error = NPU_FWERR_NONE;
        s->fw_version = version;
        s->fw_opcodes = opcodes;
        s->fw_queues = 1;   /* the driver's queue 0 */
        s->fw_hb_period_ns = hb_us * 1000ull;
        s->fw_boot_ns = npu_now_ns();
        s->fw_log_level = level;
        qemu_cond_broadcast(&s->cond);
    }
    qemu_mutex_unlock(&s->lock);
    if (err) {
        npu_guest_error("npu: firmware image rejected"
                        " (error %u)\n", err);
        return;
    }
    npu_fw_log(s, 1, "npu-fw %u.%u booted: opcodes 0x%x heartbeat %u us%s%s",
               version >> 16, version & 0xffff, opcodes, hb_us,
               note[0] ? " - " : "", note);
}

/* FW_HEARTBEAT (lock held) */
uint32_t npu_fw_heartbeat_locked(NpuState *s)
{
    if (s->fw_state == NPU_FW_CRASHED) {
        return s->fw_hb_frozen;
    }
    if (s->fw_state != NPU_FW_RUNNING || !s->fw_hb_period_ns) {
        return 0;
    }
    return (npu_now_ns() - s->fw_boot_ns) / s->fw_hb_period_ns;
}

/* INJECT.FW_CRASH (lock held) */
void npu_fw_crash_locked(NpuState *s)
{
    if (s->fw_state == NPU_FW_RUNNING) {
        s->fw_hb_frozen = npu_fw_heartbeat_locked(s);
        s->fw_state = NPU_FW_CRASHED;
    }
}

/* A request was sent (MBOX_SEQ written): answer it (BQL, no lock). */
void npu_fw_mbox(NpuState *s)
{
    uint32_t cmd, arg0, arg1, seq, st = NPU_MBOX_OK, r0 = 0, r1 = 0;
    uint32_t level = 0;

    qemu_mutex_lock(&s->lock);
    if (s->fw_state != NPU_FW_RUNNING) {
        qemu_mutex_unlock(&s->lock);
        npu_guest_error("npu: mailbox request with no"
                        " firmware running\n");
        return;     /* nobody answers */
    }
    cmd = s->mbox_cmd;
    arg0 = s->mbox_arg0;
    arg1 = s->mbox_arg1;
    seq = s->mbox_seq;
    switch (cmd) {
    case NPU_MBOX_PING:
        r0 = arg0 + 1;
        r1 = npu_fw_heartbeat_locked(s);
        break;
    case NPU_MBOX_QUERY:
        r0 = (uint32_t)s->cmds_done;
        r1 = s->fw_log_level;
        break;
    case NPU_MBOX_SET_LOG_LEVEL:
        if (arg0 > 3) {
            st = NPU_MBOX_BAD_ARG;
        } else {
            s->fw_log_level = level = arg0;
        }
        break;
    case NPU_MBOX_RESET_QUEUE:
    case NPU_MBOX_DESTROY_QUEUE:
        if (arg0 >= NPU_NUM_QUEUES) {
            st = NPU_MBOX_BAD_ARG;
        } else if (s->q[arg0].status & NPU_QSTAT_ACTIVE) {
            st = NPU_MBOX_BUSY;
        } else {
            npu_queue_reset_locked(s, arg0);
            if (cmd == NPU_MBOX_DESTROY_QUEUE) {
                s->fw_queues &= ~(1u << arg0);
            }
        }
        break;
    case NPU_MBOX_CREATE_QUEUE:
        if (arg0 >= NPU_NUM_QUEUES || arg1 > NPU_Q_PRIORITY_MAX) {
            st = NPU_MBOX_BAD_ARG;
        } else {
            s->fw_queues |= 1u << arg0;
            s->q[arg0].priority = arg1;
            qemu_cond_broadcast(&s->cond);
        }
        break;
    default:
        st = NPU_MBOX_UNKNOWN;
        break;
    }
    s->mbox_resp_status = st;
    s->mbox_resp0 = r0;
    s->mbox_resp1 = r1;
    s->mbox_resp_seq = seq;
    npu_raise_locked(s, NPU_IRQ_MBOX);
    qemu_mutex_unlock(&s->lock);
    /* Logged outside the device lock (npu_tracering.c). */
    npu_trace_ev(s, NPU_TR_MBOX_REQ, NPU_TRACE_NO_QUEUE, NPU_TRACE_CORE_CP, 0,
                 cmd, seq);
    npu_trace_ev(s, NPU_TR_MBOX_REPLY, NPU_TRACE_NO_QUEUE, NPU_TRACE_CORE_CP,
                 0, st, seq);
    trace_npu_mbox(cmd, seq, st);
    npu_fw_log(s, 3, "mbox seq %u cmd %u arg 0x%x: status %u", seq, cmd,
               arg0, st);
    if (cmd == NPU_MBOX_SET_LOG_LEVEL && st == NPU_MBOX_OK) {
        npu_fw_log(s, 1, "log level %u", level);
    }
}
