/* SPDX-License-Identifier: Apache-2.0 */
/*
 * disk_io.h: a disk tier's reads and writes of whole rows (disk.c's rounds):
 * through io_uring, a few in flight at a time, each read checked against
 * its CRC32C as it lands; pread and pwrite one at a time where the build
 * (no liburing) or the kernel (a seccomp filter) has no ring. No locks.
 * The struct's layout depends on KVP_HAVE_URING: only kvpd_core's files,
 * built with it, include this.
 */
#ifndef KVPD_DISK_IO_H
#define KVPD_DISK_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifdef KVP_HAVE_URING
#include <liburing.h>
#endif

struct kvpd_disk_io {
	int fd;
	uint64_t stride, row_bytes; /* a transfer's bytes; a read's checked bytes */
#ifdef KVP_HAVE_URING
	struct io_uring ring;
#endif
	bool uring;   /* the ring is in use */
	bool ring_up; /* ...and still to be torn down */
};

/* One row's read or write: its buffer, its offset in the file, and how it went. */
struct kvpd_io_op {
	unsigned char *buf;
	uint64_t off;
	uint32_t crc; /* a read: the CRC32C its bytes must have */
	bool ok;
};

/* Sets up io for fd (stride and row_bytes set by the caller): a ring of entries if it can. */
void kvpd_disk_io_init(struct kvpd_disk_io *io, unsigned entries);
void kvpd_disk_io_fini(struct kvpd_disk_io *io);

/* ops[0..n): read (write false) or written, each ok or not. */
void kvpd_disk_io_batch(struct kvpd_disk_io *io, struct kvpd_io_op *ops, size_t n, bool write);

#endif
