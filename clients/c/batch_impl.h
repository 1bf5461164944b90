/* SPDX-License-Identifier: Apache-2.0 */
/*
 * batch_impl.h: the batch's state, shared by its builder (batch.c) and its
 * send and results (batch_send.c). Internal: not installed.
 *
 * A batch holds calls in the caller's order (call i) and sends them as the
 * wire's BatchCalls: one per call, except kvp_batch_allocate_slots_n's n
 * calls, which go as one slots run (packed arrays, kvpool.proto) to a
 * daemon that runs them, or as n plain calls to one that does not.
 */
#ifndef KVPOOL_BATCH_IMPL_H
#define KVPOOL_BATCH_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.pb-c.h"

/* Bump allocation in chunks, reset (not freed) when the batch is cleared. */
struct kvpc_chunk;
struct kvpc_arena {
	struct kvpc_chunk *head, *cur;
};
void *kvpc_arena_alloc(struct kvpc_arena *a, size_t n); /* NULL on ENOMEM */
void kvpc_arena_reset(struct kvpc_arena *a);
void kvpc_arena_fini(struct kvpc_arena *a);

/* Where call i went: the wire call calls[wire], entry sub of it if a run. */
struct kvpc_batch_slot {
	uint32_t wire, sub;
};

/* A run's reply, checked, with each entry's ids offset and detail index. */
struct kvpc_run_view {
	const Kvpool__V1__SlotsRunReply *r; /* NULL: the run failed whole (no entries) */
	uint32_t *id_off;                   /* entries + 1 */
	uint32_t *detail;                   /* entries: index in r->details of a failed one */
};

struct kvp_batch {
	Kvpool__V1__BatchCall **calls; /* the wire's calls */
	size_t nw, cap;
	struct kvpc_batch_slot *map;   /* per call */
	size_t n, map_cap;
	bool has_runs;
	unsigned flags;
	struct kvpc_arena args;        /* the calls and every copy they point into */
	struct kvpc_arena results;     /* the last send's decoded reply */
	Kvpool__V1__Reply *reply;      /* the last send's reply, in results */
	struct nng_msg *reply_msg;     /* its bytes, which reply's bytes fields may point into */
	bool sent_plain;               /* the last send had one wire call per call */
	struct kvpc_run_view *views;   /* per wire call of the last reply (runs only) */
	size_t num_run;                /* calls of the last send that ran */
	size_t sent_bytes, reply_bytes;
	uint32_t hash_len;             /* the last send's pool's hash width (lookup results) */
};

/* Forgets the last send's results. */
void kvpc_batch_drop_results(struct kvp_batch *b);

#endif /* KVPOOL_BATCH_IMPL_H */
