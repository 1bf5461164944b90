/* SPDX-License-Identifier: Apache-2.0 */
/* bench_cycle_batch.c: loop (b) as Batches of 64 cycles; see the header. */
#include "bench_cycle_batch.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cycle_b.h"
#include "clients/c/request_pack.h"
#include "kvpool.pb-c.h"
#include "proto/pb_read.h"

/* The reply's arena: kvp_pb_read's allocations, dropped with each reply. */
enum { CB_ARENA = 1 << 20 };

struct cyc_batch {
	int thread;
	uint64_t cycle;
	int32_t ids[CB_CYCLES][16], rev[CB_CYCLES][16];
	uint8_t hashes[CB_CYCLES][16 * 32];
	Kvpool__V1__BatchCall calls[CB_CALLS], *ptrs[CB_CALLS];
	Kvpool__V1__CacheRequest cache[CB_CYCLES];
	Kvpool__V1__FreeRequest fr1[CB_CYCLES], fr2[CB_CYCLES];
	Kvpool__V1__LookupRequest lk[CB_CYCLES];
	Kvpool__V1__TouchRequest tc[CB_CYCLES];
	Kvpool__V1__AllocateRequest al;
	struct kvpc_plan plan; /* packed as libkvpool packs a Batch (request_pack.h) */
	size_t used;
	_Alignas(16) uint8_t arena[CB_ARENA];
};

struct cyc_batch *
cyc_batch_new(int thread)
{
	struct cyc_batch *cb = calloc(1, sizeof(*cb));
	if (cb == NULL)
		return NULL;
	cb->thread = thread;
	kvpool__v1__allocate_request__init(&cb->al);
	cb->al.num_blocks = 16;
	return cb;
}

void
cyc_batch_free(struct cyc_batch *cb)
{
	if (cb != NULL)
		kvpc_plan_fini(&cb->plan);
	free(cb);
}

int32_t *
cyc_batch_ids(struct cyc_batch *cb, int i)
{
	return cb->ids[i];
}

void
cyc_fill_hashes(uint8_t *h, int thread, uint64_t cycle)
{
	for (int i = 0; i < 16; i++) {
		memset(h + i * 32, 0x5a, 32);
		uint64_t v = cycle * 16 + (uint64_t)i;
		memcpy(h + i * 32, &v, 8);
		h[i * 32 + 8] = (uint8_t)thread;
	}
}

/* The batch's next call, of kind c; the caller sets its message. */
static Kvpool__V1__BatchCall *
add(struct cyc_batch *cb, size_t *n, Kvpool__V1__BatchCall__CallCase c)
{
	Kvpool__V1__BatchCall *bc = &cb->calls[*n];
	kvpool__v1__batch_call__init(bc);
	bc->call_case = c;
	cb->ptrs[(*n)++] = bc;
	return bc;
}

size_t
cyc_batch_max_len(void)
{
	return 1 << 20;
}

size_t
cyc_batch_pack(struct cyc_batch *cb, const char *pool, uint64_t sid, uint64_t call_id,
               uint8_t *buf)
{
	size_t n = 0;
	for (int i = 0; i < CB_CYCLES; i++) {
		cyc_fill_hashes(cb->hashes[i], cb->thread, cb->cycle++);
		memcpy(cb->rev[i], cb->ids[i], sizeof(cb->ids[i]));
		bench_rev16(cb->rev[i]);
		Kvpool__V1__CacheRequest *ca = &cb->cache[i];
		kvpool__v1__cache_request__init(ca);
		ca->block_ids = cb->ids[i];
		ca->n_block_ids = 16;
		ca->num_full_blocks = 16;
		ca->block_hashes.data = cb->hashes[i];
		ca->block_hashes.len = 16 * 32;
		kvpool__v1__free_request__init(&cb->fr1[i]);
		cb->fr1[i].block_ids = cb->rev[i];
		cb->fr1[i].n_block_ids = 16;
		kvpool__v1__lookup_request__init(&cb->lk[i]);
		cb->lk[i].block_hashes = ca->block_hashes;
		kvpool__v1__touch_request__init(&cb->tc[i]);
		cb->tc[i].block_ids = cb->ids[i];
		cb->tc[i].n_block_ids = 16;
		cb->fr2[i] = cb->fr1[i];
		add(cb, &n, KVPOOL__V1__BATCH_CALL__CALL_CACHE)->cache = ca;
		add(cb, &n, KVPOOL__V1__BATCH_CALL__CALL_FREE)->free = &cb->fr1[i];
		add(cb, &n, KVPOOL__V1__BATCH_CALL__CALL_LOOKUP)->lookup = &cb->lk[i];
		add(cb, &n, KVPOOL__V1__BATCH_CALL__CALL_TOUCH)->touch = &cb->tc[i];
		add(cb, &n, KVPOOL__V1__BATCH_CALL__CALL_FREE)->free = &cb->fr2[i];
		add(cb, &n, KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE)->allocate = &cb->al;
	}
	Kvpool__V1__BatchRequest br = KVPOOL__V1__BATCH_REQUEST__INIT;
	br.calls = cb->ptrs;
	br.n_calls = n;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	rq.pool = (char *)pool;
	rq.session_id = sid;
	rq.call_id = call_id;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	rq.batch = &br;
	if (kvpc_request_size(&rq, &cb->plan) > cyc_batch_max_len())
		return 0;
	return kvpc_request_pack(&rq, &cb->plan, buf);
}

static void *
arena_alloc(void *ctx, size_t n)
{
	struct cyc_batch *cb = ctx;
	n = (n + 15) & ~(size_t)15;
	if (n > CB_ARENA - cb->used)
		return NULL; /* kvp_pb_read declines; protobuf-c decodes */
	void *p = cb->arena + cb->used;
	cb->used += n;
	return p;
}
static void
arena_free(void *ctx, void *p)
{
	(void)ctx;
	(void)p;
}

/* As a client would: kvp_pb_read, as libkvpool's kvp_client_batch() does. */
int
cyc_batch_take(struct cyc_batch *cb, const uint8_t *reply, size_t len)
{
	ProtobufCAllocator al = {arena_alloc, arena_free, cb};
	cb->used = 0;
	Kvpool__V1__Reply *r =
	        (Kvpool__V1__Reply *)kvp_pb_read(&kvpool__v1__reply__descriptor, &al, reply, len);
	bool unpacked = r == NULL;
	if (unpacked)
		r = kvpool__v1__reply__unpack(NULL, len, reply);
	int rv = -1;
	if (r == NULL || r->status != 0 || r->result_case != KVPOOL__V1__REPLY__RESULT_BATCH ||
	    r->batch->n_replies != CB_CALLS) {
		fprintf(stderr, "batch failed: %s\n", r ? r->detail : "undecodable");
		goto out;
	}
	for (int i = 0; i < CB_CYCLES; i++) {
		const Kvpool__V1__Reply *a = r->batch->replies[i * 6 + 5];
		if (a->status != 0 || a->result_case != KVPOOL__V1__REPLY__RESULT_ALLOCATE ||
		    a->allocate->n_block_ids != 16) {
			fprintf(stderr, "batch: cycle %d's allocation failed\n", i);
			goto out;
		}
		memcpy(cb->ids[i], a->allocate->block_ids, sizeof(cb->ids[i]));
	}
	rv = 0;
out:
	if (unpacked && r != NULL)
		kvpool__v1__reply__free_unpacked(r, NULL);
	return rv;
}
