/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The request manager on hybrid pools against a reference model of vLLM's
 * KVCacheManager over its hybrid coordinator, written from the reference
 * spec (section 5) with plain arrays and no shortcuts. A seeded random run
 * (requests with shared prefixes arrive, prefill in chunks, decode with
 * lookahead, delay caching, run out of room, are preempted and finish)
 * drives the engine's manager over one pool and the model over a second,
 * identical pool. The model calls only the pool's primitives (their own
 * differential test is test_pool_differential), so the two pools stay equal
 * exactly when the two managers make the same calls in the same order.
 *
 * After every operation both must agree on the status, the hit (length and
 * block ids per group), the new blocks per group, every live request's
 * block tables and token counts, and the two pools' ref counts, keys,
 * free-queue order and events (the engine's carry the group's kind and
 * window as vLLM's manager annotates them).
 *
 * Under vLLM 0.33's rules the model also caches the prompt's partial tail in
 * a coarse full-attention group, and steps run with tokens in flight (async
 * scheduling: skipped blocks are freed below what is not in flight).
 *
 * Configurations: gpt-oss-like (full + sliding window, one block size);
 * coarse full-attention blocks under an LCM that masks the window group's
 * caching (full:8 + sliding_window:4:5, hash block size 4); the first with
 * prefix caching off; Llama-4-like chunked local attention beside full; and
 * the coarse one again with xxhash_cbor (16-byte hashes, 32-byte coarse keys).
 * KVP_DIFF_OPS (default 1,000,000, split between them) and KVP_DIFF_SEED
 * (default 1; printed).
 */
#include "pool_util.h"

#include <stdlib.h>

#include "common/map_key.h"
#include "engine/manager.h"

enum { NB = 48, NG = 2, HBS = 4, MAXTOK = 64, MAXR = 6, NTMPL = 3, ALPHA = 5, MAXBLK = MAXTOK };

struct config {
	const char *name;
	struct kvp_group_spec g[NG];
	bool caching;
	uint32_t lcm;
	uint64_t share; /* parts of the ops, of SHARES */
	enum kvp_hash_algo algo;
};
enum { SHARES = 7 };

static const struct config configs[] = {
	{"full:4+sliding_window:4:7",
	 {{.kind = KVP_GROUP_FULL, .block_size = 4},
	  {.kind = KVP_GROUP_SLIDING_WINDOW, .block_size = 4, .window = 7}},
	 true, 4, 2, KVP_HASH_SHA256_CBOR},
	{"full:8+sliding_window:4:5",
	 {{.kind = KVP_GROUP_FULL, .block_size = 8},
	  {.kind = KVP_GROUP_SLIDING_WINDOW, .block_size = 4, .window = 5}},
	 true, 8, 2, KVP_HASH_SHA256_CBOR},
	{"full:4+sliding_window:4:7,caching=off",
	 {{.kind = KVP_GROUP_FULL, .block_size = 4},
	  {.kind = KVP_GROUP_SLIDING_WINDOW, .block_size = 4, .window = 7}},
	 false, 4, 1, KVP_HASH_SHA256_CBOR},
	{"full:4+chunked_local:4:8",
	 {{.kind = KVP_GROUP_FULL, .block_size = 4},
	  {.kind = KVP_GROUP_CHUNKED_LOCAL, .block_size = 4, .window = 8}},
	 true, 4, 1, KVP_HASH_SHA256_CBOR},
	{"full:8+sliding_window:4:5,hash_algo=xxhash_cbor",
	 {{.kind = KVP_GROUP_FULL, .block_size = 8},
	  {.kind = KVP_GROUP_SLIDING_WINDOW, .block_size = 4, .window = 5}},
	 true, 8, 1, KVP_HASH_XXHASH_CBOR},
};

/* A request in the model: vLLM's Request plus each manager's per-request state. */
struct mreq {
	bool live;
	uint64_t id;
	int64_t tok[MAXTOK];
	size_t ntok, computed, nprompt;
	uint8_t fine[MAXTOK / HBS * KVP_HASH_LEN]; /* request.block_hashes, HL bytes each */
	size_t nfine;
	int32_t tbl[NG][MAXBLK]; /* req_to_blocks */
	size_t n[NG];
	bool started[NG];        /* req in num_cached_block */
	uint32_t ncached[NG];
};

static const struct config *C;
static struct kvp_pool *PB; /* the model's pool */
static struct kvp_hasher *HB;
static size_t HL; /* the configuration's hash length */
static enum kvp_vllm_semantics SEM; /* the rules under test */
static struct mreq R[MAXR];
static int64_t tmpl[NTMPL][MAXTOK];
static uint64_t rng, step, nhits;

static uint32_t
rnd(uint32_t n)
{
	kvp_test_rand(&rng);
	return n ? (uint32_t)(rng % n) : 0;
}

static size_t
cdiv(size_t a, size_t b)
{
	return (a + b - 1) / b;
}

/* ---- the model ---- */

static void
m_hash_new_blocks(struct mreq *r)
{
	if (!C->caching)
		return;
	for (; r->nfine < r->ntok / HBS; r->nfine++)
		assert_ok(kvp_hash_block(HB, r->nfine ? r->fine + (r->nfine - 1) * HL : NULL,
		                         r->tok + r->nfine * HBS, HBS, NULL, 0, r->fine + r->nfine * HL));
}

/*
 * Block i's hash in group g (BlockHashListWithBlockSize): vLLM 0.33's is the
 * last of its k fine hashes, 9aaf83ef5's the k joined. *len its length.
 */
static const uint8_t *
m_hash(const struct mreq *r, uint32_t g, size_t i, size_t *len)
{
	size_t k = C->g[g].block_size / HBS;
	if (SEM == KVP_VLLM_0_33) {
		*len = HL;
		return r->fine + ((i + 1) * k - 1) * HL;
	}
	*len = k * HL;
	return r->fine + i * k * HL;
}

static int32_t
m_cached(const struct mreq *r, uint32_t g, size_t i)
{
	int32_t id = 0;
	size_t len;
	const uint8_t *h = m_hash(r, g, i, &len);
	return kvp_pool_get_cached_block(PB, h, len, &g, 1, &id) ==
	               KVP_OK
	           ? id
	           : -1;
}

/* One group's find_longest_cache_hit, as vLLM's per-kind managers. */
static size_t
m_search(const struct mreq *r, uint32_t g, size_t max_len, int32_t *out)
{
	const struct kvp_group_spec *s = &C->g[g];
	size_t bs = s->block_size, nmax = max_len / bs, len = 0;

	if (s->kind == KVP_GROUP_FULL) {
		int32_t id;
		while (len < nmax && (id = m_cached(r, g, len)) >= 0)
			out[len++] = id;
		while (bs != C->lcm && len > 0 && len * bs % C->lcm != 0)
			len--;
		return len;
	}
	if (s->kind == KVP_GROUP_CHUNKED_LOCAL) {
		/* Blocks before the current chunk are null; hits run on from there. */
		size_t first = max_len / s->window * s->window / bs;
		int32_t id;
		for (; len < first; len++)
			out[len] = KVP_NULL_BLOCK;
		while (len < nmax && (id = m_cached(r, g, len)) >= 0)
			out[len++] = id;
		return len;
	}
	size_t need = cdiv(s->window - 1, bs), run = 0;
	for (size_t i = 0; i < nmax; i++)
		out[i] = KVP_NULL_BLOCK;
	for (size_t i = nmax; i-- > 0;) {
		int32_t id = m_cached(r, g, i);
		if (id < 0) {
			run = 0;
			continue;
		}
		if (run == 0 && bs != C->lcm && (i + 1) * bs % C->lcm != 0)
			continue;
		out[i] = id;
		if (++run >= need)
			return i + run;
	}
	len = run;
	while (bs != C->lcm && len > 0 && len * bs % C->lcm != 0)
		len--;
	return len;
}

/* The hybrid coordinator's fixed point; hits[g] gets hit / bs_g ids. */
static size_t
m_get_computed_blocks(const struct mreq *r, int32_t hits[NG][MAXBLK])
{
	size_t hit = r->ntok - 1;
	bool reduced;

	if (!C->caching)
		return 0;
	do {
		reduced = false;
		for (uint32_t g = 0; g < NG; g++) {
			size_t got = m_search(r, g, hit, hits[g]) * C->g[g].block_size;
			if (got < hit) {
				hit = got;
				reduced = true;
			}
		}
	} while (reduced);
	return hit;
}

static size_t
m_skipped_tokens(uint32_t g, size_t computed)
{
	uint32_t w = C->g[g].window;
	if (C->g[g].kind == KVP_GROUP_CHUNKED_LOCAL)
		return computed / w * w;
	return C->g[g].kind == KVP_GROUP_SLIDING_WINDOW && computed + 1 > w ? computed + 1 - w : 0;
}

static void
m_remove_skipped(struct mreq *r, uint32_t g, size_t total)
{
	size_t nb = m_skipped_tokens(g, total) / C->g[g].block_size, nrm = 0;
	int32_t rm[MAXBLK];

	if (nb > r->n[g])
		nb = r->n[g];
	for (size_t i = nb; i-- > 0 && r->tbl[g][i] != KVP_NULL_BLOCK;) {
		rm[nrm++] = r->tbl[g][i];
		r->tbl[g][i] = KVP_NULL_BLOCK;
	}
	assert_ok(kvp_pool_free_blocks(PB, rm, nrm));
}

static size_t
m_to_allocate(const struct mreq *r, uint32_t g, const int32_t *hits, size_t nh, size_t total,
              size_t need)
{
	size_t req = cdiv(need, C->g[g].block_size), ev = 0;

	if (r->started[g])
		return req > r->n[g] ? req - r->n[g] : 0;
	size_t skipped = m_skipped_tokens(g, total) / C->g[g].block_size;
	size_t local = nh + r->n[g], floor = skipped > local ? skipped : local;
	for (size_t i = skipped; i < nh; i++)
		ev += hits[i] != KVP_NULL_BLOCK && kvp_pool_ref_cnt(PB, hits[i]) == 0;
	return (req > floor ? req - floor : 0) + ev;
}

/*
 * vLLM 0.33's FullAttentionManager._cache_partial_tail_block: the prompt's
 * last hash boundary below its final token, inside a block of a group
 * coarser than the hash blocks, once cached, is a partial entry.
 */
static void
m_partial_tail(struct mreq *r, uint32_t g, size_t tokens)
{
	const struct kvp_group_spec *s = &C->g[g];
	size_t nh = (r->nprompt - 1) / HBS, boundary;

	if (SEM != KVP_VLLM_0_33 || s->kind != KVP_GROUP_FULL || s->block_size == HBS)
		return;
	boundary = (nh < r->nfine ? nh : r->nfine) * HBS;
	if (boundary == 0 || boundary > tokens || boundary % s->block_size == 0 ||
	    boundary / s->block_size >= r->n[g])
		return;
	struct kvp_cache_args a = {
		.block_hashes = r->fine, .num_block_hashes = r->nfine,
		.token_ids = r->tok, .num_tokens = r->ntok,
		.block_size = s->block_size, .group_id = g,
	};
	assert_ok(kvp_pool_cache_partial_block(PB, r->tbl[g][boundary / s->block_size],
	                                       (uint32_t)boundary, false, &a, NULL));
}

static void
m_cache(struct mreq *r, size_t tokens)
{
	tokens -= tokens % C->lcm;
	for (uint32_t g = 0; g < NG; g++) {
		const struct kvp_group_spec *s = &C->g[g];
		size_t full = tokens / s->block_size, per = C->lcm / s->block_size;
		size_t tail = s->kind == KVP_GROUP_SLIDING_WINDOW ? cdiv(s->window - 1, s->block_size)
		                                                  : per;
		bool mask[MAXBLK];
		if (r->ncached[g] >= full) {
			m_partial_tail(r, g, tokens);
			continue;
		}
		for (size_t i = r->ncached[g]; i < full; i++)
			mask[i - r->ncached[g]] = tail >= per || i % per >= per - tail;
		struct kvp_cache_args a = {
			.block_hashes = r->fine, .num_block_hashes = r->nfine,
			.token_ids = r->tok, .num_tokens = r->ntok,
			.num_cached_blocks = r->ncached[g], .num_full_blocks = (uint32_t)full,
			.block_size = s->block_size, .group_id = g, .block_mask = mask,
		};
		assert_ok(kvp_pool_cache_full_blocks(PB, r->tbl[g], r->n[g], &a));
		r->ncached[g] = (uint32_t)full;
		r->started[g] = true;
		m_partial_tail(r, g, tokens);
	}
}

/* allocate_slots; new blocks per group to out/counts. */
static int
m_allocate_slots(struct mreq *r, size_t nnew, size_t hit, int32_t hits[NG][MAXBLK],
                 size_t lookahead, bool delay, size_t in_flight, int32_t out[NG][MAXBLK],
                 size_t *counts)
{
	size_t total = r->computed + hit, main, need, n = 0;

	if (total > MAXTOK)
		total = MAXTOK;
	main = total + nnew;
	need = main + lookahead < MAXTOK ? main + lookahead : MAXTOK;
	for (uint32_t g = 0; g < NG; g++) /* vLLM 0.33: on what is not in flight */
		m_remove_skipped(r, g, total - (in_flight < total ? in_flight : total));
	for (uint32_t g = 0; g < NG; g++)
		n += m_to_allocate(r, g, hits[g], hit / C->g[g].block_size, total, need);
	if (n > kvp_pool_num_free(PB))
		return KVP_ENOSPACE;
	for (uint32_t g = 0; hit > 0 && g < NG; g++) {
		size_t nh = hit / C->g[g].block_size;
		size_t skip = m_skipped_tokens(g, total) / C->g[g].block_size;
		if (r->started[g])
			continue;
		assert_ok(kvp_pool_touch(PB, hits[g] + skip, nh - skip));
		for (size_t i = 0; i < nh; i++)
			r->tbl[g][i] = i < skip ? KVP_NULL_BLOCK : hits[g][i];
		r->n[g] = nh;
		r->ncached[g] = (uint32_t)nh;
		r->started[g] = true;
	}
	for (uint32_t g = 0; g < NG; g++) {
		size_t req = cdiv(need, C->g[g].block_size);
		counts[g] = 0;
		if (req <= r->n[g])
			continue;
		assert_ok(kvp_pool_get_new_blocks(PB, (uint32_t)(req - r->n[g]), r->tbl[g] + r->n[g]));
		memcpy(out[g], r->tbl[g] + r->n[g], (req - r->n[g]) * sizeof(int32_t));
		counts[g] = req - r->n[g];
		r->n[g] = req;
	}
	if (C->caching && !delay)
		m_cache(r, total + nnew < r->ntok ? total + nnew : r->ntok);
	r->computed = main;
	return KVP_OK;
}

static void
m_free_blocks(struct mreq *r)
{
	for (uint32_t g = 0; g < NG; g++) {
		int32_t rev[MAXBLK];
		for (size_t i = 0; i < r->n[g]; i++)
			rev[i] = r->tbl[g][r->n[g] - 1 - i];
		assert_ok(kvp_pool_free_blocks(PB, rev, r->n[g]));
		r->n[g] = 0;
		r->ncached[g] = 0;
		r->started[g] = false;
	}
	r->computed = 0;
}

/* ---- comparison ---- */

#define fail_at(...)                                                                  \
	do {                                                                          \
		print_error("%s (vLLM %s), op %llu: ", C->name,                      \
		            kvp_vllm_semantics_name(SEM), (unsigned long long)step);  \
		fail_msg(__VA_ARGS__);                                                \
	} while (0)

static void
same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb, const char *what)
{
	if (na != nb)
		fail_at("%s: %zu ids, model %zu", what, na, nb);
	for (size_t i = 0; i < na; i++)
		if (a[i] != b[i])
			fail_at("%s[%zu] = %d, model %d", what, i, a[i], b[i]);
}

static void
same_events(struct kvp_mgr *m, struct kvp_event_batch *ea, struct kvp_event_batch *eb)
{
	assert_ok(kvp_mgr_take_events(m, ea));
	assert_ok(kvp_pool_take_events(PB, eb));
	if (kvp_event_batch_count(ea) != kvp_event_batch_count(eb))
		fail_at("%zu events, model %zu", kvp_event_batch_count(ea), kvp_event_batch_count(eb));
	for (size_t i = 0; i < kvp_event_batch_count(ea); i++) {
		struct kvp_event a, b;
		assert_ok(kvp_event_batch_get(ea, i, &a));
		assert_ok(kvp_event_batch_get(eb, i, &b));
		if (a.type != b.type || a.num_hashes != b.num_hashes || a.hash_len != b.hash_len ||
		    a.group_idx != b.group_idx || a.num_tokens != b.num_tokens ||
		    a.block_size != b.block_size || (a.parent == NULL) != (b.parent == NULL))
			fail_at("event %zu differs in shape", i);
		if (memcmp(a.hashes, b.hashes, (size_t)a.num_hashes * a.hash_len) ||
		    (a.parent && memcmp(a.parent, b.parent, a.hash_len)) ||
		    (a.num_tokens && memcmp(a.token_ids, b.token_ids, a.num_tokens * sizeof(int64_t))))
			fail_at("event %zu differs in hashes or tokens", i);
		if (a.type != KVP_EVENT_BLOCK_STORED)
			continue;
		const struct kvp_group_spec *s = &C->g[a.group_idx];
		assert_string_equal(a.spec_kind, kvp_group_kind_name(s->kind));
		assert_int_equal(a.has_sliding_window, s->kind == KVP_GROUP_SLIDING_WINDOW);
		if (a.has_sliding_window)
			assert_int_equal(a.sliding_window, s->window);
	}
}

static void
same_state(struct kvp_mgr *m, struct kvp_pool *pa)
{
	int32_t qa[NB], qb[NB];
	size_t na = kvp_pool_free_queue(pa, qa, NB), nb = kvp_pool_free_queue(PB, qb, NB);

	same_ids(qa, na, qb, nb, "free queue");
	for (int32_t id = 0; id < NB; id++) {
		size_t la = 0, lb = 0;
		const uint8_t *ka = kvp_pool_block_key(pa, id, &la), *kb = kvp_pool_block_key(PB, id, &lb);
		if (kvp_pool_ref_cnt(pa, id) != kvp_pool_ref_cnt(PB, id))
			fail_at("block %d: ref %d, model %d", id, kvp_pool_ref_cnt(pa, id),
			        kvp_pool_ref_cnt(PB, id));
		if ((ka == NULL) != (kb == NULL) || la != lb || (ka && memcmp(ka, kb, la)))
			fail_at("block %d: keys differ", id);
	}
	for (int i = 0; i < MAXR; i++) {
		const struct mreq *r = &R[i];
		size_t nt, nc, nh;
		if (!r->live)
			continue;
		assert_ok(kvp_mgr_request_info(m, r->id, &nt, &nc, &nh));
		if (nt != r->ntok || nc != r->computed || nh != r->nfine)
			fail_at("request %llu: tokens %zu/%zu computed %zu/%zu hashes %zu/%zu",
			        (unsigned long long)r->id, nt, r->ntok, nc, r->computed, nh, r->nfine);
		for (uint32_t g = 0; g < NG; g++) {
			const int32_t *ids;
			size_t n;
			assert_ok(kvp_mgr_request_blocks(m, r->id, g, &ids, &n));
			same_ids(ids, n, r->tbl[g], r->n[g], "block table");
		}
	}
}

/* ---- the run ---- */

static void
op_add(struct kvp_mgr *m, uint64_t *next_id)
{
	struct mreq *r = NULL;
	for (int i = 0; i < MAXR && r == NULL; i++)
		if (!R[i].live)
			r = &R[i];
	if (r == NULL)
		return;
	memset(r, 0, sizeof(*r));
	r->id = (*next_id)++;
	r->ntok = 1 + rnd(40);
	memcpy(r->tok, tmpl[rnd(NTMPL)], r->ntok * sizeof(int64_t));
	if (rnd(3) == 0)
		r->tok[rnd((uint32_t)r->ntok)] = (int64_t)rnd(ALPHA);
	r->nprompt = r->ntok;
	struct kvp_request_desc d = {.prompt = r->tok, .num_prompt = r->ntok};
	assert_ok(kvp_mgr_add_request(m, r->id, &d));
	r->live = true;
	m_hash_new_blocks(r);
}

/* One scheduler step for r: lookup if waiting, then allocate_slots. */
static int
op_step(struct kvp_mgr *m, struct mreq *r)
{
	int32_t ha[NG][MAXBLK], hb[NG][MAXBLK], na[NG][MAXBLK], nb[NG][MAXBLK];
	int32_t *pa[NG], *pha[NG], *pna[NG];
	size_t hit = 0, ca[NG], cb[NG], nnew;
	bool waiting = r->computed == 0;

	for (uint32_t g = 0; g < NG; g++) {
		pha[g] = ha[g];
		pna[g] = na[g];
	}
	if (waiting) {
		uint32_t got = 0;
		assert_ok(kvp_mgr_get_computed_blocks(m, r->id, pha, MAXBLK, &got));
		hit = m_get_computed_blocks(r, hb);
		if (got != hit)
			fail_at("hit %u tokens, model %zu", got, hit);
		for (uint32_t g = 0; g < NG; g++)
			same_ids(ha[g], hit / C->g[g].block_size, hb[g], hit / C->g[g].block_size, "hit");
		nnew = rnd(2) ? r->ntok - hit : 1 + rnd((uint32_t)(r->ntok - hit));
	} else if (r->computed < r->ntok) {
		nnew = rnd(2) ? r->ntok - r->computed : 1 + rnd((uint32_t)(r->ntok - r->computed));
	} else if (r->ntok < MAXTOK) {
		int64_t t = (int64_t)rnd(ALPHA);
		assert_ok(kvp_mgr_append_tokens(m, r->id, &t, 1));
		r->tok[r->ntok++] = t;
		m_hash_new_blocks(r);
		nnew = 1;
	} else {
		assert_ok(kvp_mgr_free_request(m, r->id));
		m_free_blocks(r);
		r->live = false;
		return KVP_OK;
	}
	size_t lookahead = rnd(4) == 0 ? rnd(3) : 0;
	bool delay = rnd(8) == 0;
	/* Async scheduling: some of what was computed may be in flight (0.33 only). */
	size_t in_flight = SEM == KVP_VLLM_0_33 && rnd(4) == 0 ? rnd(12) : 0;
	for (uint32_t g = 0; g < NG; g++)
		pa[g] = hit ? ha[g] : NULL;
	struct kvp_alloc_args a = {
		.num_new_tokens = (uint32_t)nnew, .num_new_computed_tokens = (uint32_t)hit,
		.computed_blocks = (const int32_t *const *)pa,
		.num_lookahead_tokens = (uint32_t)lookahead, .delay_cache_blocks = delay,
		.num_in_flight_tokens = (uint32_t)in_flight,
	};
	int sa = kvp_mgr_allocate_slots(m, r->id, &a, pna, MAXBLK, ca);
	int sb = m_allocate_slots(r, nnew, hit, hb, lookahead, delay, in_flight, nb, cb);
	if (sa != sb)
		fail_at("allocate_slots %s, model %s", kvp_strerror(sa), kvp_strerror(sb));
	for (uint32_t g = 0; sa == KVP_OK && g < NG; g++)
		same_ids(na[g], ca[g], nb[g], cb[g], "new blocks");
	nhits += hit > 0;
	return sa;
}

static void
op_invalid(struct kvp_mgr *m, uint64_t next_id)
{
	int32_t buf[NG][MAXBLK], *p[NG] = {buf[0], buf[1]};
	size_t counts[NG];
	uint32_t hit;
	struct kvp_alloc_args a = {.num_new_tokens = 1};

	assert_status(kvp_mgr_allocate_slots(m, next_id, &a, p, MAXBLK, counts), KVP_ENOTFOUND);
	assert_status(kvp_mgr_get_computed_blocks(m, next_id, p, MAXBLK, &hit), KVP_ENOTFOUND);
	assert_status(kvp_mgr_preempt(m, next_id), KVP_ENOTFOUND);
	for (int i = 0; i < MAXR; i++) {
		if (!R[i].live)
			continue;
		a.num_new_tokens = 0; /* vLLM raises ValueError */
		assert_status(kvp_mgr_allocate_slots(m, R[i].id, &a, p, MAXBLK, counts), KVP_EINVAL);
		break;
	}
}

static void
run_config(const struct config *c, uint64_t ops, uint64_t seed, enum kvp_vllm_semantics sem)
{
	struct kvp_pool_config pc = {
		.num_blocks = NB, .hash_block_size = HBS,
		.hash_len = (uint32_t)kvp_hash_algo_len(c->algo),
		.max_hash_len = 2 * (uint32_t)kvp_hash_algo_len(c->algo),
		.enable_caching = c->caching, .enable_events = true, .semantics = sem,
	};
	SEM = sem;
	struct kvp_mgr_config mc = {.num_groups = NG, .groups = c->g, .max_model_len = MAXTOK};
	struct kvp_pool *pa = NULL;
	struct kvp_hasher *ha = NULL;
	struct kvp_mgr *m = NULL;
	struct kvp_event_batch ea, eb;
	uint64_t next_id = 1, refusals = 0;

	C = c;
	HL = kvp_hash_algo_len(c->algo);
	nhits = 0;
	rng = seed * 2654435761u + 1;
	memset(R, 0, sizeof(R));
	for (int t = 0; t < NTMPL; t++)
		for (int i = 0; i < MAXTOK; i++)
			tmpl[t][i] = (int64_t)rnd(ALPHA);
	assert_ok(kvp_pool_create(&pc, &pa));
	assert_ok(kvp_pool_create(&pc, &PB));
	assert_ok(kvp_hasher_create_algo("0", c->algo, &ha));
	assert_ok(kvp_hasher_create_algo("0", c->algo, &HB));
	assert_ok(kvp_mgr_create(pa, ha, &mc, &m));
	kvp_event_batch_init(&ea);
	kvp_event_batch_init(&eb);
	for (step = 0; step < ops; step++) {
		uint32_t what = rnd(100), i = rnd(MAXR);
		struct mreq *r = &R[i];
		if (what < 15) {
			op_add(m, &next_id);
		} else if (what < 80) {
			if (r->live)
				refusals += op_step(m, r) == KVP_ENOSPACE;
		} else if (what < 88) {
			if (r->live) {
				assert_ok(kvp_mgr_preempt(m, r->id));
				m_free_blocks(r);
			}
		} else if (what < 95) {
			if (r->live) {
				assert_ok(kvp_mgr_free_request(m, r->id));
				m_free_blocks(r);
				r->live = false;
			}
		} else if (what < 96) {
			op_invalid(m, next_id);
		} else {
			continue; /* idle: nothing changes */
		}
		same_state(m, pa);
		same_events(m, &ea, &eb);
		if (step % 4096 == 0) {
			char detail[256] = "";
			if (kvp_pool_check(pa, detail, sizeof(detail)) != KVP_OK)
				fail_at("invariant broken: %s", detail);
		}
	}
	print_message("%s: %llu ops, %llu requests, %llu hits, %llu NO_SPACE\n", c->name,
	              (unsigned long long)ops, (unsigned long long)next_id - 1,
	              (unsigned long long)nhits, (unsigned long long)refusals);
	/* The run reached what it is for: hits (with caching) and refusals. */
	assert_true(c->caching ? nhits > 0 : nhits == 0);
	assert_true(ops < 10000 || refusals > 0);
	kvp_event_batch_fini(&ea);
	kvp_event_batch_fini(&eb);
	kvp_mgr_destroy(m);
	kvp_pool_destroy(pa);
	kvp_pool_destroy(PB);
	kvp_hasher_destroy(ha);
	kvp_hasher_destroy(HB);
	PB = NULL;
}

static void
test_mgr_differential_hybrid_matches_reference_model(void **state)
{
	const char *ops_env = getenv("KVP_DIFF_OPS"), *seed_env = getenv("KVP_DIFF_SEED");
	uint64_t ops = ops_env ? strtoull(ops_env, NULL, 10) : 1000000;
	uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : 1;

	(void)state;
	print_message("seed %llu\n", (unsigned long long)seed);
	/* vLLM 0.33's rules with the full count, 9aaf83ef5's with a quarter. */
	for (size_t i = 0; i < N_ELEMS(configs); i++)
		run_config(&configs[i], ops * configs[i].share / SHARES, seed + i, KVP_VLLM_0_33);
	for (size_t i = 0; i < N_ELEMS(configs); i++)
		run_config(&configs[i], ops / 4 * configs[i].share / SHARES, seed + i,
		           KVP_VLLM_9AAF83EF5);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mgr_differential_hybrid_matches_reference_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
