/* SPDX-License-Identifier: Apache-2.0 */
#include "engine/metrics.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

struct block_state {
	uint64_t birth_ns;
	uint64_t last_access_ns;
	uint64_t history[KVP_METRICS_HISTORY]; /* ring of access times */
	uint8_t hist_len, hist_head;
	bool tracked;
};

struct kvp_metrics {
	struct kvp_metrics_config cfg;
	struct block_state *state;
	uint64_t rng;
	struct kvp_eviction_sample *pending; /* ring */
	size_t head, count;
	uint64_t dropped;
};

/* splitmix64: the built-in source when no random callback is given. */
static double
builtin_random(void *ctx)
{
	uint64_t *s = ctx;
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

int
kvp_metrics_create(const struct kvp_metrics_config *cfg, struct kvp_metrics **out)
{
	struct kvp_metrics *m;

	if (cfg == NULL || out == NULL || !(cfg->sample_rate > 0.0 && cfg->sample_rate <= 1.0) ||
	    cfg->clock == NULL || cfg->num_blocks == 0)
		return KVP_EINVAL;
	if ((m = calloc(1, sizeof(*m))) == NULL)
		return KVP_ENOMEM;
	m->cfg = *cfg;
	if (m->cfg.max_pending == 0)
		m->cfg.max_pending = 65536;
	m->rng = cfg->seed;
	if (m->cfg.random == NULL) {
		m->cfg.random = builtin_random;
		m->cfg.random_ctx = &m->rng;
	}
	m->state = calloc(cfg->num_blocks, sizeof(*m->state));
	m->pending = calloc(m->cfg.max_pending, sizeof(*m->pending));
	if (m->state == NULL || m->pending == NULL) {
		kvp_metrics_destroy(m);
		return KVP_ENOMEM;
	}
	*out = m;
	return KVP_OK;
}

void
kvp_metrics_destroy(struct kvp_metrics *m)
{
	if (m == NULL)
		return;
	free(m->state);
	free(m->pending);
	free(m);
}

void
kvp_metrics_on_allocated(struct kvp_metrics *m, int32_t id)
{
	assert(id >= 0 && (uint32_t)id < m->cfg.num_blocks);
	if (m->cfg.random(m->cfg.random_ctx) < m->cfg.sample_rate) {
		struct block_state *s = &m->state[id];
		uint64_t now = m->cfg.clock(m->cfg.clock_ctx);
		memset(s, 0, sizeof(*s));
		s->tracked = true;
		s->birth_ns = now;
		s->last_access_ns = now;
	}
}

void
kvp_metrics_on_accessed(struct kvp_metrics *m, int32_t id)
{
	struct block_state *s;

	assert(id >= 0 && (uint32_t)id < m->cfg.num_blocks);
	s = &m->state[id];
	if (!s->tracked)
		return;
	uint64_t now = m->cfg.clock(m->cfg.clock_ctx);
	s->last_access_ns = now;
	if (s->hist_len < KVP_METRICS_HISTORY) {
		s->history[(s->hist_head + s->hist_len++) % KVP_METRICS_HISTORY] = now;
	} else {
		s->history[s->hist_head] = now;
		s->hist_head = (uint8_t)((s->hist_head + 1) % KVP_METRICS_HISTORY);
	}
}

static double
seconds(uint64_t later, uint64_t earlier)
{
	/* A clock that steps back gives a negative interval, as vLLM would. */
	return (double)(int64_t)(later - earlier) / 1e9;
}

void
kvp_metrics_on_evicted(struct kvp_metrics *m, int32_t id)
{
	struct block_state *s;
	struct kvp_eviction_sample ev;

	assert(id >= 0 && (uint32_t)id < m->cfg.num_blocks);
	s = &m->state[id];
	if (!s->tracked)
		return;
	uint64_t now = m->cfg.clock(m->cfg.clock_ctx);
	memset(&ev, 0, sizeof(ev));
	ev.lifetime_seconds = seconds(now, s->birth_ns);
	ev.idle_seconds = seconds(now, s->last_access_ns);
	for (uint8_t i = 1; i < s->hist_len; i++) {
		uint64_t a = s->history[(s->hist_head + i - 1) % KVP_METRICS_HISTORY];
		uint64_t b = s->history[(s->hist_head + i) % KVP_METRICS_HISTORY];
		ev.reuse_gaps_seconds[ev.num_reuse_gaps++] = seconds(b, a);
	}
	s->tracked = false;
	if (m->count == m->cfg.max_pending) {
		m->dropped++;
		return;
	}
	m->pending[(m->head + m->count++) % m->cfg.max_pending] = ev;
}

void
kvp_metrics_reset(struct kvp_metrics *m)
{
	memset(m->state, 0, (size_t)m->cfg.num_blocks * sizeof(*m->state));
	m->head = 0;
	m->count = 0;
}

uint32_t
kvp_metrics_num_blocks(const struct kvp_metrics *m)
{
	return m->cfg.num_blocks;
}

bool
kvp_metrics_is_tracked(const struct kvp_metrics *m, int32_t id)
{
	return id >= 0 && (uint32_t)id < m->cfg.num_blocks && m->state[id].tracked;
}

size_t
kvp_metrics_drain(struct kvp_metrics *m, struct kvp_eviction_sample *out, size_t cap)
{
	size_t n = 0;

	while (n < cap && m->count > 0) {
		out[n++] = m->pending[m->head];
		m->head = (m->head + 1) % m->cfg.max_pending;
		m->count--;
	}
	return n;
}

size_t
kvp_metrics_pending(const struct kvp_metrics *m)
{
	return m->count;
}

uint64_t
kvp_metrics_dropped(const struct kvp_metrics *m)
{
	return m->dropped;
}
