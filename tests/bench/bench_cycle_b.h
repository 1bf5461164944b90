/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_cycle_b.h: the engine's loop (b), shared by kvp-bench-engine and
 * kvp-bench-service (which runs it in process as the same-run baseline of
 * the remote request cycle).
 */
#ifndef KVP_BENCH_CYCLE_B_H
#define KVP_BENCH_CYCLE_B_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/block_hash.h"
#include "engine/pool.h"

static inline void
bench_rev16(int32_t *a)
{
	for (int i = 0; i < 8; i++) {
		int32_t t = a[i];
		a[i] = a[15 - i];
		a[15 - i] = t;
	}
}

/* (b) allocate 16, cache 16 unique hashes, free reversed, 16 lookups, touch, free reversed. */
struct bstate {
	struct kvp_pool *p;
	uint8_t hashes[16 * KVP_HASH_LEN];
	uint64_t counter;
	struct kvp_cache_args a;
};

/* One cycle; its own function so that callgrind can count it (--toggle-collect=cycle_b). */
static __attribute__((noinline)) void
cycle_b(struct bstate *s, bool lookups)
{
	int32_t ids[16], hits[16];
	const uint32_t g0 = 0;

	kvp_pool_get_new_blocks(s->p, 16, ids);
	for (int i = 0; i < 16; i++) {
		s->counter++;
		memcpy(s->hashes + i * KVP_HASH_LEN, &s->counter, sizeof(s->counter));
	}
	kvp_pool_cache_full_blocks(s->p, ids, 16, &s->a);
	if (!lookups) {
		kvp_pool_free_blocks(s->p, ids, 16);
		return;
	}
	bench_rev16(ids);
	kvp_pool_free_blocks(s->p, ids, 16);
	for (int i = 0; i < 16; i++)
		kvp_pool_get_cached_block(s->p, s->hashes + i * KVP_HASH_LEN, KVP_HASH_LEN, &g0, 1,
		                          &hits[i]);
	kvp_pool_touch(s->p, hits, 16);
	bench_rev16(hits);
	kvp_pool_free_blocks(s->p, hits, 16);
}

/*
 * Warms p, a caching pool of nblocks with hash block size 16, up to the
 * steady state, untimed: until every
 * block has been cached once, allocation evicts nothing and the pool's
 * pages are still being mapped, which flatters short runs.
 */
static inline void
warm_b(struct bstate *s, struct kvp_pool *p, uint32_t nblocks)
{
	memset(s, 0, sizeof(*s));
	s->p = p;
	s->a = (struct kvp_cache_args){.block_hashes = s->hashes, .num_block_hashes = 16,
	                               .num_full_blocks = 16, .block_size = 16};
	memset(s->hashes, 0x5a, sizeof(s->hashes));
	for (uint32_t w = 0; w < 2 * nblocks / 16; w++)
		cycle_b(s, false);
}

#endif /* KVP_BENCH_CYCLE_B_H */
