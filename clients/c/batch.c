/* SPDX-License-Identifier: Apache-2.0 */
/*
 * batch.c: the Batch builder (kvp_batch_*): several calls to send as one
 * round trip (batch_send.c), executed in order under the pool's lock.
 */
#include "clients/c/kvpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/batch_impl.h"
#include "clients/c/client_impl.h"
#include "proto/wire.h"

/* ---- batches ---- */

struct kvpc_chunk {
	struct kvpc_chunk *next;
	size_t size, used;
	_Alignas(16) unsigned char data[];
};
#define CHUNK_MIN (64u * 1024u)

void *
kvpc_arena_alloc(struct kvpc_arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (n == 0)
		n = 16;
	for (struct kvpc_chunk *k = a->cur; k != NULL; k = k->next) {
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
	struct kvpc_chunk *k = malloc(sizeof(*k) + size);
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

void
kvpc_arena_reset(struct kvpc_arena *a)
{
	for (struct kvpc_chunk *k = a->head; k != NULL; k = k->next)
		k->used = 0;
	a->cur = a->head;
}

void
kvpc_arena_fini(struct kvpc_arena *a)
{
	while (a->head != NULL) {
		struct kvpc_chunk *k = a->head;
		a->head = k->next;
		free(k);
	}
	a->cur = NULL;
}

int
kvp_batch_create(struct kvp_batch **out)
{
	if (out == NULL)
		return KVP_EINVAL;
	*out = calloc(1, sizeof(**out));
	return *out ? KVP_OK : KVP_ENOMEM;
}

void
kvpc_batch_drop_results(struct kvp_batch *b)
{
	kvpc_arena_reset(&b->results);
	b->reply = NULL;
	if (b->reply_msg != NULL)
		nng_msg_free(b->reply_msg);
	b->reply_msg = NULL;
	b->views = NULL;
	b->num_run = 0;
}

void
kvp_batch_clear(struct kvp_batch *b)
{
	if (b == NULL)
		return;
	kvpc_arena_reset(&b->args);
	b->n = b->nw = 0;
	b->has_runs = false;
	kvpc_batch_drop_results(b);
}

void
kvp_batch_destroy(struct kvp_batch *b)
{
	if (b == NULL)
		return;
	kvpc_batch_drop_results(b);
	kvpc_arena_fini(&b->args);
	kvpc_arena_fini(&b->results);
	free(b->calls);
	free(b->map);
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
	if (b == NULL || (flags & ~(KVP_BATCH_CONTINUE | KVP_BATCH_BORROW | KVP_BATCH_PLAIN)) != 0)
		return KVP_EINVAL;
	b->flags = flags;
	return KVP_OK;
}

/* A zeroed allocation the batch owns (a copy of src if not NULL); NULL on ENOMEM. */
static void *
own(struct kvp_batch *b, const void *src, size_t n)
{
	void *p = kvpc_arena_alloc(&b->args, n);
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

/* Room for k more calls (each its own wire call, or k in one run). */
static bool
reserve(struct kvp_batch *b, size_t k)
{
	if (b->nw == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 16;
		Kvpool__V1__BatchCall **nc = realloc(b->calls, cap * sizeof(*nc));
		if (nc == NULL)
			return false;
		b->calls = nc;
		b->cap = cap;
	}
	if (k > SIZE_MAX / sizeof(*b->map) / 2 - b->n)
		return false;
	if (b->n + k > b->map_cap) {
		size_t cap = b->map_cap ? b->map_cap * 2 : 16;
		while (cap < b->n + k)
			cap *= 2;
		struct kvpc_batch_slot *nm = realloc(b->map, cap * sizeof(*nm));
		if (nm == NULL)
			return false;
		b->map = nm;
		b->map_cap = cap;
	}
	return true;
}

/*
 * A new call, not yet in the list: an adder fills it and push()es it only
 * when everything it needs was allocated, so a failed adder adds nothing.
 */
static Kvpool__V1__BatchCall *
new_call(struct kvp_batch *b)
{
	Kvpool__V1__BatchCall *call;
	if (!reserve(b, 1) || (call = own(b, NULL, sizeof(*call))) == NULL)
		return NULL;
	kvpool__v1__batch_call__init(call);
	return call;
}

/* Adds the wire call, standing for k calls (k > 1: a run). */
static int
push_k(struct kvp_batch *b, Kvpool__V1__BatchCall *call, int which, void *msg, size_t k)
{
	call->call_case = (Kvpool__V1__BatchCall__CallCase)which;
	call->allocate = msg; /* the oneof's members share one pointer */
	for (size_t i = 0; i < k; i++)
		b->map[b->n++] = (struct kvpc_batch_slot){(uint32_t)b->nw, (uint32_t)i};
	b->calls[b->nw++] = call;
	kvpc_batch_drop_results(b); /* results no longer match */
	return KVP_OK;
}

static int
push(struct kvp_batch *b, Kvpool__V1__BatchCall *call, int which, void *msg)
{
	return push_k(b, call, which, msg, 1);
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
	if (k && k->lora_path && (pk->lora_path = own_str(b, k->lora_path)) == NULL)
		return NULL;
	if (k && k->cache_salt && (pk->cache_salt = own_str(b, k->cache_salt)) == NULL)
		return NULL;
	if (k && k->session_id && (pk->session_id = own_str(b, k->session_id)) == NULL)
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
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__SlotsRunRequest *m;
	size_t total = 0;

	if (b == NULL || (n > 0 && (request_ids == NULL || num_new_tokens == NULL)))
		return KVP_EINVAL;
	for (size_t i = 0; num_token_ids != NULL && i < n; i++) {
		if (num_token_ids[i] > SIZE_MAX - total)
			return KVP_EINVAL;
		total += num_token_ids[i];
	}
	if ((total > 0 && token_ids == NULL) || total > SIZE_MAX / sizeof(int64_t) ||
	    n > UINT32_MAX)
		return KVP_EINVAL;
	if (n == 0)
		return KVP_OK;
	/* One wire call for all n (a slots run): its arrays are the caller's, as they are. */
	if ((call = new_call(b)) == NULL || !reserve(b, n) || (m = own(b, NULL, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	kvpool__v1__slots_run_request__init(m);
	m->n_request_ids = m->n_num_new_tokens = n;
	m->num_lookahead_tokens = num_lookahead_tokens;
	m->delay_cache_blocks = delay_cache_blocks;
	if ((m->request_ids = ref(b, request_ids, n * sizeof(uint64_t))) == NULL ||
	    (m->num_new_tokens = ref(b, num_new_tokens, n * sizeof(uint32_t))) == NULL)
		return KVP_ENOMEM;
	if (total > 0) {
		m->n_num_token_ids = n;
		m->n_token_ids = total;
		if ((m->num_token_ids = ref(b, num_token_ids, n * sizeof(uint32_t))) == NULL ||
		    (m->token_ids = ref(b, token_ids, total * sizeof(int64_t))) == NULL)
			return KVP_ENOMEM;
	}
	b->has_runs = true;
	return push_k(b, call, KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN, m, n);
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


/*
 * Reserve, Commit, Abort, LookupAndLock and Unlock: each request's field 1
 * is its keys (bytes). A new call and its request of desc's type with n
 * keys of key_len bytes (the batch's own, or the caller's under
 * KVP_BATCH_BORROW); NULL in *call on ENOMEM. The caller sets the rest and
 * push()es.
 */
static void *
keys_call(struct kvp_batch *b, Kvpool__V1__BatchCall **call, const ProtobufCMessageDescriptor *desc,
          const uint8_t *keys, size_t n, size_t key_len)
{
	void *m;
	uint8_t *copy = NULL;
	if ((*call = new_call(b)) == NULL || (m = own(b, NULL, desc->sizeof_message)) == NULL ||
	    (n > 0 && (copy = ref(b, keys, n * key_len)) == NULL)) {
		*call = NULL;
		return NULL;
	}
	protobuf_c_message_init(desc, m);
	ProtobufCBinaryData *field = (ProtobufCBinaryData *)((char *)m + desc->fields[0].offset);
	field->data = copy;
	field->len = n * key_len;
	return m;
}

static bool
keys_ok(const struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len)
{
	return b != NULL && (keys != NULL || n == 0) && key_len > 4 && key_len <= 68 &&
	       n <= SIZE_MAX / key_len;
}

/* Reserve, Abort and Unlock: the keys and nothing else. */
static int
keys_only(struct kvp_batch *b, int which, const ProtobufCMessageDescriptor *desc,
          const uint8_t *keys, size_t n, size_t key_len)
{
	Kvpool__V1__BatchCall *call;
	void *m;
	if (!keys_ok(b, keys, n, key_len))
		return KVP_EINVAL;
	if ((m = keys_call(b, &call, desc, keys, n, key_len)) == NULL)
		return KVP_ENOMEM;
	return push(b, call, which, m);
}

int
kvp_batch_reserve(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len)
{
	return keys_only(b, KVPOOL__V1__BATCH_CALL__CALL_RESERVE,
	                 &kvpool__v1__reserve_request__descriptor, keys, n, key_len);
}

int
kvp_batch_abort(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len)
{
	return keys_only(b, KVPOOL__V1__BATCH_CALL__CALL_ABORT, &kvpool__v1__abort_request__descriptor,
	                 keys, n, key_len);
}

int
kvp_batch_unlock(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len)
{
	return keys_only(b, KVPOOL__V1__BATCH_CALL__CALL_UNLOCK,
	                 &kvpool__v1__unlock_request__descriptor, keys, n, key_len);
}

int
kvp_batch_commit(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len,
                 const uint32_t *crc32c)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__CommitRequest *m;
	if (!keys_ok(b, keys, n, key_len))
		return KVP_EINVAL;
	if ((m = keys_call(b, &call, &kvpool__v1__commit_request__descriptor, keys, n, key_len)) ==
	    NULL)
		return KVP_ENOMEM;
	if (crc32c == NULL || n == 0)
		m->no_checksum = true;
	else if ((m->crc32c = ref(b, crc32c, n * sizeof(*crc32c))) == NULL)
		return KVP_ENOMEM;
	else
		m->n_crc32c = n;
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_COMMIT, m);
}

int
kvp_batch_lookup_lock(struct kvp_batch *b, const uint8_t *keys, size_t n, size_t key_len,
                      bool prefix)
{
	Kvpool__V1__BatchCall *call;
	Kvpool__V1__LookupAndLockRequest *m;
	if (!keys_ok(b, keys, n, key_len))
		return KVP_EINVAL;
	if ((m = keys_call(b, &call, &kvpool__v1__lookup_and_lock_request__descriptor, keys, n,
	                   key_len)) == NULL)
		return KVP_ENOMEM;
	m->prefix = prefix;
	return push(b, call, KVPOOL__V1__BATCH_CALL__CALL_LOOKUP_AND_LOCK, m);
}
