/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's committed rows kept across lives (the pool setting restart=warm,
 * docs/operations.md "Warm restart").
 *
 * Beside the kept region file ("kvpool-<pool>.region", gpu/executor.h)
 * lies "kvpool-<pool>.rows": a header naming the layout the rows were
 * written in, then one record per row: the key its commit made visible,
 * the row's CRC32C, a generation (commit order) and the record's own
 * CRC32C. A commit writes its rows' records after the rows' bytes are in
 * place; a key that leaves the cache (the pool's unkey hook: eviction,
 * Evict, reset) clears its record before the row can be handed out again.
 * At start, a region whose bytes survived is adopted row by row: a record
 * whose own checksum fails, or whose row's bytes no longer match the CRC
 * it recorded (a kill mid-store, a write after the record), is dropped;
 * the rest become cached and free again, the newest last in the LRU, with
 * an AllBlocksCleared then their BlockStored on the pool's streams.
 *
 * A commit without a CRC (vLLM's spec sends none; no_checksum) writes its
 * record unproven: the daemon's reaper takes each such row's CRC32C a moment
 * later, outside the pool's lock (kvpd_keep_sweep), and checks under it
 * that the row still holds that commit before the record counts. A restart
 * drops records still unproven: a row committed within the last sweep
 * (about a second) before a kill may be lost, never served torn.
 *
 * Called under the pool's lock, as every handler; the files are the only
 * state, so a kill at any instruction leaves records that are either whole
 * or rejected.
 */
#ifndef KVPD_RPC_KEEP_H
#define KVPD_RPC_KEEP_H

#include <stddef.h>
#include <stdint.h>

struct kvpd_pool;
struct kvpd_keep;

/*
 * Opens pool p's records beside its kept region (gpu/executor.h: the
 * region's path with .rows for .region), made with mode; adopts what they prove, and hooks p's pool so that every
 * key leaving the cache clears its record. Records written under another
 * layout (the pool's shape, dtype, hashing, shards) are not read. KVP_OK
 * with p->keep set and what it found appended to p->exec_note (for the
 * log), or a status with err.
 */
int kvpd_keep_open(struct kvpd_pool *p, uint32_t mode, char *err, size_t err_len);

/*
 * What a pool's rows' bytes mean (shape, dtype, hashing, shards): a kept
 * region's records, or a disk tier's slots, written under another layout
 * are not read.
 */
struct kvpd_pool_config;
void kvpd_keep_layout(const struct kvpd_pool_config *pc, char *out, size_t len);

/* Records row id's commit of key (key_len bytes) with the row's crc; crc 0: none. */
void kvpd_keep_commit(struct kvpd_keep *k, int32_t id, const uint8_t *key, size_t key_len,
                      uint32_t crc);

/*
 * Takes the CRC32C of rows committed without one, oldest first, up to about
 * max_bytes of rows; takes p->lock briefly twice a round of 64 rows, never
 * while reading rows. Returns the bytes read. A pool without records: 0.
 */
uint64_t kvpd_keep_sweep(struct kvpd_pool *p, uint64_t max_bytes);

/* A warm pool's figures for /metrics. */
struct kvpd_keep_stats {
	uint32_t kept;       /* rows this life adopted at its start */
	uint32_t dropped;    /* records its start refused (torn, changed, or unproven) */
	uint64_t unproven;   /* rows committed without a CRC the sweeper has yet to read */
	uint64_t proven;     /* rows the sweeper has proven, this life */
};

/* Fills *out (zeros for NULL k); under the pool's lock. */
void kvpd_keep_stats(const struct kvpd_keep *k, struct kvpd_keep_stats *out);

/* Unmaps and closes (the files stay for the next life). NULL: nothing. */
void kvpd_keep_close(struct kvpd_keep *k);

#endif
