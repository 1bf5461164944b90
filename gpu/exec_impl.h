/* SPDX-License-Identifier: Apache-2.0 */
/*
 * exec_impl.h: what a backend implements (internal to gpu/).
 *
 * executor.c validates every argument before calling a backend, so an op
 * sees only in-range ids, exact lengths and no conflicting destinations.
 * An op returns a kvp status and may leave a detail in e->err.
 */
#ifndef KVP_EXEC_IMPL_H
#define KVP_EXEC_IMPL_H

#include "gpu/executor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvp_exec_ops {
	const char *name;   /* "cpu", "cuda" */
	const char *medium; /* "CPU", "GPU" */
	/* Allocates mem_bytes of zeroed KV memory for e->shape. */
	int (*open)(struct kvp_exec *e, int device);
	void (*close)(struct kvp_exec *e);
	int (*read_blocks)(struct kvp_exec *e, const int32_t *ids, size_t n, void *dst);
	int (*write_blocks)(struct kvp_exec *e, const int32_t *ids, size_t n, const void *src);
	int (*copy_blocks)(struct kvp_exec *e, const int32_t *src, const int32_t *dst, size_t n);
	/* k, v: [nlayers][n][heads][head_size] for layers layer0 .. layer0+nlayers-1. */
	int (*write_tokens)(struct kvp_exec *e, uint32_t layer0, uint32_t nlayers,
	                    const int64_t *slots, size_t n, const void *k, const void *v);
	int (*bench)(struct kvp_exec *e, uint32_t n, int iters, struct kvp_exec_bench *out);
};

struct kvp_exec {
	const struct kvp_exec_ops *ops;
	struct kvp_kv_shape shape;
	struct kvp_kv_strides st;
	uint64_t block_bytes;  /* one block's payload */
	uint64_t chunk_bytes;  /* one block of one layer's K (or V) */
	uint64_t mem_bytes;
	unsigned copy_threads; /* cuda's staging copiers, 1.. */
	void *impl;            /* the backend's state (cpu: the memory) */
	const struct kvp_exec_config *cfg; /* during open only */
	char region_path[4096]; /* cpu with a region: its file; else "" */
	int region_fd;          /* a kept region's file, open for its lock; else -1 */
	bool region_kept;       /* a kept region's bytes are an earlier life's */
	char err[256];
};

extern const struct kvp_exec_ops kvp_exec_cpu_ops;
/* The CUDA backend, or NULL when it is not built in. */
const struct kvp_exec_ops *kvp_exec_cuda_ops(void);
int kvp_cuda_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes);

#ifdef __cplusplus
}
#endif

#endif /* KVP_EXEC_IMPL_H */
