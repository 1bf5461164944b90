/* SPDX-License-Identifier: Apache-2.0 */
/*
 * batch.c: the Batch builder (kvp_batch_*) and kvp_client_batch(): several
 * calls sent as one round trip, executed in order under the pool's lock.
 */
#include "clients/c/kvpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/client_impl.h"
#include "proto/wire.h"

#define set_detail kvp_client_fail_

/* ---- batches ---- */

struct kvp_batch {
	Kvpool__V1__BatchCall **calls;
	size_t n, cap;
	void **owned;               /* every copy the calls point into */
	size_t nowned, capowned;
	Kvpool__V1__Reply *reply;   /* the last send's reply */
};

int
kvp_batch_create(struct kvp_batch **out)
{
	if (out == NULL)
		return KVP_EINVAL;
	*out = calloc(1, sizeof(**out));
	return *out ? KVP_OK : KVP_ENOMEM;
}

void
kvp_batch_clear(struct kvp_batch *b)
{
	if (b == NULL)
		return;
	for (size_t i = 0; i < b->nowned; i++)
		free(b->owned[i]);
	b->nowned = 0;
	b->n = 0;
	kvpool__v1__reply__free_unpacked(b->reply, NULL);
	b->reply = NULL;
}

void
kvp_batch_destroy(struct kvp_batch *b)
{
	if (b == NULL)
		return;
	kvp_batch_clear(b);
	free(b->calls);
	free(b->owned);
	free(b);
}

size_t
kvp_batch_count(const struct kvp_batch *b)
{
	return b ? b->n : 0;
}

/* A zeroed allocation the batch frees; NULL on ENOMEM. */
static void *
own(struct kvp_batch *b, const void *src, size_t n)
{
	void *p;
	if (b->nowned == b->capowned) {
		size_t cap = b->capowned ? b->capowned * 2 : 32;
		void **np = realloc(b->owned, cap * sizeof(*np));
		if (np == NULL)
			return NULL;
		b->owned = np;
		b->capowned = cap;
	}
	if ((p = calloc(1, n ? n : 1)) == NULL)
		return NULL;
	if (src != NULL && n > 0)
		memcpy(p, src, n);
	b->owned[b->nowned++] = p;
	return p;
}

static char *
own_str(struct kvp_batch *b, const char *s)
{
	return s ? own(b, s, strlen(s) + 1) : NULL;
}

static Kvpool__V1__BatchCall *
new_call(struct kvp_batch *b)
{
	Kvpool__V1__BatchCall *call;
	if (b->n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 16;
		Kvpool__V1__BatchCall **nc = realloc(b->calls, cap * sizeof(*nc));
		if (nc == NULL)
			return NULL;
		b->calls = nc;
		b->cap = cap;
	}
	if ((call = own(b, NULL, sizeof(*call))) == NULL)
		return NULL;
	kvpool__v1__batch_call__init(call);
	b->calls[b->n++] = call;
	kvpool__v1__reply__free_unpacked(b->reply, NULL); /* results no longer match */
	b->reply = NULL;
	return call;
}

/* Deep copy of request keys into the batch. */
static Kvpool__V1__RequestKeys *
own_keys(struct kvp_batch *b, const struct kvp_request_keys *k, bool has_lora_id, int64_t lora_id)
{
	Kvpool__V1__RequestKeys *pk = own(b, NULL, sizeof(*pk));
	size_t n = k ? k->num_mm : 0;
	Kvpool__V1__MmFeature *mm = own(b, NULL, n * sizeof(*mm));
	Kvpool__V1__MmFeature **ptrs = own(b, NULL, n * sizeof(*ptrs));

	if (pk == NULL || mm == NULL || ptrs == NULL)
		return NULL;
	kvp_wire_keys_to_proto(k, has_lora_id, lora_id, pk, mm, ptrs);
	/* The strings still point at the caller's: copy them. */
	if (k && k->lora_name && (pk->lora_name = own_str(b, k->lora_name)) == NULL)
		return NULL;
	if (k && k->cache_salt && (pk->cache_salt = own_str(b, k->cache_salt)) == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++)
		if ((mm[i].identifier = own_str(b, k->mm[i].identifier)) == NULL)
			return NULL;
	return pk;
}

int
kvp_batch_allocate(struct kvp_batch *b, uint32_t n)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__AllocateRequest *m;
	if (b == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	kvpool__v1__allocate_request__init(m);
	m->num_blocks = n;
	call->call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE;
	call->allocate = m;
	return KVP_OK;
}

static int
batch_ids(struct kvp_batch *b, int which, const int32_t *ids, size_t n)
{
	Kvpool__V1__BatchCall *call;
	int32_t *copy;
	if (b == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (copy = own(b, ids, n * sizeof(*ids))) == NULL)
		return KVP_ENOMEM;
	/* Touch, Free and Evict requests share one layout: a repeated id list. */
	void *m = own(b, NULL, sizeof(Kvpool__V1__FreeRequest));
	if (m == NULL)
		return KVP_ENOMEM;
	call->call_case = (Kvpool__V1__BatchCall__CallCase)which;
	if (which == KVPOOL__V1__BATCH_CALL__CALL_TOUCH) {
		Kvpool__V1__TouchRequest *t = m;
		kvpool__v1__touch_request__init(t);
		t->block_ids = copy;
		t->n_block_ids = n;
		call->touch = t;
	} else if (which == KVPOOL__V1__BATCH_CALL__CALL_FREE) {
		Kvpool__V1__FreeRequest *f = m;
		kvpool__v1__free_request__init(f);
		f->block_ids = copy;
		f->n_block_ids = n;
		call->free = f;
	} else {
		Kvpool__V1__EvictRequest *e = m;
		kvpool__v1__evict_request__init(e);
		e->block_ids = copy;
		e->n_block_ids = n;
		call->evict = e;
	}
	return KVP_OK;
}

int
kvp_batch_touch(struct kvp_batch *b, const int32_t *ids, size_t n)
{
	return batch_ids(b, KVPOOL__V1__BATCH_CALL__CALL_TOUCH, ids, n);
}

int
kvp_batch_free(struct kvp_batch *b, const int32_t *ids, size_t n)
{
	return batch_ids(b, KVPOOL__V1__BATCH_CALL__CALL_FREE, ids, n);
}

int
kvp_batch_evict(struct kvp_batch *b, const int32_t *ids, size_t n)
{
	return batch_ids(b, KVPOOL__V1__BATCH_CALL__CALL_EVICT, ids, n);
}

int
kvp_batch_cache(struct kvp_batch *b, const struct kvp_client_cache *a)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__CacheRequest *m;
	if (b == NULL || a == NULL || (a->block_ids == NULL && a->num_block_ids > 0))
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	kvpool__v1__cache_request__init(m);
	m->block_ids = own(b, a->block_ids, a->num_block_ids * sizeof(int32_t));
	m->n_block_ids = a->num_block_ids;
	m->num_cached_blocks = a->num_cached_blocks;
	m->num_full_blocks = a->num_full_blocks;
	m->group_id = a->group_id;
	m->block_size = a->block_size;
	if (a->hashes) {
		m->block_hashes.len = a->num_hashes * KVP_HASH_LEN;
		m->block_hashes.data = own(b, a->hashes, m->block_hashes.len);
	}
	if (a->tokens) {
		m->token_ids = own(b, a->tokens, a->num_tokens * sizeof(int64_t));
		m->n_token_ids = a->num_tokens;
	}
	if (a->parent_hash) {
		if ((m->parent_hash.data = own(b, a->parent_hash, KVP_HASH_LEN)) == NULL)
			return KVP_ENOMEM;
		m->parent_hash.len = KVP_HASH_LEN;
	}
	if ((a->keys || a->has_lora_id) &&
	    (m->keys = own_keys(b, a->keys, a->has_lora_id, a->lora_id)) == NULL)
		return KVP_ENOMEM;
	if (m->block_ids == NULL || (a->hashes && m->block_hashes.data == NULL) ||
	    (a->tokens && m->token_ids == NULL))
		return KVP_ENOMEM;
	call->call_case = KVPOOL__V1__BATCH_CALL__CALL_CACHE;
	call->cache = m;
	return KVP_OK;
}

int
kvp_batch_lookup(struct kvp_batch *b, const struct kvp_client_lookup *q)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__LookupRequest *m;
	if (b == NULL || q == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	kvpool__v1__lookup_request__init(m);
	if (q->hashes) {
		m->block_hashes.len = q->num_hashes * KVP_HASH_LEN;
		if ((m->block_hashes.data = own(b, q->hashes, m->block_hashes.len)) == NULL)
			return KVP_ENOMEM;
	}
	if (q->tokens) {
		if ((m->token_ids = own(b, q->tokens, q->num_tokens * sizeof(int64_t))) == NULL)
			return KVP_ENOMEM;
		m->n_token_ids = q->num_tokens;
	}
	if (q->group_ids) {
		if ((m->group_ids = own(b, q->group_ids, q->num_groups * sizeof(uint32_t))) == NULL)
			return KVP_ENOMEM;
		m->n_group_ids = q->num_groups;
	}
	m->block_size = q->block_size;
	if (q->keys && (m->keys = own_keys(b, q->keys, false, 0)) == NULL)
		return KVP_ENOMEM;
	call->call_case = KVPOOL__V1__BATCH_CALL__CALL_LOOKUP;
	call->lookup = m;
	return KVP_OK;
}

int
kvp_batch_allocate_slots(struct kvp_batch *b, const struct kvp_client_slots *a)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__AllocateSlotsRequest *m;
	if (b == NULL || a == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	kvpool__v1__allocate_slots_request__init(m);
	m->request_id = a->request_id;
	if (a->prompt) {
		if ((m->prompt_token_ids = own(b, a->prompt, a->num_prompt * sizeof(int64_t))) == NULL)
			return KVP_ENOMEM;
		m->n_prompt_token_ids = a->num_prompt;
	}
	if (a->new_tokens) {
		m->new_token_ids = own(b, a->new_tokens, a->num_new_token_ids * sizeof(int64_t));
		if (m->new_token_ids == NULL)
			return KVP_ENOMEM;
		m->n_new_token_ids = a->num_new_token_ids;
	}
	m->num_new_tokens = a->num_new_tokens;
	m->token_budget = a->token_budget;
	m->num_lookahead_tokens = a->num_lookahead_tokens;
	m->use_prefix_cache = a->use_prefix_cache;
	m->delay_cache_blocks = a->delay_cache_blocks;
	if ((a->keys || a->has_lora_id) &&
	    (m->keys = own_keys(b, a->keys, a->has_lora_id, a->lora_id)) == NULL)
		return KVP_ENOMEM;
	call->call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS;
	call->allocate_slots = m;
	return KVP_OK;
}

int
kvp_batch_free_request(struct kvp_batch *b, uint64_t request_id, bool preempt)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__FreeRequestRequest *m;
	if (b == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	kvpool__v1__free_request_request__init(m);
	m->request_id = request_id;
	m->preempt = preempt;
	call->call_case = KVPOOL__V1__BATCH_CALL__CALL_FREE_REQUEST;
	call->free_request = m;
	return KVP_OK;
}

int
kvp_client_batch(struct kvp_client *c, struct kvp_batch *b, size_t *num_run)
{
	Kvpool__V1__BatchRequest m = KVPOOL__V1__BATCH_REQUEST__INIT;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	nng_msg *msg = NULL;
	int rv;

	if (c == NULL || b == NULL || num_run == NULL)
		return KVP_EINVAL;
	*num_run = 0;
	kvpool__v1__reply__free_unpacked(b->reply, NULL);
	b->reply = NULL;
	m.calls = b->calls;
	m.n_calls = b->n;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	rq.batch = &m;
	/* Like call(), but a failed batch still carries the replies of what ran. */
	if ((rv = kvp_client_send_(c, &rq, &msg)) != KVP_OK)
		return rv;
	b->reply = kvpool__v1__reply__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
	nng_msg_free(msg);
	if (b->reply == NULL)
		return set_detail(c, KVP_EINTERNAL, "malformed reply from the daemon", NULL);
	rv = kvp_wire_status(b->reply->status);
	if (b->reply->result_case == KVPOOL__V1__REPLY__RESULT_BATCH) {
		*num_run = b->reply->batch->n_replies;
		if (*num_run > 0 && rv != KVP_OK) {
			const Kvpool__V1__Reply *last = b->reply->batch->replies[*num_run - 1];
			set_detail(c, rv, "%s", last->detail);
		}
	} else if (rv != KVP_OK) {
		set_detail(c, rv, "%s", b->reply->detail);
	}
	return rv;
}

static const Kvpool__V1__Reply *
batch_reply(const struct kvp_batch *b, size_t i)
{
	if (b == NULL || b->reply == NULL || b->reply->result_case != KVPOOL__V1__REPLY__RESULT_BATCH ||
	    i >= b->reply->batch->n_replies)
		return NULL;
	return b->reply->batch->replies[i];
}

int
kvp_batch_status(const struct kvp_batch *b, size_t i)
{
	const Kvpool__V1__Reply *r = batch_reply(b, i);
	return r ? kvp_wire_status(r->status) : KVP_ENOTFOUND;
}

int
kvp_batch_block_ids(const struct kvp_batch *b, size_t i, const int32_t **ids, size_t *n)
{
	const Kvpool__V1__Reply *r = batch_reply(b, i);
	if (r == NULL || ids == NULL || n == NULL)
		return KVP_ENOTFOUND;
	switch (r->result_case) {
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE:
		*ids = r->allocate->block_ids;
		*n = r->allocate->n_block_ids;
		return KVP_OK;
	case KVPOOL__V1__REPLY__RESULT_LOOKUP:
		*ids = r->lookup->block_ids;
		*n = r->lookup->n_block_ids;
		return KVP_OK;
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS:
		*ids = r->allocate_slots->new_block_ids;
		*n = r->allocate_slots->n_new_block_ids;
		return KVP_OK;
	default:
		return KVP_ENOTFOUND;
	}
}

