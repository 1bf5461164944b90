/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's state as every path reads it (dispatch.h): its events
 * published, its gauges, its invariants. Beneath the dispatcher and the
 * handlers, which both call these; calls nothing above it.
 */
#define _POSIX_C_SOURCE 200809L

#include "service/rpc/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kvp_status.h"
#include "engine/manager.h"
#include "engine/pool.h"

void
kvpd_pool_publish(struct kvpd_pool *p)
{
	struct timespec ts;

	/* The manager's take also names each BlockStored's spec kind. */
	if (kvp_mgr_take_events(p->mgr, &p->events) != KVP_OK ||
	    kvp_event_batch_count(&p->events) == 0)
		return;
	p->counters.events_emitted += kvp_event_batch_count(&p->events);
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t ts_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	(void)kvpd_stream_emit(&p->stream, p->cfg.name, &p->events, ts_ns);
	if (p->stream.on_events)
		p->stream.on_events(p->stream.on_events_ctx, &p->events, ts_ns);
}

void
kvpd_pool_gauges(struct kvpd_pool *p, struct kvpd_pool_gauges *out)
{
	struct kvp_pool_stats ps;
	struct kvp_mgr_stats ms;

	memset(out, 0, sizeof(*out));
	kvp_pool_get_stats(p->pool, &ps);
	kvp_mgr_get_stats(p->mgr, &ms);
	out->num_blocks = kvp_pool_num_blocks(p->pool);
	out->num_free = kvp_pool_num_free(p->pool);
	out->num_cached_blocks = kvp_pool_num_cached_blocks(p->pool);
	out->num_cached_keys = kvp_pool_num_cached_keys(p->pool);
	out->usage = kvp_pool_usage(p->pool);
	out->blocks_allocated = ps.blocks_allocated;
	out->blocks_evicted = ps.blocks_evicted;
	out->alloc_failures = ps.alloc_failures + ms.alloc_failures;
	out->blocks_stored = ps.blocks_stored;
	out->resets = ps.resets;
	out->prefix_requests = ms.requests;
	out->prefix_queries = ms.queries;
	out->prefix_hits = ms.hits;
	out->active_requests = ms.active_requests;
}

int
kvpd_pool_check(struct kvpd_pool *p, char *detail, size_t len)
{
	int rv = kvp_pool_check(p->pool, detail, len);
	if (rv != KVP_OK)
		return rv;
	/*
	 * No block may be held by sessions more often than its ref count: one
	 * pass over each session's table, then one over the blocks, O(blocks +
	 * sessions' tables) where a lookup per block and session was
	 * O(blocks x sessions) (1.2 s at exit with 200 sessions on 2M blocks).
	 */
	uint32_t nb = kvp_pool_num_blocks(p->pool);
	uint64_t *held = calloc(nb, sizeof(*held));
	if (held == NULL) {
		snprintf(detail, len, "no memory to check the sessions' references");
		return KVP_ENOMEM;
	}
	for (size_t k = 0; k < p->num_sessions + p->num_ending; k++) {
		const struct kvpd_session *ss =
			k < p->num_sessions ? p->sessions[k] : p->ending[k - p->num_sessions];
		for (uint32_t i = 0; i < ss->cap; i++)
			if (ss->refs[i].id >= 0 && (uint32_t)ss->refs[i].id < nb)
				held[ss->refs[i].id] += ss->refs[i].count;
	}
	for (uint32_t id = 1; id < nb; id++) {
		if (held[id] > (uint64_t)kvp_pool_ref_cnt(p->pool, (int32_t)id)) {
			snprintf(detail, len, "block %u: sessions hold %llu references, ref_cnt %d", id,
			         (unsigned long long)held[id], kvp_pool_ref_cnt(p->pool, (int32_t)id));
			free(held);
			return KVP_EINTERNAL;
		}
	}
	free(held);
	return KVP_OK;
}
