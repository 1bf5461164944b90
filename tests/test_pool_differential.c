/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A long seeded random run of pool operations (valid and invalid) against a
 * deliberately simple reference model: arrays and linear scans, written
 * from the spec, not from pool.c. After every step the two must agree on
 * statuses, returned ids, every ref count, the whole free-queue order,
 * every block's hash, the map's key count and the events; the invariant
 * checker runs every few steps.
 *
 * KVP_DIFF_OPS sets the number of operations (default 1,000,000) and
 * KVP_DIFF_SEED the seed (default 1); the seed is printed.
 */
#include "pool_util.h"
#include "common/map_key.h"

#include <stdlib.h>

enum { N = 40, NGROUPS = 3, ALPHABET = 12, BS = 4, NTOK = 40, MAXL = 12 };

struct mkey {
	uint8_t b[KVP_HASH_LEN + 4];
	bool set;
};

struct mevent {
	int type;
	int nh;
	uint8_t hashes[MAXL][KVP_HASH_LEN];
	bool has_parent;
	uint8_t parent[KVP_HASH_LEN];
	int t0, t1;
	uint32_t group;
};

/* The reference model. */
static struct {
	int ref[N];
	struct mkey key[N];
	int queue[N], qlen;
	struct { uint8_t b[KVP_HASH_LEN + 4]; int id; } ent[N];
	int nent;
	struct mevent ev[N + 8];
	int nev;
} M;

static uint64_t rng;
static enum kvp_vllm_semantics SEM; /* the rules under test */
static int64_t tokens[NTOK];

static uint32_t
rnd(uint32_t n)
{
	kvp_test_rand(&rng);
	return n ? (uint32_t)(rng % n) : 0;
}

static void
alpha_hash(int v, uint8_t *out)
{
	memset(out, 0, KVP_HASH_LEN);
	out[KVP_HASH_LEN - 1] = (uint8_t)(v + 1);
	out[3] = (uint8_t)(v * 37);
}

static void
mk(uint8_t *key, const uint8_t *h, uint32_t g)
{
	kvp_map_key_make(key, h, KVP_HASH_LEN, g);
}

static int
m_qfind(int id)
{
	for (int i = 0; i < M.qlen; i++)
		if (M.queue[i] == id)
			return i;
	return -1;
}

static void
m_qremove(int id)
{
	int i = m_qfind(id);
	memmove(&M.queue[i], &M.queue[i + 1], (size_t)(M.qlen - i - 1) * sizeof(int));
	M.qlen--;
}

static int
m_lookup(const uint8_t *key)
{
	for (int i = 0; i < M.nent; i++)
		if (memcmp(M.ent[i].b, key, 36) == 0)
			return M.ent[i].id;
	return -1;
}

static int
m_count_keys(void)
{
	int n = 0;
	for (int i = 0; i < M.nent; i++) {
		int first = 1;
		for (int j = 0; j < i; j++)
			if (memcmp(M.ent[j].b, M.ent[i].b, 36) == 0)
				first = 0;
		n += first;
	}
	return n;
}

static void
m_evict(int id)
{
	if (!M.key[id].set)
		return;
	for (int i = 0; i < M.nent; i++) {
		if (M.ent[i].id == id) {
			memmove(&M.ent[i], &M.ent[i + 1], (size_t)(M.nent - i - 1) * sizeof(M.ent[0]));
			M.nent--;
			break;
		}
	}
	struct mevent *e = &M.ev[M.nev++];
	memset(e, 0, sizeof(*e));
	e->type = KVP_EVENT_BLOCK_REMOVED;
	e->nh = 1;
	memcpy(e->hashes[0], M.key[id].b, KVP_HASH_LEN);
	e->group = kvp_map_key_group(M.key[id].b, sizeof M.key[id].b);
	M.key[id].set = false;
}

/* ---- model operations: same validation order as documented in pool.h ---- */

static int
m_get(int n, int32_t *out)
{
	if (n > M.qlen)
		return KVP_ENOSPACE;
	for (int i = 0; i < n; i++) {
		int id = M.queue[0];
		m_qremove(id);
		m_evict(id);
		M.ref[id] = 1;
		out[i] = id;
	}
	return KVP_OK;
}

static int
m_free(const int32_t *ids, int n)
{
	int seen[N] = {0};
	for (int i = 0; i < n; i++) {
		int id = ids[i];
		if (id < 0 || id >= N)
			return KVP_ERANGE;
		if (id == 0)
			continue;
		if (seen[id])
			return KVP_EINVAL;
		if (M.ref[id] == 0)
			return KVP_ESTATE;
		seen[id] = 1;
	}
	/* vLLM 0.33: unhashed blocks to the front in list order, hashed to the back. */
	int first[N], nfirst = 0;
	for (int i = 0; i < n; i++) {
		if (ids[i] == 0 || --M.ref[ids[i]] != 0)
			continue;
		if (SEM == KVP_VLLM_0_33 && !M.key[ids[i]].set)
			first[nfirst++] = ids[i];
		else
			M.queue[M.qlen++] = ids[i];
	}
	memmove(M.queue + nfirst, M.queue, (size_t)M.qlen * sizeof(M.queue[0]));
	memcpy(M.queue, first, (size_t)nfirst * sizeof(first[0]));
	M.qlen += nfirst;
	return KVP_OK;
}

static int
m_touch(const int32_t *ids, int n)
{
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= N)
			return KVP_ERANGE;
	for (int i = 0; i < n; i++) {
		int id = ids[i];
		if (id == 0)
			continue;
		if (M.ref[id] == 0)
			m_qremove(id);
		M.ref[id]++;
	}
	return KVP_OK;
}

static int
m_cache(const int32_t *blocks, int nc, int nf, const uint8_t (*h)[KVP_HASH_LEN],
        const bool *mask, uint32_t g, int ntok)
{
	int seen[N] = {0};
	if (nc >= nf)
		return KVP_OK;
	for (int i = nc; i < nf; i++) {
		int id = blocks[i];
		if (id < 0 || id >= N)
			return KVP_ERANGE;
		if (id == 0 || (mask && !mask[i - nc]))
			continue;
		if (seen[id])
			return KVP_EINVAL;
		if (M.key[id].set || M.ref[id] == 0)
			return KVP_ESTATE;
		seen[id] = 1;
	}
	struct mevent *e = &M.ev[M.nev++];
	memset(e, 0, sizeof(*e));
	e->type = KVP_EVENT_BLOCK_STORED;
	e->group = g;
	e->has_parent = nc > 0;
	if (nc > 0)
		memcpy(e->parent, h[nc - 1], KVP_HASH_LEN);
	e->t0 = nc * BS < ntok ? nc * BS : ntok;
	e->t1 = nf * BS < ntok ? nf * BS : ntok;
	for (int i = nc; i < nf; i++) {
		int id = blocks[i];
		if (id == 0 || (mask && !mask[i - nc]))
			continue;
		mk(M.key[id].b, h[i], g);
		M.key[id].set = true;
		memcpy(M.ent[M.nent].b, M.key[id].b, 36);
		M.ent[M.nent++].id = id;
		memcpy(e->hashes[e->nh++], h[i], KVP_HASH_LEN);
	}
	return KVP_OK;
}

static int
m_evict_blocks(const int32_t *ids, int n)
{
	int seen[N] = {0};
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= N)
			return KVP_ERANGE;
	/* In the order given, each id once: vLLM iterates the set its caller built. */
	for (int i = 0; i < n; i++)
		if (!seen[ids[i]]++)
			m_evict(ids[i]);
	return KVP_OK;
}

static int
m_reset(void)
{
	if (M.qlen != N - 1)
		return KVP_ESTATE;
	for (int i = 0; i < N; i++)
		M.key[i].set = false;
	M.nent = 0;
	struct mevent *e = &M.ev[M.nev++];
	memset(e, 0, sizeof(*e));
	e->type = KVP_EVENT_ALL_CLEARED;
	return KVP_OK;
}

/* ---- comparison ---- */

static void
compare(struct kvp_pool *p, struct kvp_event_batch *b, uint64_t step)
{
	int32_t q[N];
	size_t nq = kvp_pool_free_queue(p, q, N);

	if ((int)nq != M.qlen)
		fail_msg("step %llu: queue length %zu, model %d", (unsigned long long)step, nq, M.qlen);
	for (int i = 0; i < M.qlen; i++)
		if (q[i] != M.queue[i])
			fail_msg("step %llu: queue[%d] = %d, model %d", (unsigned long long)step, i,
			         q[i], M.queue[i]);
	for (int id = 0; id < N; id++) {
		size_t len;
		const uint8_t *k = kvp_pool_block_key(p, id, &len);
		if (kvp_pool_ref_cnt(p, id) != M.ref[id])
			fail_msg("step %llu: ref[%d] = %d, model %d", (unsigned long long)step, id,
			         kvp_pool_ref_cnt(p, id), M.ref[id]);
		if ((k != NULL) != M.key[id].set || (k && (len != 36 || memcmp(k, M.key[id].b, 36))))
			fail_msg("step %llu: block %d hash differs", (unsigned long long)step, id);
	}
	if ((int)kvp_pool_num_cached_keys(p) != m_count_keys())
		fail_msg("step %llu: %u keys, model %d", (unsigned long long)step,
		         kvp_pool_num_cached_keys(p), m_count_keys());
	assert_ok(kvp_pool_take_events(p, b));
	if ((int)kvp_event_batch_count(b) != M.nev)
		fail_msg("step %llu: %zu events, model %d", (unsigned long long)step,
		         kvp_event_batch_count(b), M.nev);
	for (int i = 0; i < M.nev; i++) {
		struct kvp_event ev;
		const struct mevent *me = &M.ev[i];
		assert_ok(kvp_event_batch_get(b, (size_t)i, &ev));
		assert_int_equal(ev.type, me->type);
		if (me->type == KVP_EVENT_ALL_CLEARED)
			continue;
		assert_int_equal(ev.num_hashes, me->nh);
		for (int j = 0; j < me->nh; j++)
			assert_memory_equal(ev.hashes + j * KVP_HASH_LEN, me->hashes[j], KVP_HASH_LEN);
		assert_int_equal(ev.group_idx, me->group);
		assert_string_equal(ev.medium, "GPU");
		if (me->type == KVP_EVENT_BLOCK_STORED) {
			assert_int_equal(ev.parent != NULL, me->has_parent);
			if (me->has_parent)
				assert_memory_equal(ev.parent, me->parent, KVP_HASH_LEN);
			assert_int_equal(ev.num_tokens, me->t1 - me->t0);
			for (int t = me->t0; t < me->t1; t++)
				assert_int_equal(ev.token_ids[t - me->t0], tokens[t]);
			assert_int_equal(ev.block_size, BS);
			for (int j = 0; j < me->nh; j++)
				assert_int_equal(ev.extra_keys[ev.extra_key_offsets[j]], 0xf6);
		}
	}
	M.nev = 0;
}

/* A random block from a class: held (ref > 0), any, or cached. */
static int32_t
pick(int cls)
{
	int cand[N], n = 0;
	for (int id = 1; id < N; id++)
		if ((cls == 0 && M.ref[id] > 0) || cls == 1 || (cls == 2 && M.key[id].set))
			cand[n++] = id;
	return n ? cand[rnd((uint32_t)n)] : 0;
}

static void
random_ops(enum kvp_vllm_semantics sem)
{
	const char *ops_env = getenv("KVP_DIFF_OPS"), *seed_env = getenv("KVP_DIFF_SEED");
	uint64_t ops = ops_env ? strtoull(ops_env, NULL, 10) : 1000000;
	uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : 1;
	struct kvp_pool *p = mkpool_sem(N, BS, true, sem);
	struct kvp_event_batch b;
	uint64_t counts[8] = {0}, errors = 0;

	SEM = sem;
	printf("differential (vLLM %s): seed %llu, %llu operations\n",
	       kvp_vllm_semantics_name(sem), (unsigned long long)seed, (unsigned long long)ops);
	rng = seed * 0x9e3779b97f4a7c15ull + 1;
	memset(&M, 0, sizeof(M));
	for (int i = 1; i < N; i++)
		M.queue[M.qlen++] = i;
	for (int i = 0; i < NTOK; i++)
		tokens[i] = i * 7 - 3;
	kvp_event_batch_init(&b);

	for (uint64_t step = 0; step < ops; step++) {
		int32_t ids[MAXL + 2], out[N];
		int n = 0, got = 0, want = 0;
		uint32_t op = rnd(100);

		if (op < 22) { /* get_new_blocks */
			n = (int)rnd((uint32_t)M.qlen + 3);
			want = m_get(n, out);
			int32_t eng[N + 3];
			got = kvp_pool_get_new_blocks(p, (uint32_t)n, eng);
			if (want == KVP_OK)
				for (int i = 0; i < n; i++)
					assert_int_equal(eng[i], out[i]);
			counts[0]++;
		} else if (op < 44) { /* free a random subset of held blocks, sometimes badly */
			int k = (int)rnd(6) + 1;
			for (int i = 0; i < k; i++) {
				int32_t id = pick(0);
				bool dup = false;
				for (int j = 0; j < n; j++)
					dup |= ids[j] == id && id != 0;
				if (!dup)
					ids[n++] = id;
			}
			uint32_t fault = rnd(20);
			if (fault == 0)
				ids[n++] = (int32_t)(N + rnd(3)); /* out of range */
			else if (fault == 1 && n > 0)
				ids[n++] = ids[0]; /* duplicate */
			else if (fault == 2)
				ids[n++] = pick(1); /* maybe ref 0 */
			else if (fault == 3)
				ids[n++] = 0; /* the null block */
			want = m_free(ids, n);
			got = kvp_pool_free_blocks(p, ids, (size_t)n);
			counts[1]++;
		} else if (op < 60) { /* lookup + touch, like a prefix hit */
			uint8_t h[KVP_HASH_LEN];
			uint8_t key[36];
			uint32_t g = rnd(NGROUPS);
			int32_t hit = -5;
			alpha_hash((int)rnd(ALPHABET), h);
			mk(key, h, g);
			want = m_lookup(key) >= 0 ? KVP_OK : KVP_ENOTFOUND;
			got = kvp_pool_get_cached_block(p, h, KVP_HASH_LEN, &g, 1, &hit);
			assert_status(got, want);
			if (got == KVP_OK) {
				assert_int_equal(hit, m_lookup(key));
				ids[n++] = hit;
			}
			if (rnd(4) == 0)
				ids[n++] = pick(0);
			if (rnd(10) == 0)
				ids[n++] = 0;
			if (rnd(40) == 0)
				ids[n++] = -1;
			want = m_touch(ids, n);
			got = kvp_pool_touch(p, ids, (size_t)n);
			counts[2]++;
		} else if (op < 84) { /* cache_full_blocks over held blocks */
			uint8_t h[MAXL][KVP_HASH_LEN];
			bool mask[MAXL];
			int nf = (int)rnd(6) + 1, nc = (int)rnd((uint32_t)nf + 1);
			uint32_t g = rnd(NGROUPS);
			int ntok = rnd(4) == 0 ? (int)rnd(NTOK) : NTOK;
			bool use_mask = rnd(5) == 0;
			for (int i = 0; i < nf; i++) {
				alpha_hash((int)rnd(ALPHABET), h[i]);
				ids[i] = rnd(8) == 0 ? 0 : pick(rnd(6) == 0 ? 1 : 0);
				mask[i] = rnd(3) != 0;
			}
			if (rnd(50) == 0)
				ids[rnd((uint32_t)nf)] = N + 5;
			want = m_cache(ids, nc, nf, (const uint8_t(*)[KVP_HASH_LEN])h,
			               use_mask ? mask + nc : NULL, g, ntok);
			struct kvp_cache_args a = {
				.block_hashes = &h[0][0], .num_block_hashes = (size_t)nf,
				.token_ids = tokens, .num_tokens = (size_t)ntok,
				.num_cached_blocks = (uint32_t)nc, .num_full_blocks = (uint32_t)nf,
				.block_size = BS, .group_id = g, .block_mask = use_mask ? mask + nc : NULL,
			};
			got = kvp_pool_cache_full_blocks(p, ids, (size_t)nf, &a);
			counts[3]++;
		} else if (op < 92) { /* evict_blocks */
			int k = (int)rnd(4) + 1;
			for (int i = 0; i < k; i++)
				ids[n++] = rnd(2) ? pick(2) : (int32_t)rnd(N);
			if (rnd(30) == 0)
				ids[n++] = N;
			want = m_evict_blocks(ids, n);
			got = kvp_pool_evict_blocks(p, ids, (size_t)n);
			counts[4]++;
		} else if (op < 97) { /* free everything held, in random order, maybe reset */
			for (int id = 1; id < N; id++)
				while (M.ref[id] > 0) {
					int32_t one = id;
					assert_status(m_free(&one, 1), KVP_OK);
					assert_ok(kvp_pool_free_blocks(p, &one, 1));
				}
			bool do_reset = rnd(2);
			want = do_reset ? m_reset() : KVP_OK;
			got = do_reset ? kvp_pool_reset_prefix_cache(p) : KVP_OK;
			counts[5]++;
		} else { /* reset while maybe in use */
			want = m_reset();
			got = kvp_pool_reset_prefix_cache(p);
			counts[6]++;
		}
		if (got != want)
			fail_msg("step %llu (op %u): got %s, model %s", (unsigned long long)step, op,
			         kvp_status_name(got), kvp_status_name(want));
		errors += got != KVP_OK;
		compare(p, &b, step);
		if (step % 64 == 0)
			assert_pool_ok(p);
	}
	assert_pool_ok(p);
	printf("differential: get %llu free %llu touch %llu cache %llu evict %llu drain %llu "
	       "reset %llu; %llu refused as the model predicted\n",
	       (unsigned long long)counts[0], (unsigned long long)counts[1],
	       (unsigned long long)counts[2], (unsigned long long)counts[3],
	       (unsigned long long)counts[4], (unsigned long long)counts[5],
	       (unsigned long long)counts[6], (unsigned long long)errors);
	kvp_event_batch_fini(&b);
	kvp_pool_destroy(p);
}

static void
test_pool_differential_v033_random_ops_match_reference_model(void **state)
{
	(void)state;
	random_ops(KVP_VLLM_0_33);
}

static void
test_pool_differential_9aaf83ef5_random_ops_match_reference_model(void **state)
{
	(void)state;
	random_ops(KVP_VLLM_9AAF83EF5);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pool_differential_v033_random_ops_match_reference_model),
		cmocka_unit_test(test_pool_differential_9aaf83ef5_random_ops_match_reference_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
