/* SPDX-License-Identifier: Apache-2.0 */
/*
 * calls_run.h: a Batch's slots run (calls_run.c), n AllocateSlots calls
 * for existing requests in one message of packed arrays. Internal to the
 * daemon; runs under the pool's lock like every handler.
 */
#ifndef KVPD_CALLS_RUN_H
#define KVPD_CALLS_RUN_H

#include <stdbool.h>
#include <stddef.h>

#include "kvpool.pb-c.h"

struct call;

/* How a run went, for its batch: the calls that failed and the first of them. */
struct kvpd_run_tally {
	size_t failed;     /* calls that failed (1 for a malformed run, which runs none) */
	size_t first;      /* the first failed call's index in the run */
	int first_rv;      /* its status */
	bool whole;        /* the run was malformed and none of its calls ran */
};

/* How many calls of its batch a run counts as (a malformed, empty one: 1). */
size_t kvpd_run_calls(const Kvpool__V1__SlotsRunRequest *m);

/*
 * Runs the run's calls in order into out (a SlotsRunReply), stopping at the
 * first failure unless keep_going (and always when memory runs out). A
 * malformed run (array lengths that disagree) runs nothing and fails with
 * KVP_EINVAL (t->whole: its batch stops there, keep_going or not). Returns the first failed call's status, KVP_OK if none failed;
 * the detail is that call's.
 */
int kvpd_h_slots_run(struct call *c, const Kvpool__V1__SlotsRunRequest *m, bool keep_going,
                     Kvpool__V1__Reply *out, struct kvpd_run_tally *t);

#endif /* KVPD_CALLS_RUN_H */
