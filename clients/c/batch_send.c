/* SPDX-License-Identifier: Apache-2.0 */
/*
 * batch_send.c: kvp_client_batch() and the results of a sent batch. A
 * slots run's reply is checked whole when it arrives (a daemon's reply is
 * input like any other), then read call by call like a plain call's.
 */
#include "clients/c/kvpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/batch_impl.h"
#include "clients/c/client_impl.h"
#include "proto/pb_read.h"
#include "proto/wire.h"

/* protobuf-c's allocator over an arena: the reply is dropped all at once. */
static void *
pb_alloc(void *ctx, size_t n)
{
	return kvpc_arena_alloc(ctx, n);
}
static void
pb_free(void *ctx, void *p)
{
	(void)ctx;
	(void)p;
}

static bool
is_run(const Kvpool__V1__BatchCall *call)
{
	return call->call_case == KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN;
}

/* The calls a wire call stands for. */
static size_t
wire_calls(const Kvpool__V1__BatchCall *call)
{
	return is_run(call) ? call->slots_run->n_request_ids : 1;
}

/*
 * The batch's calls one wire call each, for a daemon that runs no slots
 * runs: each run's call i becomes the AllocateSlots it stands for. In the
 * results arena (dropped with the reply). NULL on ENOMEM.
 */
static Kvpool__V1__BatchCall **
plain_calls(struct kvp_batch *b)
{
	Kvpool__V1__BatchCall **out = kvpc_arena_alloc(&b->results, b->n * sizeof(*out) + 1);
	size_t tok = 0;

	for (size_t i = 0; out != NULL && i < b->n; i++) {
		const Kvpool__V1__BatchCall *w = b->calls[b->map[i].wire];
		if (!is_run(w)) {
			out[i] = (Kvpool__V1__BatchCall *)(uintptr_t)w;
			continue;
		}
		const Kvpool__V1__SlotsRunRequest *r = w->slots_run;
		size_t k = b->map[i].sub;
		Kvpool__V1__BatchCall *call = kvpc_arena_alloc(&b->results, sizeof(*call));
		Kvpool__V1__AllocateSlotsRequest *m = kvpc_arena_alloc(&b->results, sizeof(*m));
		if (call == NULL || m == NULL)
			return NULL;
		kvpool__v1__batch_call__init(call);
		kvpool__v1__allocate_slots_request__init(m);
		tok = k == 0 ? 0 : tok;
		m->request_id = r->request_ids[k];
		m->num_new_tokens = r->num_new_tokens[k];
		m->num_lookahead_tokens = r->num_lookahead_tokens;
		m->delay_cache_blocks = r->delay_cache_blocks;
		if (r->n_num_token_ids > 0 && r->num_token_ids[k] > 0) {
			m->new_token_ids = r->token_ids + tok;
			m->n_new_token_ids = r->num_token_ids[k];
			tok += r->num_token_ids[k];
		}
		call->call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE_SLOTS;
		call->allocate_slots = m;
		out[i] = call;
	}
	return out;
}

/* A run's reply, checked against its run of size calls; false if malformed. */
static bool
view_run(struct kvp_batch *b, const Kvpool__V1__Reply *sub, size_t size,
         struct kvpc_run_view *v)
{
	const Kvpool__V1__SlotsRunReply *r = sub->slots_run;
	size_t n, ng, failed = 0, off = 0;

	memset(v, 0, sizeof(*v));
	if (sub->result_case != KVPOOL__V1__REPLY__RESULT_SLOTS_RUN || r->n_statuses == 0)
		return kvp_wire_status(sub->status) != KVP_OK; /* failed whole: its first call */
	n = r->n_statuses;
	ng = r->num_groups;
	if (n > size || r->n_num_scheduled_tokens != n || r->n_num_computed_tokens != n ||
	    ng == 0 || ng > KVP_MAX_GROUPS || r->n_new_blocks_per_group != n * ng)
		return false;
	v->id_off = kvpc_arena_alloc(&b->results, (n + 1) * sizeof(uint32_t));
	v->detail = kvpc_arena_alloc(&b->results, n * sizeof(uint32_t));
	if (v->id_off == NULL || v->detail == NULL)
		return false;
	for (size_t k = 0; k < n; k++) {
		v->id_off[k] = (uint32_t)off;
		v->detail[k] = (uint32_t)failed;
		failed += kvp_wire_status(r->statuses[k]) != KVP_OK;
		for (size_t g = 0; g < ng; g++) {
			off += r->new_blocks_per_group[k * ng + g];
			if (off > r->n_new_block_ids)
				return false;
		}
	}
	v->id_off[n] = (uint32_t)off;
	if (off != r->n_new_block_ids || failed != r->n_details)
		return false;
	v->r = r;
	return true;
}

/* Checks the reply against the calls sent and counts the calls that ran. */
static bool
read_reply(struct kvp_batch *b)
{
	const Kvpool__V1__BatchReply *br = b->reply->batch;
	size_t nw = b->sent_plain ? b->n : b->nw;

	if (b->reply->result_case != KVPOOL__V1__REPLY__RESULT_BATCH)
		return true; /* the batch failed whole: nothing ran */
	if (br->n_replies > nw)
		return false;
	if (b->sent_plain || !b->has_runs) {
		b->num_run = br->n_replies;
		return true;
	}
	if ((b->views = kvpc_arena_alloc(&b->results, nw * sizeof(*b->views))) == NULL)
		return false;
	for (size_t w = 0; w < br->n_replies; w++) {
		size_t size = wire_calls(b->calls[w]), ran = 1;
		if (is_run(b->calls[w])) {
			if (!view_run(b, br->replies[w], size, &b->views[w]))
				return false;
			ran = b->views[w].r ? b->views[w].r->n_statuses : 1;
		}
		/* Only the last call that ran can have stopped inside its run. */
		if (ran < size && w + 1 < br->n_replies)
			return false;
		b->num_run += ran;
	}
	return true;
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
	kvpc_batch_drop_results(b);
	b->sent_bytes = b->reply_bytes = 0;
	b->sent_plain = b->has_runs && (!c->slots_runs || (b->flags & KVP_BATCH_PLAIN));
	m.calls = b->sent_plain ? plain_calls(b) : b->calls;
	m.n_calls = b->sent_plain ? b->n : b->nw;
	if (m.calls == NULL && m.n_calls > 0)
		return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
	m.continue_on_error = (b->flags & KVP_BATCH_CONTINUE) != 0;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	rq.batch = &m;
	/* Like kvp_client_call_(), but a failed batch still carries the replies of what ran. */
	if ((rv = kvp_client_send_(c, &rq, &msg)) != KVP_OK)
		return rv;
	b->sent_bytes = c->last_sent;
	b->reply_bytes = nng_msg_len(msg);
	/*
	 * Decoded into the batch's arena: no allocation per reply once it has
	 * grown. kvp_pb_read's bytes point into msg, kept until the results are
	 * dropped; protobuf-c, for what it declines, copies them.
	 */
	b->hash_len = c->info.hash_len;
	b->reply = (Kvpool__V1__Reply *)kvp_pb_read(&kvpool__v1__reply__descriptor, &pb,
	                                            nng_msg_body(msg), nng_msg_len(msg));
	if (b->reply != NULL) {
		b->reply_msg = msg;
	} else {
		b->reply = kvpool__v1__reply__unpack(&pb, nng_msg_len(msg), nng_msg_body(msg));
		nng_msg_free(msg);
	}
	if (b->reply == NULL) {
		kvpc_batch_drop_results(b);
		return kvp_client_fail_(c, KVP_EINTERNAL, "malformed reply from the daemon", NULL);
	}
	if (b->reply->call_id != rq.call_id && b->reply->call_id != 0) {
		kvpc_batch_drop_results(b);
		return kvp_client_fail_(c, KVP_EINTERNAL, "reply to another call", NULL);
	}
	if (!read_reply(b)) {
		kvpc_batch_drop_results(b);
		return kvp_client_fail_(c, KVP_EINTERNAL, "the daemon's batch reply does not match "
		                        "the calls sent", NULL);
	}
	*num_run = b->num_run;
	rv = kvp_wire_status(b->reply->status);
	c->detail[0] = '\0';
	if (rv == KVP_OK)
		return rv;
	/* The batch's words (which call) and the failed call's own (why). */
	const char *why = "";
	for (size_t i = 0; i < *num_run; i++) {
		struct kvp_batch_result res;
		if (kvp_batch_result(b, i, &res) == KVP_OK && res.status != KVP_OK) {
			why = res.detail;
			break;
		}
	}
	snprintf(c->detail, sizeof(c->detail), "%s%s%s", b->reply->detail ? b->reply->detail : "",
	         why[0] ? ": " : "", why);
	return rv;
}

/* Call i's place in the last reply: a plain call's reply, or a run's entry. */
struct entry {
	int status;
	const char *detail;
	const Kvpool__V1__Reply *r;         /* a plain call (NULL for a run's entry) */
	const Kvpool__V1__SlotsRunReply *run;
	size_t k;                           /* the entry in run */
	const int32_t *ids;
	size_t nids;
};

static bool
entry(const struct kvp_batch *b, size_t i, struct entry *e)
{
	memset(e, 0, sizeof(*e));
	e->detail = "";
	if (b == NULL || b->reply == NULL || i >= b->num_run)
		return false;
	const Kvpool__V1__BatchReply *br = b->reply->batch;
	if (b->sent_plain || !is_run(b->calls[b->map[i].wire]) ||
	    b->views[b->map[i].wire].r == NULL) {
		e->r = br->replies[b->sent_plain ? i : b->map[i].wire];
		e->status = kvp_wire_status(e->r->status);
		if (e->r->detail != NULL)
			e->detail = e->r->detail;
		if (e->r->result_case == KVPOOL__V1__REPLY__RESULT_SLOTS_RUN)
			e->r = NULL; /* a run that failed whole: only the status and detail */
		return true;
	}
	const struct kvpc_run_view *v = &b->views[b->map[i].wire];
	e->run = v->r;
	e->k = b->map[i].sub;
	e->status = kvp_wire_status(v->r->statuses[e->k]);
	if (e->status != KVP_OK)
		e->detail = v->r->details[v->detail[e->k]];
	e->ids = v->r->new_block_ids + v->id_off[e->k];
	e->nids = v->id_off[e->k + 1] - v->id_off[e->k];
	return true;
}

int
kvp_batch_status(const struct kvp_batch *b, size_t i)
{
	struct entry e;
	return entry(b, i, &e) ? e.status : KVP_ENOTFOUND;
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

/* A run's entry k as an AllocateSlots result. */
static void
run_result(const struct entry *e, struct kvp_batch_result *out)
{
	const Kvpool__V1__SlotsRunReply *r = e->run;
	out->has_block_ids = true;
	out->block_ids = e->ids;
	out->num_block_ids = e->nids;
	out->slots.num_scheduled_tokens = r->num_scheduled_tokens[e->k];
	out->slots.num_computed_tokens = r->num_computed_tokens[e->k];
	out->slots.num_new_blocks = e->nids;
	out->slots.num_groups = r->num_groups;
	memcpy(out->slots.new_blocks_per_group, r->new_blocks_per_group + e->k * r->num_groups,
	       r->num_groups * sizeof(uint32_t));
}

int
kvp_batch_result(const struct kvp_batch *b, size_t i, struct kvp_batch_result *out)
{
	struct entry e;
	if (out == NULL)
		return KVP_EINVAL;
	memset(out, 0, sizeof(*out));
	out->detail = "";
	if (!entry(b, i, &e)) {
		out->status = KVP_ENOTFOUND;
		return KVP_ENOTFOUND;
	}
	out->status = e.status;
	out->detail = e.detail;
	if (e.run != NULL) {
		if (e.status == KVP_OK)
			run_result(&e, out);
		return KVP_OK;
	}
	const Kvpool__V1__Reply *r = e.r;
	switch (r ? r->result_case : KVPOOL__V1__REPLY__RESULT__NOT_SET) {
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
	case KVPOOL__V1__REPLY__RESULT_RESERVE:
		out->has_block_ids = true;
		out->block_ids = r->reserve->rows;
		out->num_block_ids = r->reserve->n_rows;
		out->hashes = r->reserve->evicted_keys.data;
		out->num_hashes =
			r->reserve->evicted_keys.len / ((b->hash_len ? b->hash_len : KVP_HASH_LEN) + 4);
		break;
	case KVPOOL__V1__REPLY__RESULT_LOOKUP_AND_LOCK:
		out->has_block_ids = true;
		out->block_ids = r->lookup_and_lock->rows;
		out->num_block_ids = r->lookup_and_lock->n_rows;
		out->count = r->lookup_and_lock->num_hits;
		if (r->lookup_and_lock->n_crc32c == r->lookup_and_lock->n_rows)
			out->ref_cnts = r->lookup_and_lock->crc32c;
		break;
	case KVPOOL__V1__REPLY__RESULT_COMMIT:
		out->count = r->commit->num_committed;
		break;
	default:
		break;
	}
	return KVP_OK;
}

/* Call i's new blocks per group (rows of num_groups) and ids, if an AllocateSlots that succeeded. */
static bool
slots_of(const struct entry *e, size_t num_groups, uint32_t *row, const int32_t **ids,
         size_t *nids, uint32_t *computed)
{
	if (e->run != NULL) {
		const Kvpool__V1__SlotsRunReply *r = e->run;
		if (r->num_groups > num_groups)
			return false;
		memcpy(row, r->new_blocks_per_group + e->k * r->num_groups,
		       r->num_groups * sizeof(uint32_t));
		*ids = e->ids;
		*nids = e->nids;
		*computed = r->num_computed_tokens[e->k];
		return true;
	}
	if (e->r == NULL || e->r->result_case != KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS ||
	    e->r->allocate_slots->n_new_blocks_per_group > num_groups)
		return false;
	const Kvpool__V1__AllocateSlotsReply *s = e->r->allocate_slots;
	for (size_t g = 0; g < s->n_new_blocks_per_group; g++)
		row[g] = s->new_blocks_per_group[g];
	if (s->n_new_blocks_per_group == 0)
		row[0] = (uint32_t)s->n_new_block_ids;
	*ids = s->new_block_ids;
	*nids = s->n_new_block_ids;
	*computed = s->num_computed_tokens;
	return true;
}

int
kvp_batch_slots_results(const struct kvp_batch *b, size_t first, size_t n, size_t num_groups,
                        int32_t *status, uint32_t *num_computed_tokens, uint32_t *new_blocks,
                        int32_t *block_ids, size_t cap, size_t *num_ids)
{
	uint32_t row[KVP_MAX_GROUPS], computed;
	const int32_t *ids;
	size_t total = 0, nids;
	struct entry e;

	if (b == NULL || status == NULL || num_computed_tokens == NULL || num_ids == NULL ||
	    num_groups == 0 || num_groups > KVP_MAX_GROUPS || first > b->n || n > b->n - first ||
	    (cap > 0 && block_ids == NULL) || (n > 0 && new_blocks == NULL))
		return KVP_EINVAL;
	/* Validate first: every call that ran and succeeded is an AllocateSlots that fits. */
	for (size_t i = first; i < first + n; i++) {
		if (!entry(b, i, &e) || e.status != KVP_OK)
			continue;
		if (!slots_of(&e, num_groups, row, &ids, &nids, &computed))
			return KVP_EINVAL;
		total += nids;
	}
	if (total > cap) /* as kvp_client_allocate_slots: the buffer is too small */
		return KVP_EINVAL;
	total = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t *rows = new_blocks + i * num_groups;
		memset(rows, 0, num_groups * sizeof(*rows));
		num_computed_tokens[i] = 0;
		status[i] = entry(b, first + i, &e) ? e.status : KVP_ENOTFOUND;
		if (status[i] != KVP_OK)
			continue;
		(void)slots_of(&e, num_groups, rows, &ids, &nids, &num_computed_tokens[i]);
		if (nids > 0)
			memcpy(block_ids + total, ids, nids * sizeof(int32_t));
		total += nids;
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
