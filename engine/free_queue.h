/* SPDX-License-Identifier: Apache-2.0 */
/*
 * free_queue.h: vLLM's FreeKVCacheBlockQueue, an intrusive doubly linked
 * list of block ids with fake head and tail sentinels.
 *
 * The head is the next block to be allocated or evicted (LRU end); the tail
 * is the most recently freed. Links are 32-bit block ids stored in the
 * block metadata array (struct kvp_block), so every operation is O(1) and
 * nothing allocates. The two sentinels live in the same array at indexes
 * n (head) and n+1 (tail); a block that is not linked has prev == next ==
 * KVP_QUEUE_UNLINKED.
 *
 * Internal to the engine (the pool owns its queue); exposed so tests can
 * check the primitives against vLLM's (scenarios A1, A2). Not thread-safe.
 * Never allocates, never prints.
 */
#ifndef KVP_FREE_QUEUE_H
#define KVP_FREE_QUEUE_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/kvp_status.h"

#define KVP_QUEUE_UNLINKED (-1)

/* Per-block metadata shared by the queue and the pool: 16 bytes. */
struct kvp_block {
	int32_t prev;     /* previous in the free queue, or KVP_QUEUE_UNLINKED */
	int32_t next;     /* next in the free queue, or KVP_QUEUE_UNLINKED */
	int32_t ref_cnt;  /* holders; the pool keeps the null block's at 0 */
	uint32_t mark;    /* pool scratch: duplicate detection within a call */
};

struct kvp_queue {
	struct kvp_block *blocks; /* n + 2 entries; not owned */
	int32_t head;             /* == n, the fake head */
	int32_t tail;             /* == n + 1, the fake tail */
	uint32_t num_free;
};

/*
 * Links blocks[order[0..count)] in that order. blocks must have n + 2
 * entries (the last two are the sentinels); every order[i] must be distinct
 * and < n (our bug otherwise: asserted). Blocks not in order are marked
 * unlinked. ref_cnt and mark are not touched.
 */
void kvp_queue_init(struct kvp_queue *q, struct kvp_block *blocks, uint32_t n,
                    const int32_t *order, size_t count);

/* Returns 1 if block id is linked into the queue, else 0. */
static inline int
kvp_queue_contains(const struct kvp_queue *q, int32_t id)
{
	return q->blocks[id].prev != KVP_QUEUE_UNLINKED;
}

/*
 * The operations below are inline: they sit on the allocate/free/touch hot
 * path of another translation unit, and a call per block costs more than
 * the work.
 */

/*
 * Unlinks the first n blocks (1 <= n <= num_free) into out[0..n), in queue
 * order; with hold (a constant at each call, so the loop is specialised)
 * each also gets its first holder (ref_cnt 1) in the same pass, its fields
 * one line apart.
 */
static inline void
kvp_queue__unlink_first_n(struct kvp_queue *q, uint32_t n, int32_t *out, bool hold)
{
	struct kvp_block *b = q->blocks;
	int32_t cur = b[q->head].next;

#pragma GCC unroll 4
	for (uint32_t i = 0; i < n; i++) {
		struct kvp_block *e = &b[cur];
		int32_t nx = e->next;
		out[i] = cur;
		e->prev = KVP_QUEUE_UNLINKED;
		e->next = KVP_QUEUE_UNLINKED;
		if (hold) {
			assert(e->ref_cnt == 0);
			e->ref_cnt = 1;
		}
		cur = nx;
	}
	b[q->head].next = cur;
	b[cur].prev = q->head;
	q->num_free -= n;
}

/*
 * Pops n blocks from the head into out[0..n), in queue order. Returns
 * KVP_ENOSPACE (queue unchanged) if fewer than n are queued; n == 0 is KVP_OK.
 */
static inline int
kvp_queue_popleft_n(struct kvp_queue *q, uint32_t n, int32_t *out)
{
	if (n > q->num_free)
		return KVP_ENOSPACE;
	if (n > 0)
		kvp_queue__unlink_first_n(q, n, out, false);
	return KVP_OK;
}

/*
 * kvp_queue_popleft_n for an allocation: the caller has checked that n
 * blocks are queued (1 <= n <= num_free), and each popped block gets its
 * first holder (ref_cnt 1).
 */
static inline void
kvp_queue__take_n(struct kvp_queue *q, uint32_t n, int32_t *out)
{
	kvp_queue__unlink_first_n(q, n, out, true);
}

/* Pops the head block. Returns its id, or -1 if the queue is empty. */
static inline int32_t
kvp_queue_popleft(struct kvp_queue *q)
{
	int32_t id;
	return kvp_queue_popleft_n(q, 1, &id) == KVP_OK ? id : -1;
}

/*
 * Unlinks block id, which the caller knows is linked, from the queue over b
 * (q->blocks), leaving num_free to the caller: for loops that count once.
 */
static inline void
kvp_queue__unlink(struct kvp_block *b, int32_t id)
{
	int32_t p = b[id].prev, nx = b[id].next;

	b[p].next = nx;
	b[nx].prev = p;
	b[id].prev = KVP_QUEUE_UNLINKED;
	b[id].next = KVP_QUEUE_UNLINKED;
}

/* Unlinks block id from anywhere. KVP_ENOTFOUND if it is not linked. */
static inline int
kvp_queue_remove(struct kvp_queue *q, int32_t id)
{
	if (!kvp_queue_contains(q, id))
		return KVP_ENOTFOUND;
	kvp_queue__unlink(q->blocks, id);
	q->num_free--;
	return KVP_OK;
}

/*
 * Links ids[0..n) before the tail, in order. The caller guarantees they are
 * distinct and unlinked (the pool validates first).
 */
static inline void
kvp_queue_append_n(struct kvp_queue *q, const int32_t *ids, size_t n)
{
	struct kvp_block *b = q->blocks;
	int32_t last;

	if (n == 0)
		return;
	last = b[q->tail].prev;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		b[last].next = id;
		b[id].prev = last;
		last = id;
	}
	b[last].next = q->tail;
	b[q->tail].prev = last;
	q->num_free += (uint32_t)n;
}

/* Links block id before the tail. KVP_ESTATE if it is already linked. */
static inline int
kvp_queue_append(struct kvp_queue *q, int32_t id)
{
	if (kvp_queue_contains(q, id))
		return KVP_ESTATE;
	kvp_queue_append_n(q, &id, 1);
	return KVP_OK;
}

/* Walks from head to tail: first id, or -1 when empty; next id, or -1 at the end. */
static inline int32_t
kvp_queue_first(const struct kvp_queue *q)
{
	int32_t id = q->blocks[q->head].next;
	return id == q->tail ? -1 : id;
}

static inline int32_t
kvp_queue_next(const struct kvp_queue *q, int32_t id)
{
	int32_t nx = q->blocks[id].next;
	return nx == q->tail ? -1 : nx;
}

#endif /* KVP_FREE_QUEUE_H */
