/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA parity: the same random operations through the cpu and the cuda
 * backends, the whole memory compared with memcmp after each. Skips, with
 * the reason, where cuda is not built in or no device is present.
 */
#include <stdlib.h>
#include <time.h>

#include "kvp_test.h"

#include "gpu/executor.h"

static uint64_t rng;

static uint64_t
next(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void
fill(void *p, size_t n)
{
	unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)next();
}

static void
same_memory(struct kvp_exec *a, struct kvp_exec *b, const char *after)
{
	uint32_t nb = kvp_exec_shape(a)->num_blocks;
	size_t bb = kvp_exec_block_bytes(a);
	int32_t *ids = malloc(nb * sizeof(*ids));
	unsigned char *x = malloc(nb * bb), *y = malloc(nb * bb);
	for (uint32_t i = 0; i < nb; i++)
		ids[i] = (int32_t)i;
	assert_ok(kvp_exec_read_blocks(a, ids, nb, x, nb * bb));
	assert_ok(kvp_exec_read_blocks(b, ids, nb, y, nb * bb));
	for (uint32_t i = 0; i < nb; i++)
		if (memcmp(x + i * bb, y + i * bb, bb) != 0)
			fail_msg("after %s: block %u differs between cpu and cuda", after, i);
	free(ids);
	free(x);
	free(y);
}

/* Shuffled ids 0..nb-1. */
static int32_t *
perm(uint32_t nb)
{
	int32_t *p = malloc(nb * sizeof(*p));
	for (uint32_t i = 0; i < nb; i++)
		p[i] = (int32_t)i;
	for (uint32_t i = nb; i > 1; i--) {
		uint32_t j = (uint32_t)(next() % i);
		int32_t t = p[i - 1];
		p[i - 1] = p[j];
		p[j] = t;
	}
	return p;
}

static void
parity(void **state)
{
	(void)state;
	static const uint32_t shapes[][5] = {
		{5, 3, 2, 1, 5}, {64, 16, 4, 8, 128}, {17, 8, 3, 2, 12}, {9, 1, 1, 3, 64}};
	char why[256];
	struct kvp_exec_config cfg = {.backend = KVP_EXEC_CUDA,
	                              .shape = {8, 16, 1, 1, 8, KVP_DTYPE_FP16, KVP_LAYOUT_NHD}};
	struct kvp_exec *g = NULL;
	int rv = kvp_exec_open(&cfg, &g, why, sizeof(why));
	if (rv == KVP_ENODEVICE || rv == KVP_ENOTSUP) {
		print_message("SKIP: %s (%s)\n", kvp_status_name(rv), why);
		skip();
	}
	assert_ok(rv);
	kvp_exec_close(g);

	for (uint32_t dt = 0; dt <= KVP_DTYPE_FP32; dt++)
		for (uint32_t lay = 0; lay < 2 * (KVP_LAYOUT_HND + 1); lay++)
			for (size_t c = 0; c < N_ELEMS(shapes); c++) {
				/* every layout in per-layer tensors, then in rows (a region's) */
				struct kvp_kv_shape s = {shapes[c][0], shapes[c][1], shapes[c][2], shapes[c][3],
				                         shapes[c][4], dt, lay % 2, lay / 2};
				struct kvp_exec_config cc = {.backend = KVP_EXEC_CPU, .shape = s};
				struct kvp_exec_config gc = {.backend = KVP_EXEC_CUDA, .shape = s};
				struct kvp_exec *cpu, *gpu;
				assert_ok(kvp_exec_open(&cc, &cpu, why, sizeof(why)));
				assert_ok(kvp_exec_open(&gc, &gpu, why, sizeof(why)));
				assert_string_equal(kvp_exec_medium(gpu), "GPU");
				size_t bb = kvp_exec_block_bytes(cpu), nb = s.num_blocks;
				same_memory(cpu, gpu, "open");
				for (int step = 0; step < 20; step++) {
					int32_t *p = perm(s.num_blocks);
					uint32_t n = (uint32_t)(next() % (nb / 2 + 1));
					unsigned char *buf = malloc(nb * bb + 1);
					fill(buf, n * bb);
					assert_ok(kvp_exec_write_blocks(cpu, p, n, buf, n * bb));
					assert_ok(kvp_exec_write_blocks(gpu, p, n, buf, n * bb));
					same_memory(cpu, gpu, "write_blocks");
					/* Copy blocks n.. onto 0..n-1 of the permutation. */
					assert_ok(kvp_exec_copy_blocks(cpu, p + n, p, n));
					assert_ok(kvp_exec_copy_blocks(gpu, p + n, p, n));
					same_memory(cpu, gpu, "copy_blocks");
					/* Tokens: distinct slots from a shuffled range, some padding. */
					size_t tok = (size_t)s.num_heads * s.head_size * kvp_dtype_size(dt);
					uint32_t nt = (uint32_t)(next() % (s.block_size * 2 + 1)), nl = s.num_layers;
					int64_t *slots = malloc((nt + 1) * sizeof(*slots));
					for (uint32_t t = 0; t < nt; t++)
						slots[t] = next() % 4 == 0 ? -1
						                           : (int64_t)p[t / s.block_size % nb] * s.block_size +
						                                     t % s.block_size;
					unsigned char *k = malloc(nl * nt * tok + 1), *v = malloc(nl * nt * tok + 1);
					fill(k, nl * nt * tok);
					fill(v, nl * nt * tok);
					assert_ok(kvp_exec_write_tokens(cpu, true, 0, slots, nt, k, v, nl * nt * tok));
					assert_ok(kvp_exec_write_tokens(gpu, true, 0, slots, nt, k, v, nl * nt * tok));
					assert_ok(kvp_exec_write_tokens(cpu, false, nl - 1, slots, nt, k, v, nt * tok));
					assert_ok(kvp_exec_write_tokens(gpu, false, nl - 1, slots, nt, k, v, nt * tok));
					same_memory(cpu, gpu, "write_tokens");
					free(slots);
					free(k);
					free(v);
					free(buf);
					free(p);
				}
				kvp_exec_close(cpu);
				kvp_exec_close(gpu);
			}
}

static void
refusals_and_memory(void **state)
{
	(void)state;
	struct kvp_exec_config cfg = {.backend = KVP_EXEC_CUDA,
	                              .shape = {8, 16, 1, 1, 8, KVP_DTYPE_FP16, KVP_LAYOUT_NHD}};
	struct kvp_exec *g = NULL;
	char why[256];
	uint64_t f = 0, t = 0;
	int rv = kvp_exec_device_memory(0, &f, &t);
	if (rv != KVP_OK) {
		assert_true(rv == KVP_ENODEVICE || rv == KVP_ENOTSUP);
		assert_status(kvp_exec_open(&cfg, &g, why, sizeof(why)), rv == KVP_ENOTSUP ? KVP_ENOTSUP
		                                                                         : KVP_ENODEVICE);
		print_message("SKIP: %s (%s)\n", kvp_status_name(rv), why);
		skip();
	}
	assert_true(f > 0 && f <= t);
	/* More memory than the device has: a status, not a crash. */
	cfg.shape.num_blocks = 1u << 30;
	cfg.shape.num_heads = 64;
	cfg.shape.head_size = 256;
	assert_status(kvp_exec_open(&cfg, &g, why, sizeof(why)), KVP_ENOMEM);
	/* A device that does not exist. */
	cfg.shape.num_blocks = 8;
	cfg.device = 4096;
	assert_status(kvp_exec_open(&cfg, &g, why, sizeof(why)), KVP_ENODEVICE);
	/* The device benchmark runs and reports sane numbers. */
	cfg.device = 0;
	cfg.shape.num_blocks = 64;
	assert_ok(kvp_exec_open(&cfg, &g, why, sizeof(why)));
	struct kvp_exec_bench b;
	assert_ok(kvp_exec_device_bench(g, 16, 3, &b));
	assert_true(b.gather_gbps > 0 && b.d2d_gbps > 0);
	kvp_exec_close(g);
}

int
main(void)
{
	const char *env = getenv("KVP_TEST_SEED");
	uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
	rng = seed;
	fprintf(stderr, "test_executor_cuda: seed %llu\n", (unsigned long long)seed);
	/* No device (or no CUDA built in): every case would skip; CTest reports the program skipped. */
	struct kvp_exec_config probe = {.backend = KVP_EXEC_CUDA,
	                                .shape = {2, 16, 1, 1, 8, KVP_DTYPE_FP16, KVP_LAYOUT_NHD}};
	struct kvp_exec *g = NULL;
	char why[256];
	int rv = kvp_exec_open(&probe, &g, why, sizeof(why));
	if (rv == KVP_ENODEVICE || rv == KVP_ENOTSUP) {
		fprintf(stderr, "test_executor_cuda: skipped: %s (%s)\n", kvp_status_name(rv), why);
		return 77;
	}
	kvp_exec_close(g);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(parity),
		cmocka_unit_test(refusals_and_memory),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
