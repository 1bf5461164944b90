/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cpu executor against a naive model, on fresh random data each run
 * (seed printed; KVP_TEST_SEED repeats a run). The model keeps every
 * element in a plain array indexed [layer][kv][block][offset][head][dim]
 * and writes the layout formulas out by hand, independent of kv_layout.h.
 * After every operation the whole memory is read back and compared.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvp_test.h"

#include "gpu/exec_impl.h"
#include "gpu/executor.h"
#include "gpu/par_copy.h"

static uint64_t rng;

static uint64_t
next(void)
{
	/* splitmix64 */
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t
below(uint32_t n)
{
	return (uint32_t)(next() % n);
}

static void
fill(void *p, size_t n)
{
	unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)next();
}

/* The model: element (l, kv, b, o, h, d) at index ((((l*2+kv)*NB+b)*B+o)*H+h)*D+d. */
struct model {
	struct kvp_kv_shape s;
	size_t es;
	unsigned char *m;
};

static size_t
midx(const struct model *md, uint32_t l, uint32_t kv, uint32_t b, uint32_t o, uint32_t h,
     uint32_t d)
{
	const struct kvp_kv_shape *s = &md->s;
	return (((((size_t)l * 2 + kv) * s->num_blocks + b) * s->block_size + o) * s->num_heads + h) *
	               s->head_size +
	       d;
}

/* Index of (o, h, d) inside one payload chunk, by the layout's definition. */
static size_t
chunk_idx(const struct kvp_kv_shape *s, uint32_t o, uint32_t h, uint32_t d)
{
	if (s->layout == KVP_LAYOUT_HND)
		return ((size_t)h * s->block_size + o) * s->head_size + d;
	return ((size_t)o * s->num_heads + h) * s->head_size + d;
}

static size_t
chunk_elems(const struct kvp_kv_shape *s)
{
	return (size_t)s->block_size * s->num_heads * s->head_size;
}

/* The payload of block b as the model says it should read. */
static void
model_payload(const struct model *md, uint32_t b, unsigned char *out)
{
	const struct kvp_kv_shape *s = &md->s;
	size_t ce = chunk_elems(s);
	for (uint32_t l = 0; l < s->num_layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t o = 0; o < s->block_size; o++)
				for (uint32_t h = 0; h < s->num_heads; h++)
					for (uint32_t d = 0; d < s->head_size; d++)
						memcpy(out + (((size_t)l * 2 + kv) * ce + chunk_idx(s, o, h, d)) * md->es,
						       md->m + midx(md, l, kv, b, o, h, d) * md->es, md->es);
}

static void
model_store(struct model *md, uint32_t b, const unsigned char *in)
{
	const struct kvp_kv_shape *s = &md->s;
	size_t ce = chunk_elems(s);
	for (uint32_t l = 0; l < s->num_layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t o = 0; o < s->block_size; o++)
				for (uint32_t h = 0; h < s->num_heads; h++)
					for (uint32_t d = 0; d < s->head_size; d++)
						memcpy(md->m + midx(md, l, kv, b, o, h, d) * md->es,
						       in + (((size_t)l * 2 + kv) * ce + chunk_idx(s, o, h, d)) * md->es,
						       md->es);
}

/* Reads every block back and compares it with the model. */
static void
compare_all(struct kvp_exec *e, const struct model *md, const char *after)
{
	uint32_t nb = md->s.num_blocks;
	size_t bb = kvp_exec_block_bytes(e);
	int32_t *ids = malloc(nb * sizeof(*ids));
	unsigned char *got = malloc(nb * bb), *want = malloc(bb);
	assert_non_null(ids);
	assert_non_null(got);
	assert_non_null(want);
	for (uint32_t i = 0; i < nb; i++)
		ids[nb - 1 - i] = (int32_t)i; /* reversed: the payload follows the list */
	assert_ok(kvp_exec_read_blocks(e, ids, nb, got, nb * bb));
	for (uint32_t i = 0; i < nb; i++) {
		model_payload(md, (uint32_t)ids[i], want);
		if (memcmp(got + i * bb, want, bb) != 0)
			fail_msg("after %s: block %d differs from the model", after, ids[i]);
	}
	free(ids);
	free(got);
	free(want);
}

/* Random distinct ids (n <= nb). */
static void
distinct_ids(int32_t *ids, uint32_t n, uint32_t nb)
{
	int32_t *all = malloc(nb * sizeof(*all));
	assert_non_null(all);
	for (uint32_t i = 0; i < nb; i++)
		all[i] = (int32_t)i;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t j = i + below(nb - i);
		int32_t t = all[i];
		all[i] = all[j];
		all[j] = t;
		ids[i] = all[i];
	}
	free(all);
}

static void
op_write_blocks(struct kvp_exec *e, struct model *md)
{
	uint32_t nb = md->s.num_blocks, n = below(nb + 1);
	size_t bb = kvp_exec_block_bytes(e);
	int32_t *ids = malloc((n + 1) * sizeof(*ids));
	unsigned char *buf = malloc((n + 1) * bb);
	distinct_ids(ids, n, nb);
	fill(buf, n * bb);
	assert_ok(kvp_exec_write_blocks(e, ids, n, buf, n * bb));
	for (uint32_t i = 0; i < n; i++)
		model_store(md, (uint32_t)ids[i], buf + i * bb);
	free(ids);
	free(buf);
}

static void
op_copy_blocks(struct kvp_exec *e, struct model *md)
{
	uint32_t nb = md->s.num_blocks, n = below(nb / 2 + 1);
	size_t bb = kvp_exec_block_bytes(e);
	int32_t *perm = malloc(nb * sizeof(*perm)), *src = malloc((n + 1) * 4),
		*dst = malloc((n + 1) * 4);
	unsigned char *tmp = malloc(bb * (n + 1));
	distinct_ids(perm, nb, nb);
	/* Destinations: the first n of a permutation; sources: any of the rest, repeats allowed. */
	for (uint32_t i = 0; i < n; i++) {
		dst[i] = perm[i];
		src[i] = perm[n + below(nb - n)];
	}
	assert_ok(kvp_exec_copy_blocks(e, src, dst, n));
	for (uint32_t i = 0; i < n; i++)
		model_payload(md, (uint32_t)src[i], tmp + i * bb);
	for (uint32_t i = 0; i < n; i++)
		model_store(md, (uint32_t)dst[i], tmp + i * bb);
	free(perm);
	free(src);
	free(dst);
	free(tmp);
}

static void
op_write_tokens(struct kvp_exec *e, struct model *md)
{
	const struct kvp_kv_shape *s = &md->s;
	uint64_t nslots = (uint64_t)s->num_blocks * s->block_size;
	uint32_t n = below((uint32_t)(nslots < 64 ? nslots : 64) + 1);
	bool all = below(2);
	uint32_t layer = below(s->num_layers), nl = all ? s->num_layers : 1;
	size_t tok = (size_t)s->num_heads * s->head_size * md->es;
	int64_t *slots = malloc((n + 1) * sizeof(*slots));
	unsigned char *k = malloc(nl * n * tok + 1), *v = malloc(nl * n * tok + 1);

	/* Distinct slots, about one in five -1 (padding). */
	for (uint32_t i = 0; i < n; i++) {
		bool dup;
		do {
			slots[i] = below(5) == 0 ? KVP_PAD_SLOT : (int64_t)(next() % nslots);
			dup = false;
			for (uint32_t j = 0; j < i && slots[i] >= 0; j++)
				dup |= slots[j] == slots[i];
		} while (dup);
	}
	fill(k, nl * n * tok);
	fill(v, nl * n * tok);
	assert_ok(kvp_exec_write_tokens(e, all, layer, slots, n, k, v, nl * n * tok));
	for (uint32_t li = 0; li < nl; li++)
		for (uint32_t t = 0; t < n; t++) {
			if (slots[t] < 0)
				continue;
			uint32_t b = (uint32_t)(slots[t] / s->block_size), o = slots[t] % s->block_size;
			for (uint32_t h = 0; h < s->num_heads; h++)
				for (uint32_t d = 0; d < s->head_size; d++) {
					size_t in = (((size_t)li * n + t) * s->num_heads + h) * s->head_size + d;
					uint32_t l = all ? li : layer;
					memcpy(md->m + midx(md, l, 0, b, o, h, d) * md->es, k + in * md->es, md->es);
					memcpy(md->m + midx(md, l, 1, b, o, h, d) * md->es, v + in * md->es, md->es);
				}
		}
	free(slots);
	free(k);
	free(v);
}

/* Refused calls: each status, and the memory unchanged (compared by the caller). */
static void
op_refusals(struct kvp_exec *e, struct model *md)
{
	uint32_t nb = md->s.num_blocks;
	size_t bb = kvp_exec_block_bytes(e);
	unsigned char *buf = malloc(2 * bb);
	int32_t ids[2] = {0, (int32_t)nb}, same[2] = {1, 1}, neg[1] = {-1};
	fill(buf, 2 * bb);

	assert_status(kvp_exec_write_blocks(e, ids, 2, buf, 2 * bb), KVP_ERANGE);
	assert_status(kvp_exec_write_blocks(e, neg, 1, buf, bb), KVP_ERANGE);
	assert_status(kvp_exec_write_blocks(e, ids, 1, buf, bb - 1), KVP_EINVAL);
	assert_status(kvp_exec_write_blocks(e, ids, 1, buf, 2 * bb), KVP_EINVAL);
	if (nb >= 2)
		assert_status(kvp_exec_write_blocks(e, same, 2, buf, 2 * bb), KVP_EINVAL);
	assert_status(kvp_exec_read_blocks(e, ids, 2, buf, 2 * bb), KVP_ERANGE);
	assert_status(kvp_exec_read_blocks(e, ids, 1, buf, bb + 1), KVP_EINVAL);
	assert_status(kvp_exec_write_blocks(e, ids, 1, NULL, bb), KVP_EINVAL);

	int32_t src[2] = {1, 2}, dst[2] = {2, 3}, dup[2] = {3, 3}, far[2] = {3, (int32_t)nb};
	if (nb >= 4) {
		assert_status(kvp_exec_copy_blocks(e, src, dst, 2), KVP_EINVAL); /* 2 both ways */
		assert_status(kvp_exec_copy_blocks(e, src, dup, 2), KVP_EINVAL);
		assert_status(kvp_exec_copy_blocks(e, src, far, 2), KVP_ERANGE);
	}

	const struct kvp_kv_shape *s = &md->s;
	size_t tok = (size_t)s->num_heads * s->head_size * md->es;
	unsigned char *kv = malloc(2 * tok * s->num_layers);
	fill(kv, 2 * tok * s->num_layers);
	int64_t past[1] = {(int64_t)nb * s->block_size}, twice[2] = {0, 0}, pads[2] = {-1, -1};
	assert_status(kvp_exec_write_tokens(e, false, 0, past, 1, kv, kv, tok), KVP_ERANGE);
	assert_status(kvp_exec_write_tokens(e, false, 0, twice, 2, kv, kv, 2 * tok), KVP_EINVAL);
	assert_status(kvp_exec_write_tokens(e, false, s->num_layers, pads, 1, kv, kv, tok),
	              KVP_ERANGE);
	assert_status(kvp_exec_write_tokens(e, true, 0, pads, 1, kv, kv, tok * s->num_layers + 1),
	              KVP_EINVAL);
	/* Padding only: accepted, writes nothing. */
	assert_ok(kvp_exec_write_tokens(e, false, 0, pads, 2, kv, kv, 2 * tok));
	free(kv);
	free(buf);
}

struct shape_case {
	uint32_t num_blocks, block_size, layers, heads, head_size;
};

static const struct shape_case cases[] = {
	{1, 1, 1, 1, 1},     /* one block, one element */
	{2, 3, 2, 1, 5},     /* block size and head size not multiples of 8 */
	{9, 8, 3, 2, 8},
	{7, 16, 2, 4, 64},
	{33, 5, 1, 3, 12},
	{4, 32, 4, 2, 128},
};

/* Where the tests make regions: TMPDIR (a tmpfs is not needed), else /tmp. */
static const char *
region_dir(void)
{
	const char *d = getenv("TMPDIR");
	return d && d[0] ? d : "/tmp";
}

static void
cpu_matches_model(void **state)
{
	(void)state;
	for (uint32_t dt = KVP_DTYPE_FP16; dt <= KVP_DTYPE_FP32; dt++)
		for (uint32_t form = 0; form < 3 * (KVP_LAYOUT_HND + 1); form++)
			for (size_t c = 0; c < N_ELEMS(cases); c++) {
				/* form / 2: per-layer tensors, rows, rows in a shared region */
				uint32_t lay = form % 2;
				struct kvp_exec_config cfg = {
					.backend = KVP_EXEC_CPU,
					.shape = {cases[c].num_blocks, cases[c].block_size, cases[c].layers,
					          cases[c].heads, cases[c].head_size, dt, lay, form / 2 == 1},
					.region_dir = form / 2 == 2 ? region_dir() : NULL,
					.region_mode = 0600};
				struct kvp_exec *e = NULL;
				char why[256];
				struct model md = {.s = cfg.shape, .es = kvp_dtype_size(dt)};
				size_t total = (size_t)kvp_kv_block_bytes(&cfg.shape) * cfg.shape.num_blocks;
				if (form / 2 > 0)
					total = (kvp_kv_block_bytes(&cfg.shape) + KVP_ROW_ALIGN - 1) /
					        KVP_ROW_ALIGN * KVP_ROW_ALIGN * cfg.shape.num_blocks;

				assert_ok(kvp_exec_open(&cfg, &e, why, sizeof(why)));
				assert_string_equal(kvp_exec_backend_name(e), "cpu");
				assert_string_equal(kvp_exec_medium(e), "CPU");
				assert_int_equal(kvp_exec_memory_bytes(e), total);
				md.m = calloc(1, total);
				assert_non_null(md.m);
				compare_all(e, &md, "open (zeroed)");
				for (int step = 0; step < 40; step++) {
					switch (below(4)) {
					case 0:
						op_write_blocks(e, &md);
						compare_all(e, &md, "write_blocks");
						break;
					case 1:
						op_copy_blocks(e, &md);
						compare_all(e, &md, "copy_blocks");
						break;
					case 2:
						op_write_tokens(e, &md);
						compare_all(e, &md, "write_tokens");
						break;
					default:
						op_refusals(e, &md);
						compare_all(e, &md, "refused calls");
					}
				}
				/* Zero blocks is a valid, empty call for each operation. */
				assert_ok(kvp_exec_read_blocks(e, NULL, 0, NULL, 0));
				assert_ok(kvp_exec_write_blocks(e, NULL, 0, NULL, 0));
				assert_ok(kvp_exec_copy_blocks(e, NULL, NULL, 0));
				assert_ok(kvp_exec_write_tokens(e, true, 0, NULL, 0, NULL, NULL, 0));
				kvp_exec_close(e);
				free(md.m);
			}
}

/*
 * A region is a file another process maps: row i of a second mapping holds
 * block i's payload, writes through either mapping are seen by the other,
 * the mode is the one asked for, and close removes the file.
 */
static void
region_file(void **state)
{
	(void)state;
	struct kvp_exec_config cfg = {.backend = KVP_EXEC_CPU,
	                              .shape = {6, 4, 3, 2, 8, KVP_DTYPE_BF16, KVP_LAYOUT_HND},
	                              .region_dir = region_dir(), .region_name = "t",
	                              .region_mode = 0640};
	struct kvp_exec *e;
	struct kvp_exec_region r;
	struct stat st;
	char why[256], path[4096];

	assert_ok(kvp_exec_open(&cfg, &e, why, sizeof(why)));
	assert_ok(kvp_exec_region(e, &r));
	assert_int_equal(r.row_bytes, kvp_exec_block_bytes(e));
	assert_int_equal(r.row_stride, KVP_ROW_ALIGN); /* 3·2·4·2·8·2 = 768 bytes, padded */
	assert_int_equal(r.num_rows, 6);
	assert_int_equal(r.bytes, 6 * KVP_ROW_ALIGN);
	assert_int_equal(kvp_exec_memory_bytes(e), r.bytes);
	assert_non_null(strstr(r.path, "/kvpool-t-"));
	assert_int_equal(stat(r.path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0640);
	assert_int_equal((uint64_t)st.st_size, r.bytes);
	snprintf(path, sizeof(path), "%s", r.path);

	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	unsigned char *m = mmap(NULL, r.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	close(fd);
	size_t bb = r.row_bytes;
	unsigned char *in = malloc(2 * bb), *out = malloc(2 * bb);
	fill(in, 2 * bb);
	int32_t ids[2] = {4, 1};
	assert_ok(kvp_exec_write_blocks(e, ids, 2, in, 2 * bb));
	assert_memory_equal(m + 4 * r.row_stride, in, bb);
	assert_memory_equal(m + 1 * r.row_stride, in + bb, bb);
	/* a client's write through its own mapping is what the executor reads */
	memset(m + 2 * r.row_stride, 0x5a, bb);
	ids[0] = 2;
	assert_ok(kvp_exec_read_blocks(e, ids, 1, out, bb));
	for (size_t i = 0; i < bb; i++)
		assert_int_equal(out[i], 0x5a);
	munmap(m, r.bytes);
	kvp_exec_close(e);
	assert_int_equal(stat(path, &st), -1);

	/* without a region: KVP_ENOTSUP; a directory that is not there: a clear error */
	cfg.region_dir = NULL;
	assert_ok(kvp_exec_open(&cfg, &e, why, sizeof(why)));
	assert_status(kvp_exec_region(e, &r), KVP_ENOTSUP);
	kvp_exec_close(e);
	cfg.region_dir = "/nonexistent/kvpool";
	assert_true(kvp_exec_open(&cfg, &e, why, sizeof(why)) != KVP_OK);
	assert_non_null(strstr(why, "cannot create region"));
	free(in);
	free(out);
}

/* The sweep removes regions of processes that are gone, and only those. */
static void
region_sweep(void **state)
{
	(void)state;
	char dead[4096], live[4096], other[4096];
	unsigned removed = 99;
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0)
		_exit(0);
	assert_int_equal(waitpid(child, NULL, 0), child);
	snprintf(dead, sizeof(dead), "%s/kvpool-x-%ld-0123456789abcdef", region_dir(), (long)child);
	snprintf(live, sizeof(live), "%s/kvpool-x-%ld-0123456789abcdef", region_dir(),
	         (long)getppid());
	snprintf(other, sizeof(other), "%s/kvpool-x-%ld-notours", region_dir(), (long)child);
	for (int i = 0; i < 3; i++) {
		const char *f = i == 0 ? dead : i == 1 ? live : other;
		int fd = open(f, O_CREAT | O_WRONLY | O_TRUNC, 0600);
		assert_true(fd >= 0);
		close(fd);
	}
	assert_ok(kvp_exec_region_sweep(region_dir(), &removed));
	assert_true(removed >= 1);
	assert_int_equal(access(dead, F_OK), -1);
	assert_int_equal(access(live, F_OK), 0);
	assert_int_equal(access(other, F_OK), 0);
	unlink(live);
	unlink(other);
	assert_status(kvp_exec_region_sweep("/nonexistent/kvpool", NULL), KVP_EINVAL);
}

/* Many blocks in one call, repeats in a read. */
static void
many_blocks(void **state)
{
	(void)state;
	struct kvp_exec_config cfg = {.backend = KVP_EXEC_CPU,
	                              .shape = {1024, 16, 2, 2, 64, KVP_DTYPE_BF16, KVP_LAYOUT_NHD}};
	struct kvp_exec *e;
	assert_ok(kvp_exec_open(&cfg, &e, NULL, 0));
	size_t bb = kvp_exec_block_bytes(e), n = 1000;
	int32_t *ids = malloc(n * sizeof(*ids));
	unsigned char *in = malloc(n * bb), *out = malloc(n * bb);
	distinct_ids(ids, (uint32_t)n, 1024);
	fill(in, n * bb);
	assert_ok(kvp_exec_write_blocks(e, ids, n, in, n * bb));
	assert_ok(kvp_exec_read_blocks(e, ids, n, out, n * bb));
	assert_memory_equal(in, out, n * bb);
	/* A read may name a block twice. */
	int32_t twice[2] = {ids[5], ids[5]};
	assert_ok(kvp_exec_read_blocks(e, twice, 2, out, 2 * bb));
	assert_memory_equal(out, in + 5 * bb, bb);
	assert_memory_equal(out + bb, in + 5 * bb, bb);
	kvp_exec_close(e);
	free(ids);
	free(in);
	free(out);
}

static void
open_refusals(void **state)
{
	(void)state;
	struct kvp_exec_config cfg = {.backend = KVP_EXEC_CPU,
	                              .shape = {8, 16, 2, 2, 64, KVP_DTYPE_FP16, KVP_LAYOUT_NHD}};
	struct kvp_exec *e = NULL;
	char why[256];

	cfg.shape.num_heads = 0;
	assert_status(kvp_exec_open(&cfg, &e, why, sizeof(why)), KVP_EINVAL);
	assert_null(e);
	cfg.shape.num_heads = 2;
	cfg.device = -1;
	assert_status(kvp_exec_open(&cfg, &e, why, sizeof(why)), KVP_EINVAL);
	cfg.device = 0;
	cfg.copy_threads = KVP_EXEC_MAX_COPY_THREADS + 1;
	assert_status(kvp_exec_open(&cfg, &e, why, sizeof(why)), KVP_EINVAL);
	assert_non_null(strstr(why, "copy threads"));
	cfg.copy_threads = 0;
	cfg.backend = (enum kvp_exec_backend)9;
	assert_status(kvp_exec_open(&cfg, &e, why, sizeof(why)), KVP_EINVAL);
	assert_status(kvp_exec_open(NULL, &e, why, sizeof(why)), KVP_EINVAL);

	/* auto always opens something; without a device it says why it chose cpu. */
	cfg.backend = KVP_EXEC_AUTO;
	assert_ok(kvp_exec_open(&cfg, &e, why, sizeof(why)));
	if (strcmp(kvp_exec_backend_name(e), "cpu") == 0)
		assert_non_null(strstr(why, "auto: using cpu"));
	else
		assert_string_equal(kvp_exec_medium(e), "GPU");
	struct kvp_exec_bench b;
	if (strcmp(kvp_exec_backend_name(e), "cpu") == 0)
		assert_status(kvp_exec_device_bench(e, 2, 1, &b), KVP_ENOTSUP);
	kvp_exec_close(e);
	kvp_exec_close(NULL);

	/* cuda without a device (or without cuda built in) is a clear status, not a crash. */
	cfg.backend = KVP_EXEC_CUDA;
	int rv = kvp_exec_open(&cfg, &e, why, sizeof(why));
	if (rv == KVP_OK) {
		kvp_exec_close(e);
	} else {
		assert_true(rv == KVP_ENODEVICE || rv == KVP_ENOTSUP);
		assert_true(strlen(why) > 0);
		print_message("cuda backend: %s (%s)\n", kvp_status_name(rv), why);
	}
}

static void
crc32c(void **state)
{
	(void)state;
	assert_int_equal(kvp_crc32c(0, "123456789", 9), 0xE3069283u);
	assert_int_equal(kvp_crc32c_portable(0, "123456789", 9), 0xE3069283u);
	assert_int_equal(kvp_crc32c(0, "", 0), 0);
	/* The fast path (three streams of 4 KiB) and the tables agree at every size class. */
	size_t cap = 100000;
	unsigned char *b = malloc(cap + 16);
	fill(b, cap + 16);
	for (int i = 0; i < 200; i++) {
		size_t n = i < 100 ? (size_t)i : below((uint32_t)cap), off = below(16);
		uint32_t want = kvp_crc32c_portable(0, b + off, n);
		assert_int_equal(kvp_crc32c(0, b + off, n), want);
		/* Continuing across a split gives the same value. */
		size_t cut = n ? below((uint32_t)n) : 0;
		assert_int_equal(kvp_crc32c(kvp_crc32c(0, b + off, cut), b + off + cut, n - cut), want);
	}
	/* A flipped bit changes it. */
	uint32_t before = kvp_crc32c(0, b, 16384);
	b[1000] ^= 4;
	assert_true(kvp_crc32c(0, b, 16384) != before);
	free(b);
}

/* The cuda backend's staging copier, shared out over threads, against memcpy. */
static void
par_copy_matches_memcpy(void **state)
{
	(void)state;
	struct kvp_par_copy *pc = NULL;
	assert_status(kvp_par_copy_open(0, &pc), KVP_EINVAL);
	assert_status(kvp_par_copy_open(KVP_PAR_COPY_MAX_THREADS + 1, &pc), KVP_EINVAL);
	assert_status(kvp_par_copy_open(2, NULL), KVP_EINVAL);
	assert_null(pc);
	size_t cap = 9u << 20;
	unsigned char *src = malloc(cap), *dst = malloc(cap);
	fill(src, cap);
	static const unsigned threads[] = {1, 2, 4, 7};
	size_t m = KVP_PAR_COPY_MIN_SLICE;
	const size_t sizes[] = {0, 1, 63, 2 * m - 1, 2 * m, 2 * m + 1, 3 * m + 17, 8 * m - 64,
	                        cap - 13, cap};
	for (size_t t = 0; t < N_ELEMS(threads); t++) {
		assert_ok(kvp_par_copy_open(threads[t], &pc));
		assert_int_equal(kvp_par_copy_threads(pc), threads[t]);
		for (int round = 0; round < 3; round++) /* the helpers are reused */
			for (size_t i = 0; i < N_ELEMS(sizes); i++) {
				size_t off = below(16), n = sizes[i] < cap - off ? sizes[i] : cap - off;
				memset(dst, 0xee, cap);
				kvp_par_copy(pc, dst + off, src + off, n);
				if (memcmp(dst + off, src + off, n) != 0)
					fail_msg("%u threads, %zu bytes at %zu: copy differs", threads[t], n, off);
				/* Nothing outside the range was written. */
				for (size_t j = 0; j < off; j++)
					assert_int_equal(dst[j], 0xee);
				if (off + n < cap)
					assert_int_equal(dst[off + n], 0xee);
			}
		kvp_par_copy_close(pc);
		pc = NULL;
	}
	kvp_par_copy(NULL, dst, src, 100); /* no copier: the caller copies */
	assert_memory_equal(dst, src, 100);
	kvp_par_copy_close(NULL);
	free(src);
	free(dst);
}

int
main(void)
{
	const char *env = getenv("KVP_TEST_SEED");
	uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
	rng = seed;
	fprintf(stderr, "test_executor: seed %llu (KVP_TEST_SEED=%llu repeats this run)\n",
	        (unsigned long long)seed, (unsigned long long)seed);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(cpu_matches_model),
		cmocka_unit_test(many_blocks),
		cmocka_unit_test(region_file),
		cmocka_unit_test(region_sweep),
		cmocka_unit_test(open_refusals),
		cmocka_unit_test(crc32c),
		cmocka_unit_test(par_copy_matches_memcpy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
