/* SPDX-License-Identifier: Apache-2.0 */
/*
 * decode_arena.h: where a request is decoded. protobuf-c allocates every
 * field of a decoded request separately; a batch decodes into hundreds of
 * allocations. Each handler thread decodes into its own bump arena instead
 * (POSIX thread-specific data, so the arena is freed when the thread
 * ends), reset after every request.
 */
#ifndef KVPD_DECODE_ARENA_H
#define KVPD_DECODE_ARENA_H

#include <stddef.h>
#include <stdint.h>

struct kvpd_decode_arena {
	uint8_t *buf;
	size_t used, cap;
	void **spill;        /* allocations that did not fit, freed at reset */
	size_t nspill, capspill, spill_bytes;
};

/* This thread's arena (made on first use), or NULL when out of memory. */
struct kvpd_decode_arena *kvpd_decode_arena_get(void);
/* A ProtobufCAllocator's alloc and free over an arena (free does nothing: reset frees). */
void *kvpd_decode_arena_alloc(void *arena, size_t size);
void kvpd_decode_arena_free(void *arena, void *p);
/* Frees what the last request took, and grows the arena if that spilled. */
void kvpd_decode_arena_reset(struct kvpd_decode_arena *a);

#endif
