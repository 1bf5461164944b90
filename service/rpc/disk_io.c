/* SPDX-License-Identifier: Apache-2.0 */
/* A disk tier's reads and writes of whole rows: disk_io.h. */
#define _GNU_SOURCE
#include "service/rpc/disk_io.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"

/*
 * Rows in flight at once: deeper queues measured no faster here (4, 8 and
 * 32 deep within noise of each other, kvp-bench-disk) and hold more rows
 * busy at a time.
 */
enum { DEPTH = 4 };

void
kvpd_disk_io_init(struct kvpd_disk_io *io, unsigned entries)
{
	io->uring = io->ring_up = false;
#ifdef KVP_HAVE_URING
	/* io_uring where the kernel and its seccomp filter allow it; else pread and pwrite. */
	io->uring = io->ring_up = io_uring_queue_init(entries, &io->ring, 0) == 0;
#else
	(void)entries;
#endif
}

void
kvpd_disk_io_fini(struct kvpd_disk_io *io)
{
#ifdef KVP_HAVE_URING
	if (io->ring_up)
		io_uring_queue_exit(&io->ring);
#endif
	io->uring = io->ring_up = false;
}

static bool
io_all(int fd, unsigned char *buf, uint64_t len, uint64_t off, bool write)
{
	for (uint64_t done = 0; done < len;) {
		ssize_t r = write ? pwrite(fd, buf + done, len - done, (off_t)(off + done))
		                  : pread(fd, buf + done, len - done, (off_t)(off + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		done += (uint64_t)r;
	}
	return true;
}

/*
 * o's transfer moved `got` bytes (-1: it failed): the rest by hand, then a
 * read's bytes checked against their CRC32C.
 */
static void
done(struct kvpd_disk_io *d, struct kvpd_io_op *o, int64_t got, bool write)
{
	o->ok = got >= 0 && ((uint64_t)got == d->stride ||
	                     io_all(d->fd, o->buf + got, d->stride - (uint64_t)got,
	                            o->off + (uint64_t)got, write));
	if (o->ok && !write)
		o->ok = kvp_crc32c(0, o->buf, d->row_bytes) == o->crc;
}

/*
 * A round's rows, each a stride at its slot's offset: read (each checked
 * against its CRC32C as it lands, while the others are in flight) or
 * written. With io_uring DEPTH are in flight at a time; else one at a time.
 */
void
kvpd_disk_io_batch(struct kvpd_disk_io *d, struct kvpd_io_op *ops, size_t n, bool write)
{
	size_t from = 0; /* ops[from, n) go by hand */
#ifdef KVP_HAVE_URING
	/*
	 * A window of DEPTH ops in flight, the next submitted as each lands.
	 * Every submitted op is reaped before its row is touched again (the
	 * kernel writes into a read's row until it completes); a signal or a
	 * full completion queue only waits longer.
	 */
	size_t next = 0, inflight = 0;
	while (d->uring && (next < n || inflight > 0)) {
		size_t added = 0;
		while (next < n && inflight + added < DEPTH) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
			if (sqe == NULL)
				break;
			if (write)
				io_uring_prep_write(sqe, d->fd, ops[next].buf, (unsigned)d->stride,
				                    ops[next].off);
			else
				io_uring_prep_read(sqe, d->fd, ops[next].buf, (unsigned)d->stride,
				                   ops[next].off);
			io_uring_sqe_set_data(sqe, &ops[next]);
			next++;
			added++;
		}
		if (added > 0) {
			int sub = io_uring_submit(&d->ring);
			if (sub < 0 || (size_t)sub < added) {
				/* The ring took fewer than it was given: it goes once the rest land. */
				d->uring = false;
				next -= added - (sub < 0 ? 0 : (size_t)sub);
				added = sub < 0 ? 0 : (size_t)sub;
			}
			inflight += added;
		}
		if (inflight == 0)
			break;
		struct io_uring_cqe *cqe;
		int rv = io_uring_wait_cqe(&d->ring, &cqe);
		if (rv != 0) {
			if (rv != -EINTR && rv != -EAGAIN)
				nanosleep(&(struct timespec){0, 1000000}, NULL);
			continue;
		}
		struct kvpd_io_op *o = io_uring_cqe_get_data(cqe);
		int got = cqe->res;
		io_uring_cqe_seen(&d->ring, cqe);
		inflight--;
		done(d, o, got < 0 ? -1 : got, write);
	}
	from = next;
	if (!d->uring && d->ring_up) {
		io_uring_queue_exit(&d->ring);
		d->ring_up = false;
	}
#endif
	for (size_t i = from; i < n; i++)
		done(d, &ops[i], 0, write);
}
