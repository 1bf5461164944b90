/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.h: vLLM's KVCacheMetricsCollector (reference section 8): sampled
 * block lifetimes, idle time before eviction and reuse gaps.
 *
 * Time and randomness come in through callbacks so tests fix them; the
 * engine reads no clock itself. A block is sampled at allocation with
 * probability sample_rate (decided again on every allocation); touches of
 * a sampled block record its access times (the last 4); when the pool
 * evicts or reuses it, a sample is queued. The pool calls the on_* hooks.
 *
 * Deviation: vLLM's sample list grows until drained; here at most
 * max_pending samples are kept and later ones are counted as dropped.
 *
 * Not thread-safe. Never prints.
 */
#ifndef KVP_METRICS_H
#define KVP_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef uint64_t (*kvp_clock_fn)(void *ctx);  /* monotonic nanoseconds */
typedef double (*kvp_random_fn)(void *ctx);   /* uniform in [0, 1) */

struct kvp_metrics_config {
	double sample_rate;      /* 0 < rate <= 1 (vLLM default 0.01) */
	uint32_t num_blocks;     /* block ids are < num_blocks */
	kvp_clock_fn clock;      /* required */
	void *clock_ctx;
	kvp_random_fn random;    /* NULL: a built-in generator seeded with seed */
	void *random_ctx;
	uint64_t seed;
	size_t max_pending;      /* 0: 65536 */
};

#define KVP_METRICS_HISTORY 4

/* vLLM's KVCacheEvictionEvent. */
struct kvp_eviction_sample {
	double lifetime_seconds;
	double idle_seconds;
	double reuse_gaps_seconds[KVP_METRICS_HISTORY - 1];
	uint32_t num_reuse_gaps;
};

struct kvp_metrics;

/* KVP_EINVAL (rate outside (0,1], no clock, no blocks) or KVP_ENOMEM. */
int kvp_metrics_create(const struct kvp_metrics_config *cfg, struct kvp_metrics **out);
/* NULL is a no-op. */
void kvp_metrics_destroy(struct kvp_metrics *m);

/* Hooks; ids must be < num_blocks (asserted: the pool validates them). */
void kvp_metrics_on_allocated(struct kvp_metrics *m, int32_t id);
void kvp_metrics_on_accessed(struct kvp_metrics *m, int32_t id);
void kvp_metrics_on_evicted(struct kvp_metrics *m, int32_t id);
/* Forgets every tracked block and pending sample (a successful reset). */
void kvp_metrics_reset(struct kvp_metrics *m);

/* The block count the collector was sized for. */
uint32_t kvp_metrics_num_blocks(const struct kvp_metrics *m);
/* Returns true if block id is being tracked. */
bool kvp_metrics_is_tracked(const struct kvp_metrics *m, int32_t id);
/* Moves up to cap pending samples (oldest first) into out; returns how many. */
size_t kvp_metrics_drain(struct kvp_metrics *m, struct kvp_eviction_sample *out, size_t cap);
/* Pending samples, and samples dropped because max_pending was reached. */
size_t kvp_metrics_pending(const struct kvp_metrics *m);
uint64_t kvp_metrics_dropped(const struct kvp_metrics *m);

#endif /* KVP_METRICS_H */
