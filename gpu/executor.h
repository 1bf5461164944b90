/* SPDX-License-Identifier: Apache-2.0 */
/*
 * executor.h: the embedded executor, which owns a pool's paged KV memory
 * and moves block contents.
 *
 * The pool decides which block holds what; the executor holds the bytes.
 * Backends sit behind one ops table:
 *
 *   cpu   host memory (the reference, and kvpoold's default);
 *   cuda  device memory from cudaMalloc, one stream, pinned staging; built
 *         when CMake finds nvcc (KVP_CUDA=ON), otherwise opening it answers
 *         KVP_ENOTSUP;
 *   auto  cuda when a device is usable, otherwise cpu (why goes to `why`).
 *
 * Every operation takes host buffers and is one batched call: the CUDA
 * backend stages the buffer and runs one kernel launch per call, never a
 * loop of per-block copies. The memory layout and the transfer payload
 * format are in kv_layout.h.
 *
 * Every function validates all of its arguments before it touches memory:
 * a refused call writes nothing. Where we differ from vLLM on purpose:
 * duplicate destinations in one call (the same block twice in write_blocks
 * or as a copy destination, a block both copied from and to, the same slot
 * twice in write_tokens) are refused with KVP_EINVAL, since their result
 * would depend on thread order on a GPU; vLLM leaves it undefined.
 *
 * Thread-safety: one executor is used by one thread at a time (kvpoold
 * calls it under the pool's lock). Different executors are independent.
 */
#ifndef KVP_EXECUTOR_H
#define KVP_EXECUTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/crc32c.h"
#include "gpu/kv_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

enum kvp_exec_backend { KVP_EXEC_CPU = 0, KVP_EXEC_CUDA = 1, KVP_EXEC_AUTO = 2 };

struct kvp_exec_config {
	enum kvp_exec_backend backend;
	int device;                 /* CUDA device ordinal (cuda and auto) */
	struct kvp_kv_shape shape;
	/*
	 * cuda: threads (the caller's included) that copy payloads between the
	 * caller's memory and pinned staging, 1..KVP_EXEC_MAX_COPY_THREADS;
	 * 0 means KVP_EXEC_COPY_THREADS, or half the online CPUs if fewer. On an
	 * H100 host 1 thread moved 0.11-0.21 of pinned cudaMemcpy's bandwidth,
	 * 8 threads 0.38-0.84 (BENCHMARKS.md). The cpu backend ignores it.
	 */
	unsigned copy_threads;
	/*
	 * cpu: a shared region. With region_dir set, the KV memory is a file
	 * created there (O_EXCL, permission bits region_mode, its name
	 * "kvpool-<region_name>-<pid>-<random>"), every byte allocated up front
	 * (a full tmpfs is an error at open, never a SIGBUS later), mapped shared
	 * and laid out in rows (shape.rows is forced to 1), so same-host clients
	 * map it and move a block as one contiguous row. /dev/shm is tmpfs; a
	 * hugetlbfs mount gives huge pages. The file is removed at close. NULL:
	 * private memory, laid out as shape.rows says. cuda ignores it.
	 */
	const char *region_dir;
	const char *region_name;
	uint32_t region_mode;
	/*
	 * cpu with a region: keep it across lives (a pool's restart=warm). The
	 * file is "kvpool-<region_name>.region", locked (flock) while open so
	 * that no second process opens it, not removed at close; a file of the
	 * right size already there is mapped as it is (kvp_exec_region's kept),
	 * else it is made anew.
	 */
	bool region_keep;
};
#define KVP_EXEC_COPY_THREADS 8u
#define KVP_EXEC_MAX_COPY_THREADS 32u

struct kvp_exec;

/* Largest values a shape may have (the sizes must also fit in memory). */
#define KVP_KV_MAX_LAYERS 1024u
#define KVP_KV_MAX_HEADS 1024u
#define KVP_KV_MAX_HEAD_SIZE 4096u
#define KVP_KV_MAX_BLOCK_SIZE 65536u

/* Checks a shape: KVP_OK, or KVP_EINVAL with the reason in why (may be NULL). */
int kvp_kv_shape_check(const struct kvp_kv_shape *s, char *why, size_t why_len);

/* Bytes of one block's transfer payload: layers x 2 x block_size x heads x head_size x dtype. */
uint64_t kvp_kv_block_bytes(const struct kvp_kv_shape *s);
/* Memory per block: its payload, padded to KVP_ROW_ALIGN with rows. */
uint64_t kvp_kv_block_stride(const struct kvp_kv_shape *s);

/*
 * How many blocks fit in budget bytes, as vLLM sizes its cache:
 * page_size = block_size x heads x head_size x 2 x dtype_size per layer,
 * blocks = budget / page_size / layers (with rows: budget / the padded
 * row). num_blocks in s is ignored.
 */
int kvp_kv_fit_blocks(const struct kvp_kv_shape *s, uint64_t budget, uint32_t *num_blocks);

/* Parses "fp16" / "bf16" / "fp32", "nhd" / "hnd", "cpu" / "cuda" / "auto". 0 or -1. */
int kvp_dtype_parse(const char *s, uint32_t *out);
int kvp_cache_layout_parse(const char *s, uint32_t *out);
int kvp_exec_backend_parse(const char *s, enum kvp_exec_backend *out);
const char *kvp_dtype_name(uint32_t dtype);
const char *kvp_cache_layout_name(uint32_t layout);

/*
 * Opens an executor. KVP_OK; KVP_EINVAL (bad shape); KVP_ENOMEM (the memory
 * could not be had); KVP_ENODEVICE (cuda: no usable device); KVP_ENOTSUP
 * (cuda not built in). why (may be NULL) gets a sentence for the log: the
 * reason of a failure, or for auto which backend it picked and why.
 */
int kvp_exec_open(const struct kvp_exec_config *cfg, struct kvp_exec **out, char *why,
                  size_t why_len);
/* Frees the memory. NULL is a no-op. */
void kvp_exec_close(struct kvp_exec *e);

const char *kvp_exec_backend_name(const struct kvp_exec *e); /* "cpu" or "cuda" */
const char *kvp_exec_medium(const struct kvp_exec *e);       /* "CPU" or "GPU", as events say */
const struct kvp_kv_shape *kvp_exec_shape(const struct kvp_exec *e);
uint64_t kvp_exec_block_bytes(const struct kvp_exec *e);
uint64_t kvp_exec_memory_bytes(const struct kvp_exec *e);      /* the KV memory it holds */
/* A cpu executor's shared region: the file clients map and its rows. */
struct kvp_exec_region {
	const char *path;     /* valid until close */
	uint64_t bytes;       /* the file's size: num_rows x row_stride */
	uint64_t row_bytes;   /* one block's payload (kvp_exec_block_bytes) */
	uint64_t row_stride;  /* row i starts at i x row_stride (a multiple of KVP_ROW_ALIGN) */
	uint32_t num_rows;    /* the pool's blocks, row 0 the null block's */
	unsigned char *base;  /* the executor's own mapping */
	bool kept;            /* region_keep: the bytes are an earlier life's */
};
/* Fills *out: KVP_OK, or KVP_ENOTSUP for an executor without a region. */
int kvp_exec_region(const struct kvp_exec *e, struct kvp_exec_region *out);

/*
 * Removes the region files in dir that processes no longer running left
 * (a daemon killed before it could close), owned by this user; *removed
 * (may be NULL) gets how many. KVP_OK, or KVP_EINVAL if dir cannot be read.
 */
int kvp_exec_region_sweep(const char *dir, unsigned *removed);

/* The last failure's detail (a CUDA error string, say), or "". */
const char *kvp_exec_last_error(const struct kvp_exec *e);

/*
 * Gathers blocks ids[0..n) into dst, which must be exactly
 * n x block_bytes long (payload format in kv_layout.h). Repeats are allowed.
 * KVP_EINVAL (length), KVP_ERANGE (an id outside 0..num_blocks-1).
 */
int kvp_exec_read_blocks(struct kvp_exec *e, const int32_t *ids, size_t n, void *dst,
                         size_t dst_len);

/* Scatters src (n x block_bytes) into blocks ids[0..n). Repeated ids: KVP_EINVAL. */
int kvp_exec_write_blocks(struct kvp_exec *e, const int32_t *ids, size_t n, const void *src,
                          size_t src_len);

/*
 * Copies block src[i] to dst[i] (all layers, K and V) for i < n. A block
 * may be the source of several copies, but a destination only once and
 * never also a source in the same call (KVP_EINVAL).
 */
int kvp_exec_copy_blocks(struct kvp_exec *e, const int32_t *src, const int32_t *dst, size_t n);

/*
 * reshape_and_cache_flash: writes K and V of n tokens through the int64
 * slot mapping; a negative slot writes nothing. With all_layers, k and v
 * are [layers][n][heads][head_size], otherwise [n][heads][head_size] for
 * the one layer. kv_len is the byte length of each of k and v and must
 * match exactly. Slots past the pool: KVP_ERANGE; a slot twice: KVP_EINVAL.
 */
int kvp_exec_write_tokens(struct kvp_exec *e, bool all_layers, uint32_t layer,
                          const int64_t *slots, size_t n, const void *k, const void *v,
                          size_t kv_len);

/* Device-side kernel timings (the benchmark's GPU mode). */
struct kvp_exec_bench {
	double gather_gbps, scatter_gbps, copy_gbps, write_tokens_gbps, d2d_gbps;
	double h2d_pinned_gbps, d2h_pinned_gbps;     /* cudaMemcpy from / to pinned host memory */
	double h2d_pageable_gbps, d2h_pageable_gbps; /* ... and from / to malloc'd memory */
	uint64_t bytes;  /* moved per kernel call */
};
/*
 * Times each kernel on n blocks (device memory to device memory, no host
 * transfer) against cudaMemcpy device-to-device of the same bytes, and
 * cudaMemcpy of the same bytes between pinned (and pageable) host memory
 * and the device (the baselines for read_blocks and write_blocks).
 * KVP_ENOTSUP on the cpu backend.
 */
int kvp_exec_device_bench(struct kvp_exec *e, uint32_t n, int iters, struct kvp_exec_bench *out);

/*
 * Free and total memory of CUDA device `device` (for sizing a pool by a
 * fraction of free memory). KVP_ENODEVICE without one; KVP_ENOTSUP if cuda
 * is not built in.
 */
int kvp_exec_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- block tables and slot mapping (vLLM's block_table.py) ---- */

/*
 * Kernel block split: manager block size B, kernel block size kb. B must be
 * a multiple of kb (else KVP_EINVAL); *ratio = B / kb.
 */
int kvp_kernel_block_ratio(uint32_t block_size, uint32_t kernel_block_size, uint32_t *ratio);

/* Each manager id i becomes kernel ids i*m .. i*m+m-1. out holds n*m entries. */
int kvp_map_to_kernel_blocks(const int32_t *ids, size_t n, uint32_t m, int32_t *out,
                             size_t out_cap);

/* The inputs of compute_slot_mapping. */
struct kvp_slot_args {
	const int32_t *block_table;   /* [num_reqs][row_stride] */
	size_t row_stride;
	const uint32_t *row_len;      /* blocks used per row; NULL: row_stride each */
	size_t num_reqs;
	const int32_t *query_start_loc; /* [num_reqs + 1], non-decreasing, from 0 */
	const int64_t *positions;     /* [query_start_loc[num_reqs]] */
	uint32_t block_size;          /* the table's (kernel) block size */
	struct kvp_cp cp;             /* all zero: no context parallelism */
};

/*
 * Fills out[0..out_len) (max_num_batched_tokens entries): the slot of every
 * token, then KVP_PAD_SLOT to the end. A position past its row: KVP_ERANGE;
 * malformed arguments: KVP_EINVAL. Nothing is written on failure.
 */
int kvp_compute_slot_mapping(const struct kvp_slot_args *a, int64_t *out, size_t out_len);

#ifdef __cplusplus
}
#endif

#endif /* KVP_EXECUTOR_H */
