/* SPDX-License-Identifier: Apache-2.0 */
/* The executor's front: shapes, argument checks, backend choice. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/exec_impl.h"
#include "common/kvp_status.h"

static void
say(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;
	if (why == NULL || len == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

int
kvp_kv_shape_check(const struct kvp_kv_shape *s, char *why, size_t why_len)
{
	if (s == NULL)
		return say(why, why_len, "no shape"), KVP_EINVAL;
	if (s->num_blocks == 0 || s->block_size == 0 || s->num_layers == 0 || s->num_heads == 0 ||
	    s->head_size == 0)
		return say(why, why_len, "blocks, block size, layers, heads and head size must be > 0"),
		       KVP_EINVAL;
	if (s->block_size > KVP_KV_MAX_BLOCK_SIZE || s->num_layers > KVP_KV_MAX_LAYERS ||
	    s->num_heads > KVP_KV_MAX_HEADS || s->head_size > KVP_KV_MAX_HEAD_SIZE)
		return say(why, why_len, "shape past the limits (block size %u, layers %u, heads %u, "
		                         "head size %u)",
		           KVP_KV_MAX_BLOCK_SIZE, KVP_KV_MAX_LAYERS, KVP_KV_MAX_HEADS,
		           KVP_KV_MAX_HEAD_SIZE),
		       KVP_EINVAL;
	if (s->dtype > KVP_DTYPE_FP32 || s->layout > KVP_LAYOUT_HND)
		return say(why, why_len, "unknown dtype or layout"), KVP_EINVAL;
	/* block_bytes <= 2^63 / num_blocks: every offset fits in 64 bits. */
	uint64_t bb = kvp_kv_block_bytes(s) + KVP_ROW_ALIGN; /* a row's padding included */
	if (s->rows > 1)
		return say(why, why_len, "rows is 0 or 1"), KVP_EINVAL;
	if (bb > (UINT64_MAX >> 2) / s->num_blocks)
		return say(why, why_len, "the KV memory would exceed 2^62 bytes"), KVP_EINVAL;
	return KVP_OK;
}

uint64_t
kvp_kv_block_bytes(const struct kvp_kv_shape *s)
{
	/* Each factor is at most 2^16 and layers x heads x head_size x 2 x 4 < 2^36. */
	return (uint64_t)s->num_layers * 2 * s->block_size * s->num_heads * s->head_size *
	       kvp_dtype_size(s->dtype);
}

uint64_t
kvp_kv_block_stride(const struct kvp_kv_shape *s)
{
	struct kvp_kv_strides st = kvp_kv_strides_of(s);
	return s->rows ? st.block_stride * st.elem_bytes : kvp_kv_block_bytes(s);
}

int
kvp_kv_fit_blocks(const struct kvp_kv_shape *s, uint64_t budget, uint32_t *num_blocks)
{
	struct kvp_kv_shape one;
	if (s == NULL || num_blocks == NULL)
		return KVP_EINVAL;
	one = *s;
	one.num_blocks = 1;
	if (kvp_kv_shape_check(&one, NULL, 0) != KVP_OK)
		return KVP_EINVAL;
	uint64_t page = (uint64_t)one.block_size * one.num_heads * one.head_size * 2 *
	                kvp_dtype_size(one.dtype);
	uint64_t n = one.rows ? budget / kvp_kv_block_stride(&one) : budget / page / one.num_layers;
	if (n < 2) /* the null block and at least one usable block */
		return KVP_ENOSPACE;
	*num_blocks = n > (1u << 30) ? (1u << 30) : (uint32_t)n;
	return KVP_OK;
}

static const char *const dtype_names[] = {"fp16", "bf16", "fp32"};
static const char *const layout_names[] = {"nhd", "hnd"};
static const char *const backend_names[] = {"cpu", "cuda", "auto"};

static int
lookup(const char *s, const char *const *names, uint32_t n, uint32_t *out)
{
	if (s == NULL || out == NULL)
		return -1;
	for (uint32_t i = 0; i < n; i++)
		if (strcmp(s, names[i]) == 0)
			return *out = i, 0;
	return -1;
}

int
kvp_dtype_parse(const char *s, uint32_t *out)
{
	return lookup(s, dtype_names, 3, out);
}

int
kvp_cache_layout_parse(const char *s, uint32_t *out)
{
	return lookup(s, layout_names, 2, out);
}

int
kvp_exec_backend_parse(const char *s, enum kvp_exec_backend *out)
{
	uint32_t v;
	if (out == NULL || lookup(s, backend_names, 3, &v) != 0)
		return -1;
	*out = (enum kvp_exec_backend)v;
	return 0;
}

const char *
kvp_dtype_name(uint32_t dtype)
{
	return dtype <= KVP_DTYPE_FP32 ? dtype_names[dtype] : "?";
}

const char *
kvp_cache_layout_name(uint32_t layout)
{
	return layout <= KVP_LAYOUT_HND ? layout_names[layout] : "?";
}

/* KVP_EXEC_COPY_THREADS, or half the online CPUs if that is fewer (at least 1). */
static unsigned
default_copy_threads(void)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	if (cpus < 2)
		return 1;
	return cpus / 2 < (long)KVP_EXEC_COPY_THREADS ? (unsigned)(cpus / 2) : KVP_EXEC_COPY_THREADS;
}

static int
try_open(const struct kvp_exec_ops *ops, const struct kvp_exec_config *cfg, struct kvp_exec **out,
         char *why, size_t why_len)
{
	struct kvp_exec *e = calloc(1, sizeof(*e));
	int rv;
	if (e == NULL)
		return say(why, why_len, "out of memory"), KVP_ENOMEM;
	e->ops = ops;
	e->region_fd = -1;
	e->shape = cfg->shape;
	if (cfg->region_dir != NULL && ops == &kvp_exec_cpu_ops)
		e->shape.rows = 1;
	e->st = kvp_kv_strides_of(&e->shape);
	e->block_bytes = kvp_kv_block_bytes(&e->shape);
	e->chunk_bytes = e->st.block_elems * e->st.elem_bytes;
	e->mem_bytes = kvp_kv_block_stride(&e->shape) * e->shape.num_blocks;
	e->cfg = cfg;
	e->copy_threads = cfg->copy_threads ? cfg->copy_threads : default_copy_threads();
	rv = ops->open(e, cfg->device);
	e->cfg = NULL; /* the caller's, valid only during open */
	if (rv != KVP_OK) {
		say(why, why_len, "%s executor: %s", ops->name,
		    e->err[0] ? e->err : kvp_strerror(rv));
		free(e);
		return rv;
	}
	*out = e;
	return KVP_OK;
}

int
kvp_exec_open(const struct kvp_exec_config *cfg, struct kvp_exec **out, char *why, size_t why_len)
{
	const struct kvp_exec_ops *cuda = kvp_exec_cuda_ops();
	char reason[256];
	int rv;

	say(why, why_len, "%s", "");
	if (cfg == NULL || out == NULL)
		return say(why, why_len, "no configuration"), KVP_EINVAL;
	if ((rv = kvp_kv_shape_check(&cfg->shape, why, why_len)) != KVP_OK)
		return rv;
	if (cfg->device < 0)
		return say(why, why_len, "device ordinal %d < 0", cfg->device), KVP_EINVAL;
	if (cfg->copy_threads > KVP_EXEC_MAX_COPY_THREADS)
		return say(why, why_len, "%u copy threads (at most %u)", cfg->copy_threads,
		           KVP_EXEC_MAX_COPY_THREADS),
		       KVP_EINVAL;
	switch (cfg->backend) {
	case KVP_EXEC_CPU:
		return try_open(&kvp_exec_cpu_ops, cfg, out, why, why_len);
	case KVP_EXEC_CUDA:
		if (cuda == NULL)
			return say(why, why_len, "cuda executor: not built in (no nvcc at build time)"),
			       KVP_ENOTSUP;
		return try_open(cuda, cfg, out, why, why_len);
	case KVP_EXEC_AUTO:
		if (cuda == NULL) {
			snprintf(reason, sizeof(reason), "cuda not built in");
		} else {
			rv = try_open(cuda, cfg, out, reason, sizeof(reason));
			if (rv == KVP_OK)
				return say(why, why_len, "auto: using cuda device %d", cfg->device), KVP_OK;
			if (rv != KVP_ENODEVICE)
				return say(why, why_len, "auto: %s", reason), rv;
		}
		rv = try_open(&kvp_exec_cpu_ops, cfg, out, why, why_len);
		if (rv == KVP_OK)
			say(why, why_len, "auto: using cpu (%s)", reason);
		return rv;
	}
	return say(why, why_len, "unknown backend %d", (int)cfg->backend), KVP_EINVAL;
}

void
kvp_exec_close(struct kvp_exec *e)
{
	if (e == NULL)
		return;
	e->ops->close(e);
	free(e);
}

const char *
kvp_exec_backend_name(const struct kvp_exec *e)
{
	return e ? e->ops->name : "none";
}

const char *
kvp_exec_medium(const struct kvp_exec *e)
{
	return e ? e->ops->medium : "";
}

int
kvp_exec_region(const struct kvp_exec *e, struct kvp_exec_region *out)
{
	if (e == NULL || out == NULL || e->region_path[0] == '\0')
		return KVP_ENOTSUP;
	*out = (struct kvp_exec_region){
		.path = e->region_path,
		.bytes = e->mem_bytes,
		.row_bytes = e->block_bytes,
		.row_stride = kvp_kv_block_stride(&e->shape),
		.num_rows = e->shape.num_blocks,
		.base = e->impl,
		.kept = e->region_kept,
	};
	return KVP_OK;
}

const struct kvp_kv_shape *
kvp_exec_shape(const struct kvp_exec *e)
{
	return e ? &e->shape : NULL;
}

uint64_t
kvp_exec_block_bytes(const struct kvp_exec *e)
{
	return e ? e->block_bytes : 0;
}

uint64_t
kvp_exec_memory_bytes(const struct kvp_exec *e)
{
	return e ? e->mem_bytes : 0;
}

const char *
kvp_exec_last_error(const struct kvp_exec *e)
{
	return e ? e->err : "";
}

/* ---- argument checks ---- */

static int
fail(struct kvp_exec *e, int rv, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->err, sizeof(e->err), fmt, ap);
	va_end(ap);
	return rv;
}

static int
check_ids(struct kvp_exec *e, const int32_t *ids, size_t n)
{
	if (n > 0 && ids == NULL)
		return fail(e, KVP_EINVAL, "no ids");
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= e->shape.num_blocks)
			return fail(e, KVP_ERANGE, "block id %d outside 0..%u", ids[i],
			            e->shape.num_blocks - 1);
	return KVP_OK;
}

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* KVP_OK if no non-negative value occurs twice among vals[0..n). */
static int
check_unique(struct kvp_exec *e, const int64_t *vals, size_t n, const char *what)
{
	int64_t *s;
	int rv = KVP_OK;
	if (n < 2)
		return KVP_OK;
	if ((s = malloc(n * sizeof(*s))) == NULL)
		return fail(e, KVP_ENOMEM, "out of memory");
	memcpy(s, vals, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_i64);
	for (size_t i = 1; i < n; i++)
		if (s[i] >= 0 && s[i] == s[i - 1]) {
			rv = fail(e, KVP_EINVAL, "%s %lld occurs twice", what, (long long)s[i]);
			break;
		}
	free(s);
	return rv;
}

/* KVP_OK if ids[0..n) are distinct. */
static int
check_unique_ids(struct kvp_exec *e, const int32_t *ids, size_t n, const char *what)
{
	int64_t *v;
	int rv;
	if (n < 2)
		return KVP_OK;
	if ((v = malloc(n * sizeof(*v))) == NULL)
		return fail(e, KVP_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		v[i] = ids[i];
	rv = check_unique(e, v, n, what);
	free(v);
	return rv;
}

static int
check_len(struct kvp_exec *e, const void *buf, size_t len, size_t n)
{
	if (n > 0 && buf == NULL)
		return fail(e, KVP_EINVAL, "no buffer");
	if (n > SIZE_MAX / e->block_bytes || len != n * e->block_bytes)
		return fail(e, KVP_EINVAL, "payload of %zu bytes for %zu blocks of %llu bytes", len, n,
		            (unsigned long long)e->block_bytes);
	return KVP_OK;
}

int
kvp_exec_read_blocks(struct kvp_exec *e, const int32_t *ids, size_t n, void *dst, size_t dst_len)
{
	int rv;
	if (e == NULL)
		return KVP_EINVAL;
	e->err[0] = '\0';
	if ((rv = check_ids(e, ids, n)) || (rv = check_len(e, dst, dst_len, n)))
		return rv;
	return n ? e->ops->read_blocks(e, ids, n, dst) : KVP_OK;
}

int
kvp_exec_write_blocks(struct kvp_exec *e, const int32_t *ids, size_t n, const void *src,
                      size_t src_len)
{
	int rv;
	if (e == NULL)
		return KVP_EINVAL;
	e->err[0] = '\0';
	if ((rv = check_ids(e, ids, n)) || (rv = check_len(e, src, src_len, n)) ||
	    (rv = check_unique_ids(e, ids, n, "destination block")))
		return rv;
	return n ? e->ops->write_blocks(e, ids, n, src) : KVP_OK;
}

int
kvp_exec_copy_blocks(struct kvp_exec *e, const int32_t *src, const int32_t *dst, size_t n)
{
	int rv;
	if (e == NULL)
		return KVP_EINVAL;
	e->err[0] = '\0';
	if ((rv = check_ids(e, src, n)) || (rv = check_ids(e, dst, n)))
		return rv;
	/*
	 * Sources may repeat; destinations may not, nor be a source: the distinct
	 * sources followed by the destinations must be distinct.
	 */
	if (n > 0) {
		int64_t *v = malloc(2 * n * sizeof(*v));
		size_t u = 0;
		if (v == NULL)
			return fail(e, KVP_ENOMEM, "out of memory");
		for (size_t i = 0; i < n; i++)
			v[i] = src[i];
		qsort(v, n, sizeof(*v), cmp_i64);
		for (size_t i = 0; i < n; i++)
			if (u == 0 || v[u - 1] != v[i])
				v[u++] = v[i];
		for (size_t i = 0; i < n; i++)
			v[u++] = dst[i];
		rv = check_unique(e, v, u, "block (as a destination)");
		free(v);
		if (rv != KVP_OK)
			return rv;
	}
	return n ? e->ops->copy_blocks(e, src, dst, n) : KVP_OK;
}

int
kvp_exec_write_tokens(struct kvp_exec *e, bool all_layers, uint32_t layer, const int64_t *slots,
                      size_t n, const void *k, const void *v, size_t kv_len)
{
	uint64_t max_slot, want;
	uint32_t nl;
	int rv;

	if (e == NULL)
		return KVP_EINVAL;
	e->err[0] = '\0';
	if (!all_layers && layer >= e->shape.num_layers)
		return fail(e, KVP_ERANGE, "layer %u outside 0..%u", layer, e->shape.num_layers - 1);
	nl = all_layers ? e->shape.num_layers : 1;
	if (n > 0 && (slots == NULL || k == NULL || v == NULL))
		return fail(e, KVP_EINVAL, "no slot mapping, K or V");
	want = (uint64_t)nl * e->st.token_elems * e->st.elem_bytes;
	if (n > SIZE_MAX / want || kv_len != n * want)
		return fail(e, KVP_EINVAL, "K/V of %zu bytes for %zu tokens x %u layers (%llu each)",
		            kv_len, n, nl, (unsigned long long)(want / nl));
	max_slot = (uint64_t)e->shape.num_blocks * e->shape.block_size;
	for (size_t i = 0; i < n; i++)
		if (slots[i] >= 0 && (uint64_t)slots[i] >= max_slot)
			return fail(e, KVP_ERANGE, "slot %lld outside 0..%llu", (long long)slots[i],
			            (unsigned long long)(max_slot - 1));
	if ((rv = check_unique(e, slots, n, "slot")))
		return rv;
	return n ? e->ops->write_tokens(e, all_layers ? 0 : layer, nl, slots, n, k, v) : KVP_OK;
}

int
kvp_exec_device_bench(struct kvp_exec *e, uint32_t n, int iters, struct kvp_exec_bench *out)
{
	if (e == NULL || out == NULL || n == 0 || n > e->shape.num_blocks / 2 || iters <= 0)
		return KVP_EINVAL;
	if (e->ops->bench == NULL)
		return KVP_ENOTSUP;
	return e->ops->bench(e, n, iters, out);
}

int
kvp_exec_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
	if (device < 0 || free_bytes == NULL || total_bytes == NULL)
		return KVP_EINVAL;
	if (kvp_exec_cuda_ops() == NULL)
		return KVP_ENOTSUP;
	return kvp_cuda_device_memory(device, free_bytes, total_bytes);
}
