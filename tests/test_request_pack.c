/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The client writes Batch requests by hand (clients/c/request_pack.c).
 * These tests hold its size and bytes to protobuf-c's own for the same
 * request: random batches of every call kind (the hand-written ones with
 * zero, small, large and negative values, empty and absent fields; calls
 * left to protobuf-c: Evict, Stats, any call with RequestKeys, a NULL
 * member, no case), and requests that are not batches.
 */
#include "kvp_test.h"

#include <stdbool.h>
#include <stdlib.h>

#include "clients/c/request_pack.h"
#include "kvpool.pb-c.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t
next_rand(void)
{
	return kvp_test_rand(&rng);
}

/* Zero, small, or any width: every varint length turns up (negative as int32/int64). */
static uint64_t
rand_wide(void)
{
	return kvp_test_rand_wide(&rng);
}

enum { MAXC = 300, MAXA = 40 };

/* Storage for one random request's messages and arrays. */
struct req {
	Kvpool__V1__BatchCall calls[MAXC], *ptrs[MAXC];
	Kvpool__V1__AllocateRequest al[MAXC];
	Kvpool__V1__TouchRequest tc[MAXC];
	Kvpool__V1__FreeRequest fr[MAXC];
	Kvpool__V1__CacheRequest ca[MAXC];
	Kvpool__V1__LookupRequest lk[MAXC];
	Kvpool__V1__AllocateSlotsRequest as[MAXC];
	Kvpool__V1__FreeRequestRequest fq[MAXC];
	Kvpool__V1__GetComputedBlocksRequest gc[MAXC];
	Kvpool__V1__SlotsRunRequest sr[MAXC];
	Kvpool__V1__EvictRequest ev[MAXC];
	Kvpool__V1__StatsRequest st[MAXC];
	Kvpool__V1__RequestKeys keys;
	int32_t i32[MAXC][MAXA];
	uint32_t u32[MAXC][2][MAXA];
	uint64_t u64[MAXC][MAXA];
	int64_t i64[MAXC][2][MAXA];
	uint8_t bytes[64];
};

static size_t
fill_i32(int32_t *a)
{
	size_t n = next_rand() % 3 == 0 ? 0 : next_rand() % MAXA;
	for (size_t i = 0; i < n; i++)
		a[i] = (int32_t)rand_wide();
	return n;
}

static size_t
fill_u32(uint32_t *a)
{
	size_t n = next_rand() % 3 == 0 ? 0 : next_rand() % MAXA;
	for (size_t i = 0; i < n; i++)
		a[i] = (uint32_t)rand_wide();
	return n;
}

static size_t
fill_u64(uint64_t *a)
{
	size_t n = next_rand() % 3 == 0 ? 0 : next_rand() % MAXA;
	for (size_t i = 0; i < n; i++)
		a[i] = rand_wide();
	return n;
}

static size_t
fill_i64(int64_t *a)
{
	size_t n = next_rand() % 3 == 0 ? 0 : next_rand() % MAXA;
	for (size_t i = 0; i < n; i++)
		a[i] = (int64_t)rand_wide();
	return n;
}

static ProtobufCBinaryData
rand_bytes(struct req *r)
{
	ProtobufCBinaryData b = {.len = next_rand() % 2 ? next_rand() % sizeof(r->bytes) : 0,
	                         .data = r->bytes};
	return b;
}

/* A bool as a caller may set it: 0, 1, or another non-zero int. */
static protobuf_c_boolean
rand_bool(void)
{
	return (protobuf_c_boolean)(next_rand() % 3);
}

static void
random_call(struct req *r, size_t i)
{
	Kvpool__V1__BatchCall *c = &r->calls[i];
	kvpool__v1__batch_call__init(c);
	r->ptrs[i] = c;
	/* Now and then RequestKeys, which protobuf-c packs. */
	Kvpool__V1__RequestKeys *keys = next_rand() % 8 == 0 ? &r->keys : NULL;
	switch (next_rand() % 13) {
	case 0:
		kvpool__v1__allocate_request__init(&r->al[i]);
		r->al[i].num_blocks = (uint32_t)rand_wide();
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE;
		c->allocate = &r->al[i];
		break;
	case 1:
		kvpool__v1__touch_request__init(&r->tc[i]);
		r->tc[i].block_ids = r->i32[i];
		r->tc[i].n_block_ids = fill_i32(r->i32[i]);
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_TOUCH;
		c->touch = &r->tc[i];
		break;
	case 2:
		kvpool__v1__free_request__init(&r->fr[i]);
		r->fr[i].block_ids = r->i32[i];
		r->fr[i].n_block_ids = fill_i32(r->i32[i]);
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_FREE;
		c->free = &r->fr[i];
		break;
	case 3: {
		Kvpool__V1__CacheRequest *m = &r->ca[i];
		kvpool__v1__cache_request__init(m);
		m->block_ids = r->i32[i];
		m->n_block_ids = fill_i32(r->i32[i]);
		m->num_cached_blocks = (uint32_t)rand_wide();
		m->num_full_blocks = (uint32_t)rand_wide();
		m->group_id = (uint32_t)rand_wide();
		m->block_size = (uint32_t)rand_wide();
		m->block_hashes = rand_bytes(r);
		m->token_ids = r->i64[i][0];
		m->n_token_ids = fill_i64(r->i64[i][0]);
		m->keys = keys;
		m->block_mask = rand_bytes(r);
		m->parent_hash = rand_bytes(r);
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_CACHE;
		c->cache = m;
		break;
	}
	case 4: {
		Kvpool__V1__LookupRequest *m = &r->lk[i];
		kvpool__v1__lookup_request__init(m);
		m->block_hashes = rand_bytes(r);
		m->token_ids = r->i64[i][0];
		m->n_token_ids = fill_i64(r->i64[i][0]);
		m->keys = keys;
		m->group_ids = r->u32[i][0];
		m->n_group_ids = fill_u32(r->u32[i][0]);
		m->block_size = (uint32_t)rand_wide();
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_LOOKUP;
		c->lookup = m;
		break;
	}
	case 5: {
		Kvpool__V1__AllocateSlotsRequest *m = &r->as[i];
		kvpool__v1__allocate_slots_request__init(m);
		m->request_id = rand_wide();
		m->prompt_token_ids = r->i64[i][0];
		m->n_prompt_token_ids = fill_i64(r->i64[i][0]);
		if (next_rand() % 2) /* token ids: every one fits 32 bits */
			for (size_t k = 0; k < m->n_prompt_token_ids; k++)
				r->i64[i][0][k] = (int64_t)(rand_wide() % 151643);
		m->keys = keys;
		m->new_token_ids = r->i64[i][1];
		m->n_new_token_ids = fill_i64(r->i64[i][1]);
		m->num_new_tokens = (uint32_t)rand_wide();
		m->num_lookahead_tokens = (uint32_t)rand_wide();
		m->use_prefix_cache = rand_bool();
		m->delay_cache_blocks = rand_bool();
		m->token_budget = (uint32_t)rand_wide();
		m->full_sequence_must_fit = rand_bool();
		m->num_external_computed_tokens = (uint32_t)rand_wide();
		m->no_new_tokens = rand_bool();
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS;
		c->allocate_slots = m;
		break;
	}
	case 6:
		kvpool__v1__free_request_request__init(&r->fq[i]);
		r->fq[i].request_id = rand_wide();
		r->fq[i].preempt = rand_bool();
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_FREE_REQUEST;
		c->free_request = &r->fq[i];
		break;
	case 7:
		kvpool__v1__get_computed_blocks_request__init(&r->gc[i]);
		r->gc[i].request_id = rand_wide();
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_GET_COMPUTED_BLOCKS;
		c->get_computed_blocks = &r->gc[i];
		break;
	case 8: {
		Kvpool__V1__SlotsRunRequest *m = &r->sr[i];
		kvpool__v1__slots_run_request__init(m);
		m->request_ids = r->u64[i];
		m->n_request_ids = fill_u64(r->u64[i]);
		m->num_new_tokens = r->u32[i][0];
		m->n_num_new_tokens = fill_u32(r->u32[i][0]);
		m->num_token_ids = r->u32[i][1];
		m->n_num_token_ids = fill_u32(r->u32[i][1]);
		m->token_ids = r->i64[i][0];
		m->n_token_ids = fill_i64(r->i64[i][0]);
		m->num_lookahead_tokens = (uint32_t)rand_wide();
		m->delay_cache_blocks = rand_bool();
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN;
		c->slots_run = m;
		break;
	}
	case 9: /* kinds protobuf-c packs in place */
		kvpool__v1__evict_request__init(&r->ev[i]);
		r->ev[i].block_ids = r->i32[i];
		r->ev[i].n_block_ids = fill_i32(r->i32[i]);
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_EVICT;
		c->evict = &r->ev[i];
		break;
	case 10:
		kvpool__v1__stats_request__init(&r->st[i]);
		c->call_case = KVPOOL__V1__BATCH_CALL__CALL_STATS;
		c->stats = &r->st[i];
		break;
	case 11: /* a case set on a NULL member: absent */
		c->call_case = (Kvpool__V1__BatchCall__CallCase)(
			next_rand() % 2 ? KVPOOL__V1__BATCH_CALL__CALL_TOUCH
			                : KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS);
		c->touch = NULL;
		break;
	default: /* no case */
		break;
	}
}

/*
 * rq as the hand-written packer sends it under plan->prompt_u32: each
 * hand-written AllocateSlots whose prompt fits 32 bits has it moved to
 * prompt_token_ids_u32 (in static storage). Returns rq itself otherwise.
 */
static size_t prompts_moved; /* how many prompts as_sent moved: the path was taken */

static const Kvpool__V1__Request *
as_sent(const Kvpool__V1__Request *rq, const struct kvpc_plan *plan, Kvpool__V1__Request *copy,
        Kvpool__V1__BatchRequest *batch)
{
	static Kvpool__V1__BatchCall calls[MAXC], *ptrs[MAXC];
	static Kvpool__V1__AllocateSlotsRequest as[MAXC];
	static uint32_t ids[MAXC][MAXA];
	if (!plan->prompt_u32 || rq->call_case != KVPOOL__V1__REQUEST__CALL_BATCH)
		return rq;
	*copy = *rq;
	*batch = *rq->batch;
	for (size_t i = 0; i < batch->n_calls; i++) {
		const Kvpool__V1__BatchCall *c = rq->batch->calls[i];
		ptrs[i] = (Kvpool__V1__BatchCall *)c;
		if (c->call_case != KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS ||
		    c->allocate_slots == NULL || c->allocate_slots->n_prompt_token_ids == 0)
			continue;
		const Kvpool__V1__AllocateSlotsRequest *m = c->allocate_slots;
		bool fits = true;
		for (size_t k = 0; k < m->n_prompt_token_ids; k++)
			fits &= m->prompt_token_ids[k] >= 0 && m->prompt_token_ids[k] <= 0xffffffffll;
		if (!fits)
			continue;
		as[i] = *m;
		for (size_t k = 0; k < m->n_prompt_token_ids; k++)
			ids[i][k] = (uint32_t)m->prompt_token_ids[k];
		as[i].prompt_token_ids_u32 = ids[i];
		as[i].n_prompt_token_ids_u32 = m->n_prompt_token_ids;
		as[i].prompt_token_ids = NULL;
		as[i].n_prompt_token_ids = 0;
		calls[i] = *c;
		calls[i].allocate_slots = &as[i];
		ptrs[i] = &calls[i];
		prompts_moved++;
	}
	batch->calls = ptrs;
	copy->batch = batch;
	return copy;
}

/* Packs rq both ways and requires the same size and bytes. */
static void
same_as_protobuf_c(const Kvpool__V1__Request *rq, struct kvpc_plan *plan, int iter)
{
	Kvpool__V1__Request copy;
	Kvpool__V1__BatchRequest batch;
	const Kvpool__V1__Request *want_rq = as_sent(rq, plan, &copy, &batch);
	size_t want_len = kvpool__v1__request__get_packed_size(want_rq);
	size_t len = kvpc_request_size(rq, plan);
	if (len != want_len)
		fail_msg("iteration %d: measured %zu bytes, protobuf-c %zu", iter, len, want_len);
	uint8_t *want = malloc(want_len ? want_len : 1), *mine = malloc(len ? len : 1);
	assert_non_null(want);
	assert_non_null(mine);
	assert_int_equal(kvpool__v1__request__pack(want_rq, want), want_len);
	assert_int_equal(kvpc_request_pack(rq, plan, mine), len);
	if (memcmp(mine, want, len) != 0)
		fail_msg("iteration %d: %zu bytes differ from protobuf-c's", iter, len);
	free(want);
	free(mine);
}

static void
batches_are_protobuf_c_bytes(void **state)
{
	(void)state;
	static struct req r;
	struct kvpc_plan plan = {0};
	static Kvpool__V1__MmFeature mm[2], *mmp[2] = {&mm[0], &mm[1]};
	kvpool__v1__request_keys__init(&r.keys);
	r.keys.cache_salt = "salt";
	r.keys.lora_name = "adapter-7";
	r.keys.has_lora_id = 1;
	r.keys.lora_id = 7;
	for (int i = 0; i < 2; i++) {
		kvpool__v1__mm_feature__init(&mm[i]);
		mm[i].identifier = i ? "image-b" : "image-a";
		mm[i].offset = 16 * i + 3;
		mm[i].length = 300;
	}
	r.keys.mm = mmp;
	r.keys.n_mm = 2;
	for (size_t i = 0; i < sizeof(r.bytes); i++)
		r.bytes[i] = (uint8_t)(i * 37);
	int by_hand = 0;
	for (int iter = 0; iter < 3000; iter++) {
		Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
		Kvpool__V1__BatchRequest br = KVPOOL__V1__BATCH_REQUEST__INIT;
		size_t n = iter % 100 == 0 ? MAXC : next_rand() % 12;
		for (size_t i = 0; i < n; i++)
			random_call(&r, i);
		br.calls = r.ptrs;
		br.n_calls = n;
		br.continue_on_error = rand_bool();
		rq.call_id = rand_wide();
		rq.pool = next_rand() % 3 == 0 ? NULL : next_rand() % 2 ? "" : "a-pool";
		rq.session_id = rand_wide();
		rq.token = rand_bytes(&r);
		rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
		rq.batch = &br;
		plan.prompt_u32 = iter % 2; /* a daemon that reads 32-bit prompts, and one that does not */
		same_as_protobuf_c(&rq, &plan, iter);
		by_hand += plan.by_hand;
	}
	assert_int_equal(by_hand, 3000); /* every batch took the hand-written path */
	print_message("%zu prompts went as 32-bit ids\n", prompts_moved);
	assert_true(prompts_moved > 100);
	assert_true(plan.cap >= MAXC);
	kvpc_plan_fini(&plan);
	assert_null(plan.calls);
}

static void
other_requests_are_protobuf_c_bytes(void **state)
{
	(void)state;
	struct kvpc_plan plan = {0};
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__AllocateRequest al = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	al.num_blocks = 16;
	rq.call_id = 7;
	rq.pool = "p";
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE;
	rq.allocate = &al;
	same_as_protobuf_c(&rq, &plan, 0);
	assert_int_equal(plan.by_hand, 0);
	/* A batch case on a NULL batch: protobuf-c's (it writes no batch). */
	rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	rq.batch = NULL;
	same_as_protobuf_c(&rq, &plan, 1);
	assert_int_equal(plan.by_hand, 0);
	/* An empty batch is written by hand: the field with nothing in it. */
	Kvpool__V1__BatchRequest br = KVPOOL__V1__BATCH_REQUEST__INIT;
	rq.batch = &br;
	same_as_protobuf_c(&rq, &plan, 2);
	assert_int_equal(plan.by_hand, 1);
	kvpc_plan_fini(&plan);
}

/* A prompt for a protobuf-c-packed call: narrowed only when every id fits 32 bits. */
static void
prompts_narrow_only_when_every_id_fits(void **state)
{
	int64_t v[4] = {0, 151642, 2147483648ll, 4294967295ll};
	(void)state;
	uint32_t *w = kvpc_prompt_u32(v, 4);
	assert_non_null(w);
	for (int i = 0; i < 4; i++)
		assert_int_equal(w[i], (uint32_t)v[i]);
	free(w);
	v[2] = -1;
	assert_null(kvpc_prompt_u32(v, 4));
	v[2] = 4294967296ll;
	assert_null(kvpc_prompt_u32(v, 4));
	assert_null(kvpc_prompt_u32(v, 0));
	assert_null(kvpc_prompt_u32(NULL, 4));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(batches_are_protobuf_c_bytes),
		cmocka_unit_test(other_requests_are_protobuf_c_bytes),
		cmocka_unit_test(prompts_narrow_only_when_every_id_fits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
