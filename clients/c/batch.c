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

/* ---- batches ---- */

/* Bump allocation in chunks, reset (not freed) when the batch is cleared. */
struct chunk {
	struct chunk *next;
	size_t size, used;
	_Alignas(16) unsigned char data[];
};
struct arena {
	struct chunk *head, *cur;
};
#define CHUNK_MIN (64u * 1024u)

static void *
arena_alloc(struct arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (n == 0)
		n = 16;
	for (struct chunk *k = a->cur; k != NULL; k = k->next) {
		if (k->size - k->used >= n) {
			void *p = k->data + k->used;
			k->used += n;
			a->cur = k;
			return p;
		}
		if (k->next == NULL || k->next->used != 0)
			break;
	}
	size_t size = n > CHUNK_MIN ? n : CHUNK_MIN;
	struct chunk *k = malloc(sizeof(*k) + size);
	if (k == NULL)
		return NULL;
	k->size = size;
	k->used = n;
	/* After the current chunk, so later chunks keep their place for reuse. */
	if (a->cur == NULL) {
		k->next = a->head;
		a->head = k;
	} else {
		k->next = a->cur->next;
		a->cur->next = k;
	}
	a->cur = k;
	return k->data;
}

static void
arena_reset(struct arena *a)
{
	for (struct chunk *k = a->head; k != NULL; k = k->next)
		k->used = 0;
	a->cur = a->head;
}

static void
arena_fini(struct arena *a)
{
	while (a->head != NULL) {
		struct chunk *k = a->head;
		a->head = k->next;
		free(k);
	}
	a->cur = NULL;
}

/* protobuf-c's allocator over an arena: the reply is dropped all at once. */
static void *
pb_alloc(void *ctx, size_t n)
{
	return arena_alloc(ctx, n);
}
static void
pb_free(void *ctx, void *p)
{
	(void)ctx;
	(void)p;
}

struct kvp_batch {
	Kvpool__V1__BatchCall **calls;
	size_t n, cap;
	unsigned flags;
	struct arena args;          /* the calls and every copy they point into */
	struct arena results;       /* the last send's decoded reply */
	Kvpool__V1__Reply *reply;   /* the last send's reply, in results */
	size_t sent_bytes, reply_bytes;
	uint32_t hash_len;          /* the last send's pool's hash width (lookup results) */
};

int
kvp_batch_create(struct kvp_batch **out)
{
	if (out == NULL)
		return KVP_EINVAL;
	*out = calloc(1, sizeof(**out));
	return *out ? KVP_OK : KVP_ENOMEM;
}

static void
drop_results(struct kvp_batch *b)
{
	arena_reset(&b->results);
	b->reply = NULL;
}

void
kvp_batch_clear(struct kvp_batch *b)
{
	if (b == NULL)
		return;
	arena_reset(&b->args);
	b->n = 0;
	drop_results(b);
}

void
kvp_batch_destroy(struct kvp_batch *b)
{
	if (b == NULL)
		return;
	arena_fini(&b->args);
	arena_fini(&b->results);
	free(b->calls);
	free(b);
}

size_t
kvp_batch_count(const struct kvp_batch *b)
{
	return b ? b->n : 0;
}

int
kvp_batch_set_flags(struct kvp_batch *b, unsigned flags)
{
	if (b == NULL || (flags & ~(KVP_BATCH_CONTINUE | KVP_BATCH_BORROW)) != 0)
		return KVP_EINVAL;
	b->flags = flags;
	return KVP_OK;
}

/* A zeroed allocation the batch owns (a copy of src if not NULL); NULL on ENOMEM. */
static void *
own(struct kvp_batch *b, const void *src, size_t n)
{
	void *p = arena_alloc(&b->args, n);
	if (p == NULL)
		return NULL;
	if (src != NULL && n > 0)
		memcpy(p, src, n);
	else
		memset(p, 0, n ? n : 1);
	return p;
}

/* The caller's array: referenced under KVP_BATCH_BORROW, else copied. */
static void *
ref(struct kvp_batch *b, const void *src, size_t n)
{
	if ((b->flags & KVP_BATCH_BORROW) && src != NULL)
		return (void *)(uintptr_t)src;
	return own(b, src, n);
}

static char *
own_str(struct kvp_batch *b, const char *s)
{
	return s ? ref(b, s, strlen(s) + 1) : NULL;
}

/*
 * A new call, not yet in the list: an adder fills it and push()es it only
 * when everything it needs was allocated, so a failed adder adds nothing.
 */
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
	return call;
}

static int
push(struct kvp_batch *b, Kvpool__V1__BatchCall *call, int which, void *msg)
{
	call->call_case = (Kvpool__V1__BatchCall__CallCase)which;
	call->allocate = msg; /* the oneof's members share one pointer */
	b->calls[b->n++] = call;
	drop_results(b); /* results no longer match */
	return KVP_OK;
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
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE, m);
}

/* Touch, Free and Evict requests share one layout: a repeated id list. */
static int
batch_ids(struct kvp_batch *b, int which, const int32_t *ids, size_t n)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__FreeRequest *m;
	int32_t *copy;
	if (b == NULL || (ids == NULL && n > 0))
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (copy = ref(b, ids, n * sizeof(*ids))) == NULL ||
	    (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	if (which == KVPOOL__V1__BATCH_CALL__CALL_TOUCH)
		kvpool__v1__touch_request__init((Kvpool__V1__TouchRequest *)m);
	else if (which == KVPOOL__V1__BATCH_CALL__CALL_FREE)
		kvpool__v1__free_request__init(m);
	else
		kvpool__v1__evict_request__init((Kvpool__V1__EvictRequest *)m);
	m->block_ids = copy;
	m->n_block_ids = n;
	return push(b, call, which, m);
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

/*
 * The arrays a built request points at, made the batch's own (copied, or
 * kept as the caller's under KVP_BATCH_BORROW). false on ENOMEM.
 */
#define OWN(b, field, n) ((field) == NULL || ((field) = ref((b), (field), (n))) != NULL)

int
kvp_batch_cache(struct kvp_batch *b, const struct kvp_client_cache *a)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__CacheRequest *m;
	int rv;

	if (b == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	if ((rv = kvp_build_cache_(m, a, KVP_HASH_LEN)) != KVP_OK)
		return rv;
	if (!OWN(b, m->block_ids, m->n_block_ids * sizeof(int32_t)) ||
	    !OWN(b, m->block_hashes.data, m->block_hashes.len) ||
	    !OWN(b, m->token_ids, m->n_token_ids * sizeof(int64_t)) ||
	    !OWN(b, m->parent_hash.data, m->parent_hash.len) ||
	    !OWN(b, m->block_mask.data, m->block_mask.len))
		return KVP_ENOMEM;
	if ((a->keys || a->has_lora_id) &&
	    (m->keys = own_keys(b, a->keys, a->has_lora_id, a->lora_id)) == NULL)
		return KVP_ENOMEM;
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_CACHE, m);
}

int
kvp_batch_lookup(struct kvp_batch *b, const struct kvp_client_lookup *q)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__LookupRequest *m;
	int rv;

	if (b == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	if ((rv = kvp_build_lookup_(m, q, KVP_HASH_LEN)) != KVP_OK)
		return rv;
	if (!OWN(b, m->block_hashes.data, m->block_hashes.len) ||
	    !OWN(b, m->token_ids, m->n_token_ids * sizeof(int64_t)) ||
	    !OWN(b, m->group_ids, m->n_group_ids * sizeof(uint32_t)))
		return KVP_ENOMEM;
	if (q->keys && (m->keys = own_keys(b, q->keys, false, 0)) == NULL)
		return KVP_ENOMEM;
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_LOOKUP, m);
}

int
kvp_batch_allocate_slots(struct kvp_batch *b, const struct kvp_client_slots *a)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__AllocateSlotsRequest *m;
	int rv;

	if (b == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	if ((rv = kvp_build_slots_(m, a)) != KVP_OK)
		return rv;
	if (!OWN(b, m->prompt_token_ids, m->n_prompt_token_ids * sizeof(int64_t)) ||
	    !OWN(b, m->new_token_ids, m->n_new_token_ids * sizeof(int64_t)))
		return KVP_ENOMEM;
	if ((a->keys || a->has_lora_id) &&
	    (m->keys = own_keys(b, a->keys, a->has_lora_id, a->lora_id)) == NULL)
		return KVP_ENOMEM;
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS, m);
}

#undef OWN

int
kvp_batch_allocate_slots_n(struct kvp_batch *b, size_t n, const uint64_t *request_ids,
                           const uint32_t *num_new_tokens, const uint32_t *num_token_ids,
                           const int64_t *token_ids, uint32_t num_lookahead_tokens,
                           bool delay_cache_blocks)
{
	size_t total = 0, start;
	const int64_t *toks;

	if (b == NULL || (n > 0 && (request_ids == NULL || num_new_tokens == NULL)))
		return KVP_EINVAL;
	for (size_t i = 0; num_token_ids != NULL && i < n; i++) {
		if (num_token_ids[i] > SIZE_MAX - total)
			return KVP_EINVAL;
		total += num_token_ids[i];
	}
	if (total > 0 && token_ids == NULL)
		return KVP_EINVAL;
	if (total > SIZE_MAX / sizeof(int64_t))
		return KVP_EINVAL;
	if ((toks = ref(b, token_ids, total * sizeof(int64_t))) == NULL)
		return KVP_ENOMEM;
	start = b->n;
	for (size_t i = 0, off = 0; i < n; i++) {
		Kvpool__V1__BatchCall *call = new_call(b);
		Kvpool__V1__AllocateSlotsRequest *m;
		if (call == NULL || (m = own(b, NULL, sizeof(*m))) == NULL) {
			b->n = start; /* none of them */
			return KVP_ENOMEM;
		}
		kvpool__v1__allocate_slots_request__init(m);
		m->request_id = request_ids[i];
		m->num_new_tokens = num_new_tokens[i];
		m->num_lookahead_tokens = num_lookahead_tokens;
		m->delay_cache_blocks = delay_cache_blocks;
		if (num_token_ids != NULL && num_token_ids[i] > 0) {
			m->new_token_ids = (int64_t *)(uintptr_t)(toks + off);
			m->n_new_token_ids = num_token_ids[i];
			off += num_token_ids[i];
		}
		push(b, call, KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS, m);
	}
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
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_FREE_REQUEST, m);
}

int
kvp_batch_get_computed_blocks(struct kvp_batch *b, uint64_t request_id)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__GetComputedBlocksRequest *m;
	if (b == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	kvpool__v1__get_computed_blocks_request__init(m);
	m->request_id = request_id;
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_GET_COMPUTED_BLOCKS, m);
}

int
kvp_batch_stats(struct kvp_batch *b)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__StatsRequest *m;
	if (b == NULL)
		return KVP_EINVAL;
	if ((call = new_call(b)) == NULL || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	kvpool__v1__stats_request__init(m);
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_STATS, m);
}

int
kvp_client_batch(struct kvp_client *c, struct kvp_batch *b, size_t *num_run)
{
	Kvpool__V1__BatchRequest m = KVPOOL__V1__BATCH_REQUEST__INIT;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	ProtobufCAllocator pb = {pb_alloc, pb_free, &b->results};
	nng_msg *msg = NULL;
	int rv;

	if (c == NULL || b == NULL || num_run == NULL)
		return KVP_EINVAL;
	*num_run = 0;
	drop_results(b);
	b->sent_bytes = b->reply_bytes = 0;
	m.calls = b->calls;
	m.n_calls = b->n;
	m.continue_on_error = (b->flags & KVP_BATCH_CONTINUE) != 0;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	rq.batch = &m;
	/* Like kvp_client_call_(), but a failed batch still carries the replies of what ran. */
	if ((rv = kvp_client_send_(c, &rq, &msg)) != KVP_OK)
		return rv;
	b->sent_bytes = c->last_sent;
	b->reply_bytes = nng_msg_len(msg);
	/* Decoded into the batch's arena: no allocation per reply once it has grown. */
	b->hash_len = c->info.hash_len;
	b->reply = kvpool__v1__reply__unpack(&pb, nng_msg_len(msg), nng_msg_body(msg));
	nng_msg_free(msg);
	if (b->reply == NULL) {
		drop_results(b);
		return kvp_client_fail_(c, KVP_EINTERNAL, "malformed reply from the daemon", NULL);
	}
	if (b->reply->call_id != rq.call_id && b->reply->call_id != 0) {
		drop_results(b);
		return kvp_client_fail_(c, KVP_EINTERNAL, "reply to another call", NULL);
	}
	rv = kvp_wire_status(b->reply->status);
	if (b->reply->result_case == KVPOOL__V1__REPLY__RESULT_BATCH) {
		*num_run = b->reply->batch->n_replies;
		if (*num_run > b->n) {
			drop_results(b);
			*num_run = 0;
			return kvp_client_fail_(c, KVP_EINTERNAL, "more replies than calls in the batch", NULL);
		}
	}
	c->detail[0] = '\0';
	if (rv == KVP_OK)
		return rv;
	/* The batch's words (which call) and the failed call's own (why). */
	const char *why = "";
	for (size_t i = 0; i < *num_run; i++) {
		const Kvpool__V1__Reply *sub = b->reply->batch->replies[i];
		if (kvp_wire_status(sub->status) != KVP_OK) {
			why = sub->detail ? sub->detail : "";
			break;
		}
	}
	snprintf(c->detail, sizeof(c->detail), "%s%s%s", b->reply->detail ? b->reply->detail : "",
	         why[0] ? ": " : "", why);
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
	struct kvp_batch_result res;
	if (ids == NULL || n == NULL || kvp_batch_result(b, i, &res) != KVP_OK ||
	    res.status != KVP_OK || !res.has_block_ids)
		return KVP_ENOTFOUND;
	*ids = res.block_ids;
	*n = res.num_block_ids;
	return KVP_OK;
}

int
kvp_batch_result(const struct kvp_batch *b, size_t i, struct kvp_batch_result *out)
{
	const Kvpool__V1__Reply *r = batch_reply(b, i);
	if (out == NULL)
		return KVP_EINVAL;
	memset(out, 0, sizeof(*out));
	out->detail = "";
	if (r == NULL) {
		out->status = KVP_ENOTFOUND;
		return KVP_ENOTFOUND;
	}
	out->status = kvp_wire_status(r->status);
	if (r->detail != NULL)
		out->detail = r->detail;
	switch (r->result_case) {
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE:
		out->has_block_ids = true;
		out->block_ids = r->allocate->block_ids;
		out->num_block_ids = r->allocate->n_block_ids;
		break;
	case KVPOOL__V1__REPLY__RESULT_CACHE:
		out->count = r->cache->num_stored;
		break;
	case KVPOOL__V1__REPLY__RESULT_EVICT:
		out->count = r->evict->num_evicted;
		break;
	case KVPOOL__V1__REPLY__RESULT_LOOKUP:
		out->has_block_ids = true;
		out->block_ids = r->lookup->block_ids;
		out->num_block_ids = r->lookup->n_block_ids;
		out->count = r->lookup->num_hit_blocks;
		out->slots.hit_tokens = r->lookup->hit_tokens;
		out->hashes = r->lookup->block_hashes.data;
		out->num_hashes =
			r->lookup->block_hashes.len / (b->hash_len ? b->hash_len : KVP_HASH_LEN);
		if (r->lookup->n_ref_cnts == r->lookup->n_block_ids && r->lookup->n_ref_cnts > 0)
			out->ref_cnts = r->lookup->ref_cnts;
		break;
	case KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS: {
		const Kvpool__V1__AllocateSlotsReply *s = r->allocate_slots;
		out->has_block_ids = true;
		out->block_ids = s->new_block_ids;
		out->num_block_ids = s->n_new_block_ids;
		kvp_client_slots_from_(s, &out->slots);
		break;
	}
	case KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS:
		out->has_block_ids = true;
		out->block_ids = r->get_computed_blocks->block_ids;
		out->num_block_ids = r->get_computed_blocks->n_block_ids;
		out->slots.hit_tokens = r->get_computed_blocks->hit_tokens;
		break;
	case KVPOOL__V1__REPLY__RESULT_STATS:
		out->has_stats = true;
		kvp_client_stats_from_(r->stats, &out->stats);
		break;
	default:
		break;
	}
	return KVP_OK;
}

int
kvp_batch_slots_results(const struct kvp_batch *b, size_t first, size_t n, size_t num_groups,
                        int32_t *status, uint32_t *num_computed_tokens, uint32_t *new_blocks,
                        int32_t *block_ids, size_t cap, size_t *num_ids)
{
	size_t total = 0;

	if (b == NULL || status == NULL || num_computed_tokens == NULL || num_ids == NULL ||
	    num_groups == 0 || num_groups > KVP_MAX_GROUPS || first > b->n || n > b->n - first ||
	    (cap > 0 && block_ids == NULL) || (n > 0 && new_blocks == NULL))
		return KVP_EINVAL;
	/* Validate first: every call that ran and succeeded is an AllocateSlots that fits. */
	for (size_t i = first; i < first + n; i++) {
		const Kvpool__V1__Reply *r = batch_reply(b, i);
		if (r == NULL || kvp_wire_status(r->status) != KVP_OK)
			continue;
		if (r->result_case != KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS ||
		    r->allocate_slots->n_new_blocks_per_group > num_groups)
			return KVP_EINVAL;
		total += r->allocate_slots->n_new_block_ids;
	}
	if (total > cap) /* as kvp_client_allocate_slots: the buffer is too small */
		return KVP_EINVAL;
	total = 0;
	for (size_t i = 0; i < n; i++) {
		const Kvpool__V1__Reply *r = batch_reply(b, first + i);
		uint32_t *rows = new_blocks + i * num_groups;
		memset(rows, 0, num_groups * sizeof(*rows));
		num_computed_tokens[i] = 0;
		status[i] = r ? kvp_wire_status(r->status) : KVP_ENOTFOUND;
		if (status[i] != KVP_OK)
			continue;
		const Kvpool__V1__AllocateSlotsReply *s = r->allocate_slots;
		num_computed_tokens[i] = s->num_computed_tokens;
		for (size_t g = 0; g < s->n_new_blocks_per_group; g++)
			rows[g] = s->new_blocks_per_group[g];
		if (s->n_new_blocks_per_group == 0)
			rows[0] = (uint32_t)s->n_new_block_ids;
		if (s->n_new_block_ids > 0)
			memcpy(block_ids + total, s->new_block_ids, s->n_new_block_ids * sizeof(int32_t));
		total += s->n_new_block_ids;
	}
	*num_ids = total;
	return KVP_OK;
}

int
kvp_batch_wire_bytes(const struct kvp_batch *b, size_t *request, size_t *reply)
{
	if (b == NULL || request == NULL || reply == NULL)
		return KVP_EINVAL;
	*request = b->sent_bytes;
	*reply = b->reply_bytes;
	return KVP_OK;
}
