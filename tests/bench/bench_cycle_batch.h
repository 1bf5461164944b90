/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_cycle_batch.h: the engine's loop (b) as Batches of 64 cycles, the
 * request cycle kvp-bench-service sends to kvpoold and (with --only-core)
 * hands to the daemon's handler in process. Each batch caches, frees, looks
 * up, touches and frees the blocks the previous batch allocated, then
 * allocates the next cycle's blocks: six calls per cycle.
 */
#ifndef KVP_BENCH_CYCLE_BATCH_H
#define KVP_BENCH_CYCLE_BATCH_H

#include <stddef.h>
#include <stdint.h>

enum { CB_CYCLES = 64, CB_CALLS = CB_CYCLES * 6 };

struct cyc_batch;

/* 16 unique 32-byte hashes for thread's cycle into h. */
void cyc_fill_hashes(uint8_t *h, int thread, uint64_t cycle);

/* A batch state for one client thread (its hashes differ from other threads'); NULL on ENOMEM. */
struct cyc_batch *cyc_batch_new(int thread);
void cyc_batch_free(struct cyc_batch *cb);

/* The 16 block ids of cycle i's allocation (the first batch's, from the caller). */
int32_t *cyc_batch_ids(struct cyc_batch *cb, int i);

/*
 * The next batch as a packed Request for session sid into buf (at least
 * cyc_batch_max_len() bytes), written as libkvpool writes a Batch
 * (clients/c/request_pack.h); its length.
 */
size_t cyc_batch_pack(struct cyc_batch *cb, const char *pool, uint64_t sid, uint64_t call_id,
                      uint8_t *buf);
size_t cyc_batch_max_len(void);

/*
 * Reads the batch's reply: every call OK, and the next cycles' block ids
 * taken from its allocations. 0, or -1 with a line on stderr.
 */
int cyc_batch_take(struct cyc_batch *cb, const uint8_t *reply, size_t len);

#endif /* KVP_BENCH_CYCLE_BATCH_H */
