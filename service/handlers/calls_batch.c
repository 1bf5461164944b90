/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batch: several calls in one request, run in order as rows of the call
 * table, which it reaches through the call (c->lookup) rather than by
 * name, since the table names this handler (no circle between the files);
 * a Batch's slots run (calls_run.c) counts as its calls.
 */
#include "service/rpc/call.h"

#include <stdio.h>

#include "common/kvp_status.h"
#include "service/rpc/calls.h"
#include "service/rpc/calls_run.h"

#define NO_CALL "no call in the request, or one this daemon does not know"

/* A batch's calls, a slots run counting as its calls. */
static size_t
batch_calls(const Kvpool__V1__BatchRequest *m)
{
	size_t n = 0;
	for (size_t i = 0; i < m->n_calls; i++)
		n += m->calls[i]->call_case == KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN
		             ? kvpd_run_calls(m->calls[i]->slots_run)
		             : 1;
	return n;
}

/* One batch call (not a run) into sub: its status. */
static int
run_one(struct call *c, const Kvpool__V1__BatchCall *bc, Kvpool__V1__Reply *sub)
{
	/* BatchCall's oneof numbers are the Request's (asserted in calls.c). */
	const struct kvpd_call_op *op = c->lookup((int)bc->call_case);
	/* The daemon's own checksums are taken outside the lock: for a Commit sent alone. */
	bool crc_here = bc->call_case == KVPOOL__V1__BATCH_CALL__CALL_COMMIT && bc->commit != NULL &&
	                bc->commit->n_crc32c == 0 && !bc->commit->no_checksum;
	int rv = op == NULL ? kvpd_fail(c, KVP_EINVAL, NO_CALL)
	         : !op->batchable ? kvpd_fail(c, KVP_EINVAL, "%s cannot be batched", op->name)
	         : crc_here ? kvpd_fail(c, KVP_EINVAL, "a Commit in a batch carries its checksums "
	                                "or no_checksum (the daemon's are for a Commit sent alone)")
	                    : op->run(c, bc->allocate, sub);
	if (rv != KVP_OK) /* a failed call's reply carries its own detail and no result */
		sub->result_case = KVPOOL__V1__REPLY__RESULT__NOT_SET;
	return rv;
}

int
kvpd_h_batch(struct call *c, const Kvpool__V1__BatchRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__BatchReply *r = NEW(c, Kvpool__V1__BatchReply, kvpool__v1__batch_reply__descriptor);
	Kvpool__V1__Reply **replies = kvpd_scratch(c, m->n_calls * sizeof(*replies));
	size_t total = batch_calls(m);

	if (r == NULL || replies == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (total > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu calls in one batch", total);
	out->result_case = KVPOOL__V1__REPLY__RESULT_BATCH;
	out->batch = r;
	r->replies = replies;
	int first_rv = KVP_OK;
	size_t first = 0, failed = 0, base = 0; /* base: the call index of calls[i] */
	for (size_t i = 0; i < m->n_calls; i++) {
		const Kvpool__V1__BatchCall *bc = m->calls[i];
		Kvpool__V1__Reply *sub = NEW(c, Kvpool__V1__Reply, kvpool__v1__reply__descriptor);
		struct kvpd_run_tally t = {0};
		if (sub == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		replies[r->n_replies++] = sub;
		int rv;
		if (bc->call_case == KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN) {
			rv = kvpd_h_slots_run(c, bc->slots_run, m->continue_on_error, sub, &t);
		} else {
			rv = run_one(c, bc, sub);
			t.failed = rv != KVP_OK;
			t.first_rv = rv;
		}
		sub->status = (Kvpool__V1__Status)rv;
		if (rv != KVP_OK) {
			/* A run's calls carry their own details (the run's is only for a malformed one). */
			bool said = bc->call_case == KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN && !t.whole;
			char *d = said ? NULL : kvpd_scratch_str(c, c->detail);
			if (d != NULL)
				sub->detail = d;
			if (failed == 0) {
				first_rv = rv;
				first = base + t.first;
			}
			failed += t.failed;
			/* Stop at the first failure (always when memory ran out or a run was malformed). */
			if (!m->continue_on_error || rv == KVP_ENOMEM || t.whole)
				break;
		}
		base += bc->call_case == KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN
		                ? kvpd_run_calls(bc->slots_run)
		                : 1;
	}
	if (failed == 0)
		return KVP_OK;
	if (m->continue_on_error)
		snprintf(c->detail, sizeof(c->detail), "%zu of %zu calls failed, the first at call %zu",
		         failed, total, first);
	else
		snprintf(c->detail, sizeof(c->detail), "batch stopped at call %zu", first);
	return first_rv;
}
