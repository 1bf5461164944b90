/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Batch's slots run (BatchCall.slots_run): n AllocateSlots calls for
 * existing requests sent as packed arrays. Each call goes through
 * kvpd_h_allocate_slots() exactly as it would alone; only the encoding
 * differs (one message of fixed-width arrays each way, not n of each).
 */
#include <stdio.h>
#include <string.h>

#include "common/kvp_status.h"
#include "engine/manager.h"
#include "service/rpc/call.h"
#include "service/rpc/calls_run.h"

size_t
kvpd_run_calls(const Kvpool__V1__SlotsRunRequest *m)
{
	return m->n_request_ids > 0 ? m->n_request_ids : 1;
}

/* The whole run's shape, before any call runs. */
static int
check_run(struct call *c, const Kvpool__V1__SlotsRunRequest *m)
{
	size_t n = m->n_request_ids, tokens = 0;

	if (n == 0)
		return kvpd_fail(c, KVP_EINVAL, "slots run: no calls");
	if (m->n_num_new_tokens != n || (m->n_num_token_ids != 0 && m->n_num_token_ids != n))
		return kvpd_fail(c, KVP_EINVAL, "slots run: %zu request ids, %zu num_new_tokens and "
		                 "%zu num_token_ids (each must have one per call)", n,
		                 m->n_num_new_tokens, m->n_num_token_ids);
	bool over = false;
	for (size_t i = 0; i < m->n_num_token_ids && !over; i++) {
		over = m->num_token_ids[i] > m->n_token_ids - tokens;
		tokens += over ? 0 : m->num_token_ids[i];
	}
	if (over || tokens != m->n_token_ids)
		return kvpd_fail(c, KVP_EINVAL, "slots run: num_token_ids do not add up to the %zu "
		                 "token ids sent", m->n_token_ids);
	return KVP_OK;
}

int
kvpd_h_slots_run(struct call *c, const Kvpool__V1__SlotsRunRequest *m, bool keep_going,
                 Kvpool__V1__Reply *out, struct kvpd_run_tally *t)
{
	Kvpool__V1__SlotsRunReply *r =
		NEW(c, Kvpool__V1__SlotsRunReply, kvpool__v1__slots_run_reply__descriptor);
	uint32_t ng = kvp_mgr_num_groups(c->p->mgr);
	size_t n = m->n_request_ids, total = 0, tok = 0;
	int rv;

	memset(t, 0, sizeof(*t));
	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	out->result_case = KVPOOL__V1__REPLY__RESULT_SLOTS_RUN;
	out->slots_run = r;
	r->num_groups = ng;
	if ((rv = check_run(c, m)) != KVP_OK) {
		t->failed = 1; /* the run's first call, as a batch counts it */
		t->first_rv = rv;
		t->whole = true;
		return rv;
	}
	r->statuses = kvpd_scratch(c, n * sizeof(*r->statuses));
	r->num_scheduled_tokens = kvpd_scratch(c, n * sizeof(uint32_t));
	r->num_computed_tokens = kvpd_scratch(c, n * sizeof(uint32_t));
	r->new_blocks_per_group = kvpd_scratch(c, n * ng * sizeof(uint32_t));
	r->details = kvpd_scratch(c, n * sizeof(char *));
	const int32_t **ids = kvpd_scratch(c, n * sizeof(*ids));
	size_t *nids = kvpd_scratch(c, n * sizeof(*nids));
	if (r->statuses == NULL || r->num_scheduled_tokens == NULL || r->num_computed_tokens == NULL ||
	    r->new_blocks_per_group == NULL || r->details == NULL || ids == NULL || nids == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		Kvpool__V1__AllocateSlotsRequest a = KVPOOL__V1__ALLOCATE_SLOTS_REQUEST__INIT;
		Kvpool__V1__Reply one = KVPOOL__V1__REPLY__INIT;
		a.request_id = m->request_ids[i];
		a.num_new_tokens = m->num_new_tokens[i];
		a.num_lookahead_tokens = m->num_lookahead_tokens;
		a.delay_cache_blocks = m->delay_cache_blocks;
		if (m->n_num_token_ids > 0 && m->num_token_ids[i] > 0) {
			a.new_token_ids = m->token_ids + tok;
			a.n_new_token_ids = m->num_token_ids[i];
			tok += m->num_token_ids[i];
		}
		rv = kvpd_h_allocate_slots(c, &a, &one);
		r->statuses[i] = (Kvpool__V1__Status)rv;
		r->n_statuses = r->n_num_scheduled_tokens = r->n_num_computed_tokens = i + 1;
		r->n_new_blocks_per_group = (i + 1) * ng;
		if (rv == KVP_OK) {
			const Kvpool__V1__AllocateSlotsReply *s = one.allocate_slots;
			r->num_scheduled_tokens[i] = s->num_scheduled_tokens;
			r->num_computed_tokens[i] = s->num_computed_tokens;
			memcpy(r->new_blocks_per_group + i * ng, s->new_blocks_per_group,
			       ng * sizeof(uint32_t));
			ids[i] = s->new_block_ids;
			nids[i] = s->n_new_block_ids;
			total += nids[i];
			continue;
		}
		if ((r->details[r->n_details] = kvpd_scratch_str(c, c->detail)) == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		r->n_details++;
		if (t->failed++ == 0) {
			t->first = i;
			t->first_rv = rv;
		}
		if (!keep_going || rv == KVP_ENOMEM)
			break;
	}
	if ((r->new_block_ids = kvpd_scratch(c, total * sizeof(int32_t) + 1)) == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (size_t i = 0; i < r->n_statuses; i++) {
		if (r->statuses[i] != KVPOOL__V1__STATUS__STATUS_OK || nids[i] == 0)
			continue;
		memcpy(r->new_block_ids + r->n_new_block_ids, ids[i], nids[i] * sizeof(int32_t));
		r->n_new_block_ids += nids[i];
	}
	if (t->failed == 0)
		return KVP_OK;
	/* The run's own status and detail are its first failed call's. */
	snprintf(c->detail, sizeof(c->detail), "%s", r->details[0]);
	return t->first_rv;
}
