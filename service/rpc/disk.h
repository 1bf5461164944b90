/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A region pool's disk tier (the pool settings disk= and disk_rows=,
 * docs/operations.md "Disk tier"): a file of disk_rows slots, each a row's
 * bytes, below the region.
 *
 * Every committed row is written behind (a thread of the pool's, never
 * under the pool's lock while it reads or writes): its key gets the next
 * slot, first in first out, once the row still holds that key after the
 * write; the slot's earlier key is forgotten. A lookup that misses a key
 * the disk holds answers "pending" (-2) through the disk's own fill table
 * (fill.h; a pool's cluster tier has another, for the keys the disk does
 * not hold) and the thread fills it: Reserve a row, read the slot into it,
 * check the CRC32C taken when it was written, Commit (a later lookup hits)
 * or Abort (a miss). So engines see hits arriving, as from the cluster
 * tier, and never bytes that fail their check.
 *
 * PATH.slots records which key each slot holds, so a restart on the same
 * settings finds the disk's rows again (each still checked at its read).
 * The file is locked (flock) while open.
 *
 * A round's reads or writes go through io_uring, a few in flight at a
 * time (liburing; pread and pwrite one at a time where the build or the
 * kernel lacks it), O_DIRECT where the file system and the row size allow it.
 * Rows written and slots dropped are events in vLLM's medium for its own
 * disk tier, "STORAGE" (BlockStored, BlockRemoved), after the region's;
 * a Reset empties the disk too (the pool's AllBlocksCleared says so).
 */
#ifndef KVPD_RPC_DISK_H
#define KVPD_RPC_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvpd_pool;
struct kvpd_disk;

/* How long a lookup of a key the disk holds answers pending at most (the fill table's wait). */
#define KVPD_DISK_WAIT_MS 1000u

/* A disk tier's figures for /metrics and the log. */
struct kvpd_disk_stats {
	uint64_t slots, used;       /* slots, and those holding a key */
	uint64_t writes, write_skips; /* rows written; rows gone before their write finished */
	uint64_t fills, fill_failures; /* rows read back; reads refused (I/O, CRC32C) */
	uint64_t io_errors;
	int direct;                 /* O_DIRECT in use */
	int uring;                  /* io_uring in use */
};

/*
 * Opens pool p's disk tier: the file path (made with mode, sized to rows
 * slots of the region's row stride) and its thread. p has a region and a
 * fill table. KVP_OK with p->disk set, or a status with err.
 */
int kvpd_disk_open(struct kvpd_pool *p, const char *path, uint32_t rows, uint32_t mode,
                   char *err, size_t err_len);

/* Row id was committed with key (key_len bytes): write it behind. Under the pool's lock. */
void kvpd_disk_commit(struct kvpd_disk *d, int32_t id, const uint8_t *key, size_t key_len);

/* Whether the disk holds key. Under the pool's lock. */
bool kvpd_disk_has(const struct kvpd_disk *d, const uint8_t *key, size_t key_len);

/*
 * A lookup missed key in the region: true when the disk holds it and will
 * fill it (the lookup answers pending, -2, and the thread is woken); false
 * when it does not, or it failed to serve it within the last second (the
 * cluster tier, if any, may then). NULL d: false. Under the pool's lock.
 */
bool kvpd_disk_ask(struct kvpd_disk *d, const uint8_t *key, size_t key_len, uint64_t now_ms);

/* A Reset emptied the pool: the disk forgets every key too (I/O under way is not applied). */
void kvpd_disk_reset(struct kvpd_disk *d);

/* A lookup left keys pending on the disk: wake the thread. Under the pool's lock. */
void kvpd_disk_kick(struct kvpd_disk *d);

/* Fills *out (zeros for NULL d); under the pool's lock. */
void kvpd_disk_stats(const struct kvpd_disk *d, struct kvpd_disk_stats *out);

/* Stops the thread (call without the pool's lock) and closes. NULL: nothing. */
void kvpd_disk_close(struct kvpd_disk *d);

#endif
