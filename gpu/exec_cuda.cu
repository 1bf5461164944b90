/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda backend: KV memory from cudaMalloc (never managed memory), one
 * non-blocking stream per executor, pinned host staging and device staging
 * buffers that grow to the largest call seen.
 *
 * Each operation is: host-to-device copies of its arguments (ids, slots,
 * payload) through the pinned buffer, one kernel launch, and for reads
 * device-to-host copies back; then a stream synchronise, so a call returns
 * with its bytes in place, as the cpu backend does. Payloads move in
 * chunks of STAGE_CHUNK, pipelined: while the copy engine carries chunk k,
 * the host copies chunk k+1 into (or k-1 out of) pinned staging, with
 * copy_threads threads (par_copy.h). One core copying pageable memory was
 * measured at a sixth of the link's pinned bandwidth on an H100 host. Every CUDA call and
 * every launch is checked and becomes a kvp status; nothing here exits.
 *
 * The index math is kv_layout.h's, the same functions the cpu backend and
 * its tests use.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "gpu/exec_impl.h"
#include "gpu/par_copy.h"
#include "common/kvp_status.h"

#define THREADS 256
#define STAGE_CHUNK (4u << 20)

struct cuda_state {
	int device;
	cudaStream_t stream;
	unsigned char *cache;   /* mem_bytes of KV memory */
	unsigned char *d_stage; /* device staging */
	size_t d_cap;
	unsigned char *h_stage; /* pinned host staging */
	size_t h_cap;
	cudaEvent_t chunk_done[2]; /* device-to-host pipelining */
	struct kvp_par_copy *pc;   /* host <-> staging copies */
};

static struct cuda_state *
state(struct kvp_exec *e)
{
	return (struct cuda_state *)e->impl;
}

static int
status_of(cudaError_t err)
{
	switch (err) {
	case cudaSuccess:
		return KVP_OK;
	case cudaErrorMemoryAllocation:
		return KVP_ENOMEM;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice:
	case cudaErrorDevicesUnavailable:
	case cudaErrorSystemDriverMismatch:
	case cudaErrorCompatNotSupportedOnDevice:
	case cudaErrorNoKernelImageForDevice:
		return KVP_ENODEVICE;
	default:
		return KVP_EINTERNAL;
	}
}

/*
 * Records a failed CUDA call. The runtime also keeps a non-sticky error
 * (a failed cudaMalloc, say) as the thread's "last error" until someone
 * reads it, and launched() reads it after every kernel launch: left there,
 * one refused allocation would fail the next, unrelated launch on this
 * thread (seen on an H100: a pool refused for its size, then the next
 * pool's first kernel answered ENOMEM). So it is consumed here.
 */
static int
fail_cuda(struct kvp_exec *e, cudaError_t err, const char *what)
{
	snprintf(e->err, sizeof(e->err), "%s: %s (%s)", what, cudaGetErrorString(err),
	         cudaGetErrorName(err));
	(void)cudaGetLastError();
	return status_of(err);
}

#define CK(e, call)                                          \
	do {                                                 \
		cudaError_t err_ = (call);                   \
		if (err_ != cudaSuccess)                     \
			return fail_cuda((e), err_, #call);  \
	} while (0)

/* ---- kernels ---- */

/*
 * Copies `bytes` bytes, the threads of one CUDA block striding through them
 * in the widest unit that the two addresses and the length allow.
 */
__device__ static void
copy_chunk(unsigned char *dst, const unsigned char *src, uint64_t bytes)
{
	uintptr_t a = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)bytes;
	if (a % 16 == 0) {
		uint4 *d = (uint4 *)dst;
		const uint4 *s = (const uint4 *)src;
		for (uint64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
			d[i] = s[i];
	} else if (a % 4 == 0) {
		uint32_t *d = (uint32_t *)dst;
		const uint32_t *s = (const uint32_t *)src;
		for (uint64_t i = threadIdx.x; i < bytes / 4; i += blockDim.x)
			d[i] = s[i];
	} else {
		for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x)
			dst[i] = src[i];
	}
}

/*
 * gather_kernel (read_blocks). Grid (n, 2*layers), block THREADS: CUDA
 * block (i, 2*l+kv) copies chunk (l, kv) of block ids[i] to the payload.
 *   cache  [layers][2][num_blocks][block_elems] elements of st.elem_bytes
 *   ids    [n] int32, each in 0..num_blocks-1 (checked on the host)
 *   out    [n][layers][2][block_elems] (the transfer payload)
 */
__global__ void
gather_kernel(const unsigned char *cache, const int32_t *ids, unsigned char *out,
              struct kvp_kv_strides st, uint32_t layers)
{
	uint64_t i = blockIdx.x;
	uint32_t l = blockIdx.y / 2, kv = blockIdx.y % 2;
	copy_chunk(out + kvp_payload_offset(&st, layers, i, l, kv) * st.elem_bytes,
	           cache + kvp_chunk_offset(&st, l, kv, (uint64_t)ids[i]) * st.elem_bytes,
	           st.block_elems * st.elem_bytes);
}

/*
 * scatter_kernel (write_blocks). Grid (n, 2*layers), block THREADS; the
 * reverse of gather_kernel. ids are distinct (checked on the host).
 *   in     [n][layers][2][block_elems]
 *   cache  [layers][2][num_blocks][block_elems]
 */
__global__ void
scatter_kernel(unsigned char *cache, const int32_t *ids, const unsigned char *in,
               struct kvp_kv_strides st, uint32_t layers)
{
	uint64_t i = blockIdx.x;
	uint32_t l = blockIdx.y / 2, kv = blockIdx.y % 2;
	copy_chunk(cache + kvp_chunk_offset(&st, l, kv, (uint64_t)ids[i]) * st.elem_bytes,
	           in + kvp_payload_offset(&st, layers, i, l, kv) * st.elem_bytes,
	           st.block_elems * st.elem_bytes);
}

/*
 * copy_kernel (copy_blocks). Grid (n, 2*layers), block THREADS: chunk
 * (l, kv) of block pairs[i] to block pairs[n + i]. Destinations are distinct
 * and never sources (checked on the host), so CUDA blocks do not race.
 *   cache  [layers][2][num_blocks][block_elems]
 *   pairs  [2][n] int32: sources, then destinations
 */
__global__ void
copy_kernel(unsigned char *cache, const int32_t *pairs, uint64_t n, struct kvp_kv_strides st)
{
	uint64_t i = blockIdx.x;
	uint32_t l = blockIdx.y / 2, kv = blockIdx.y % 2;
	copy_chunk(cache + kvp_chunk_offset(&st, l, kv, (uint64_t)pairs[n + i]) * st.elem_bytes,
	           cache + kvp_chunk_offset(&st, l, kv, (uint64_t)pairs[i]) * st.elem_bytes,
	           st.block_elems * st.elem_bytes);
}

/*
 * write_tokens_kernel (reshape_and_cache_flash). Grid (n, nlayers), block
 * min(heads*head_size, THREADS): CUDA block (t, li) writes token t's K and
 * V of layer layer0+li to its slot; a negative slot writes nothing. T is
 * the element's storage type (uint16_t for fp16/bf16, uint32_t for fp32):
 * no conversion happens, the cache has the input's dtype.
 *   cache  [layers][2][num_blocks][block_elems] of T
 *   slots  [n] int64, distinct when >= 0, each < num_blocks*block_size
 *   k, v   [nlayers][n][heads][head_size] of T
 */
template <typename T>
__global__ void
write_tokens_kernel(T *cache, const int64_t *slots, const T *k, const T *v,
                    struct kvp_kv_strides st, uint32_t block_size, uint32_t head_size,
                    uint32_t layer0, uint64_t n)
{
	uint64_t t = blockIdx.x;
	uint32_t li = blockIdx.y;
	int64_t slot = slots[t];
	if (slot < 0)
		return;
	uint64_t b = kvp_slot_block(slot, block_size);
	uint32_t o = kvp_slot_offset(slot, block_size);
	uint64_t in = ((uint64_t)li * n + t) * st.token_elems;
	for (uint64_t i = threadIdx.x; i < st.token_elems; i += blockDim.x) {
		uint32_t h = (uint32_t)(i / head_size), d = (uint32_t)(i % head_size);
		cache[kvp_elem_offset(&st, layer0 + li, 0, b, o, h, d)] = k[in + i];
		cache[kvp_elem_offset(&st, layer0 + li, 1, b, o, h, d)] = v[in + i];
	}
}

/* ---- host side ---- */

static int
grow(struct kvp_exec *e, size_t need)
{
	struct cuda_state *s = state(e);
	if (need > s->d_cap) {
		if (s->d_stage)
			CK(e, cudaFree(s->d_stage));
		s->d_stage = NULL;
		s->d_cap = 0;
		CK(e, cudaMalloc((void **)&s->d_stage, need));
		s->d_cap = need;
	}
	if (need > s->h_cap) {
		if (s->h_stage)
			CK(e, cudaFreeHost(s->h_stage));
		s->h_stage = NULL;
		s->h_cap = 0;
		CK(e, cudaHostAlloc((void **)&s->h_stage, need, cudaHostAllocDefault));
		s->h_cap = need;
	}
	return KVP_OK;
}

static size_t
align16(size_t n)
{
	return (n + 15) & ~(size_t)15;
}

static int
launched(struct kvp_exec *e, const char *name)
{
	cudaError_t err = cudaGetLastError();
	if (err != cudaSuccess)
		return fail_cuda(e, err, name);
	return KVP_OK;
}

static int
wait_stream(struct kvp_exec *e)
{
	CK(e, cudaStreamSynchronize(state(e)->stream));
	return KVP_OK;
}

static int
cuda_open(struct kvp_exec *e, int device)
{
	struct cuda_state *s;
	int count = 0;
	cudaError_t err = cudaGetDeviceCount(&count);
	if (err != cudaSuccess) {
		fail_cuda(e, err, "cudaGetDeviceCount");
		return KVP_ENODEVICE;
	}
	if (device >= count) {
		snprintf(e->err, sizeof(e->err), "no CUDA device %d (%d found)", device, count);
		return KVP_ENODEVICE;
	}
	if ((s = (struct cuda_state *)calloc(1, sizeof(*s))) == NULL)
		return KVP_ENOMEM;
	s->device = device;
	e->impl = s;
	int rv = KVP_OK;
	if ((err = cudaSetDevice(device)) != cudaSuccess ||
	    (err = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess ||
	    (err = cudaEventCreateWithFlags(&s->chunk_done[0], cudaEventDisableTiming)) !=
	            cudaSuccess ||
	    (err = cudaEventCreateWithFlags(&s->chunk_done[1], cudaEventDisableTiming)) !=
	            cudaSuccess ||
	    (err = cudaMalloc((void **)&s->cache, e->mem_bytes)) != cudaSuccess ||
	    (err = cudaMemsetAsync(s->cache, 0, e->mem_bytes, s->stream)) != cudaSuccess ||
	    (err = cudaStreamSynchronize(s->stream)) != cudaSuccess)
		rv = fail_cuda(e, err, "opening the device memory");
	else if ((rv = kvp_par_copy_open(e->copy_threads, &s->pc)) != KVP_OK)
		snprintf(e->err, sizeof(e->err), "cannot start %u copy threads", e->copy_threads);
	if (rv != KVP_OK) {
		if (s->cache)
			cudaFree(s->cache);
		for (int i = 0; i < 2; i++)
			if (s->chunk_done[i])
				cudaEventDestroy(s->chunk_done[i]);
		if (s->stream)
			cudaStreamDestroy(s->stream);
		free(s);
		e->impl = NULL;
	}
	return rv;
}

static void
cuda_close(struct kvp_exec *e)
{
	struct cuda_state *s = state(e);
	if (s == NULL)
		return;
	cudaSetDevice(s->device);
	cudaStreamSynchronize(s->stream);
	cudaFree(s->cache);
	cudaFree(s->d_stage);
	cudaFreeHost(s->h_stage);
	cudaEventDestroy(s->chunk_done[0]);
	cudaEventDestroy(s->chunk_done[1]);
	cudaStreamDestroy(s->stream);
	kvp_par_copy_close(s->pc);
	free(s);
}

/*
 * Fails a call whose copies may still be queued: waits for the stream, so
 * the next call may reuse the staging buffers, then returns rv.
 */
static int
drained(struct kvp_exec *e, int rv)
{
	(void)cudaStreamSynchronize(state(e)->stream);
	(void)cudaGetLastError();
	return rv;
}

/*
 * len bytes from the caller's src to h_stage + off, and on to d_stage +
 * off, chunk by chunk: each chunk's transfer is queued as soon as it is
 * staged, so the link carries chunk k while the host stages chunk k+1.
 */
static int
stage_payload(struct kvp_exec *e, size_t off, const void *src, size_t len)
{
	struct cuda_state *s = state(e);
	for (size_t at = 0; at < len; at += STAGE_CHUNK) {
		size_t c = len - at < STAGE_CHUNK ? len - at : STAGE_CHUNK;
		kvp_par_copy(s->pc, s->h_stage + off + at, (const unsigned char *)src + at, c);
		cudaError_t err = cudaMemcpyAsync(s->d_stage + off + at, s->h_stage + off + at, c,
		                                  cudaMemcpyHostToDevice, s->stream);
		if (err != cudaSuccess)
			return drained(e, fail_cuda(e, err, "cudaMemcpyAsync (host to device)"));
	}
	return KVP_OK;
}

/*
 * len bytes from d_stage + off back to the caller's dst through h_stage +
 * off, once the work queued before it is done: chunk k+1 crosses the link
 * while the host copies chunk k out.
 */
static int
unstage_payload(struct kvp_exec *e, size_t off, void *dst, size_t len)
{
	struct cuda_state *s = state(e);
	size_t nc = (len + STAGE_CHUNK - 1) / STAGE_CHUNK;
	cudaError_t err = cudaSuccess;
	for (size_t k = 0; k <= nc && err == cudaSuccess; k++) {
		if (k < nc) { /* queue chunk k */
			size_t at = k * STAGE_CHUNK, c = len - at < STAGE_CHUNK ? len - at : STAGE_CHUNK;
			if ((err = cudaMemcpyAsync(s->h_stage + off + at, s->d_stage + off + at, c,
			                           cudaMemcpyDeviceToHost, s->stream)) != cudaSuccess ||
			    (err = cudaEventRecord(s->chunk_done[k % 2], s->stream)) != cudaSuccess)
				break;
		}
		if (k > 0) { /* copy chunk k-1 out */
			size_t at = (k - 1) * STAGE_CHUNK;
			size_t c = len - at < STAGE_CHUNK ? len - at : STAGE_CHUNK;
			if ((err = cudaEventSynchronize(s->chunk_done[(k - 1) % 2])) != cudaSuccess)
				break;
			kvp_par_copy(s->pc, (unsigned char *)dst + at, s->h_stage + off + at, c);
		}
	}
	if (err != cudaSuccess)
		return drained(e, fail_cuda(e, err, "copying device to host"));
	return wait_stream(e);
}

/* Copies the n ids (and a payload, if any) into staging and onto the device. */
static int
stage_in(struct kvp_exec *e, const void *a, size_t alen, const void *b, size_t blen,
         size_t extra)
{
	struct cuda_state *s = state(e);
	size_t off_b = align16(alen);
	int rv;
	if ((rv = grow(e, off_b + align16(blen) + extra)) != KVP_OK)
		return rv;
	memcpy(s->h_stage, a, alen);
	CK(e, cudaMemcpyAsync(s->d_stage, s->h_stage, alen, cudaMemcpyHostToDevice, s->stream));
	return stage_payload(e, off_b, b, blen);
}

static int
cuda_read_blocks(struct kvp_exec *e, const int32_t *ids, size_t n, void *dst)
{
	struct cuda_state *s = state(e);
	size_t ids_len = align16(n * sizeof(int32_t)), len = n * e->block_bytes;
	int rv;
	CK(e, cudaSetDevice(s->device));
	if ((rv = stage_in(e, ids, n * sizeof(int32_t), NULL, 0, len)) != KVP_OK)
		return rv;
	dim3 grid((unsigned)n, 2 * e->shape.num_layers);
	gather_kernel<<<grid, THREADS, 0, s->stream>>>(s->cache, (const int32_t *)s->d_stage,
	                                               s->d_stage + ids_len, e->st,
	                                               e->shape.num_layers);
	if ((rv = launched(e, "gather_kernel")) != KVP_OK)
		return drained(e, rv);
	return unstage_payload(e, ids_len, dst, len);
}

static int
cuda_write_blocks(struct kvp_exec *e, const int32_t *ids, size_t n, const void *src)
{
	struct cuda_state *s = state(e);
	size_t ids_len = align16(n * sizeof(int32_t));
	int rv;
	CK(e, cudaSetDevice(s->device));
	if ((rv = stage_in(e, ids, n * sizeof(int32_t), src, n * e->block_bytes, 0)) != KVP_OK)
		return rv;
	dim3 grid((unsigned)n, 2 * e->shape.num_layers);
	scatter_kernel<<<grid, THREADS, 0, s->stream>>>(s->cache, (const int32_t *)s->d_stage,
	                                                s->d_stage + ids_len, e->st,
	                                                e->shape.num_layers);
	if ((rv = launched(e, "scatter_kernel")) != KVP_OK)
		return drained(e, rv);
	return wait_stream(e);
}

static int
cuda_copy_blocks(struct kvp_exec *e, const int32_t *src, const int32_t *dst, size_t n)
{
	struct cuda_state *s = state(e);
	size_t half = n * sizeof(int32_t);
	int rv;
	CK(e, cudaSetDevice(s->device));
	if ((rv = grow(e, 2 * half)) != KVP_OK)
		return rv;
	memcpy(s->h_stage, src, half);
	memcpy(s->h_stage + half, dst, half);
	CK(e, cudaMemcpyAsync(s->d_stage, s->h_stage, 2 * half, cudaMemcpyHostToDevice, s->stream));
	dim3 grid((unsigned)n, 2 * e->shape.num_layers);
	copy_kernel<<<grid, THREADS, 0, s->stream>>>(s->cache, (const int32_t *)s->d_stage, n, e->st);
	if ((rv = launched(e, "copy_kernel")) != KVP_OK)
		return drained(e, rv);
	return wait_stream(e);
}

static int
launch_write_tokens(struct kvp_exec *e, const unsigned char *d_slots, const unsigned char *d_k,
                    const unsigned char *d_v, uint32_t layer0, uint32_t nlayers, size_t n)
{
	struct cuda_state *s = state(e);
	dim3 grid((unsigned)n, nlayers);
	unsigned threads = e->st.token_elems < THREADS ? (unsigned)e->st.token_elems : THREADS;
	if (e->st.elem_bytes == 4)
		write_tokens_kernel<uint32_t><<<grid, threads, 0, s->stream>>>(
			(uint32_t *)s->cache, (const int64_t *)d_slots, (const uint32_t *)d_k,
			(const uint32_t *)d_v, e->st, e->shape.block_size, e->shape.head_size, layer0, n);
	else
		write_tokens_kernel<uint16_t><<<grid, threads, 0, s->stream>>>(
			(uint16_t *)s->cache, (const int64_t *)d_slots, (const uint16_t *)d_k,
			(const uint16_t *)d_v, e->st, e->shape.block_size, e->shape.head_size, layer0, n);
	return launched(e, "write_tokens_kernel");
}

static int
cuda_write_tokens(struct kvp_exec *e, uint32_t layer0, uint32_t nlayers, const int64_t *slots,
                  size_t n, const void *k, const void *v)
{
	struct cuda_state *s = state(e);
	size_t slots_len = align16(n * sizeof(int64_t));
	size_t kv_len = (size_t)nlayers * n * e->st.token_elems * e->st.elem_bytes;
	int rv;
	CK(e, cudaSetDevice(s->device));
	if ((rv = grow(e, slots_len + 2 * align16(kv_len))) != KVP_OK)
		return rv;
	memcpy(s->h_stage, slots, n * sizeof(int64_t));
	CK(e, cudaMemcpyAsync(s->d_stage, s->h_stage, n * sizeof(int64_t), cudaMemcpyHostToDevice,
	                      s->stream));
	if ((rv = stage_payload(e, slots_len, k, kv_len)) != KVP_OK ||
	    (rv = stage_payload(e, slots_len + align16(kv_len), v, kv_len)) != KVP_OK)
		return rv;
	if ((rv = launch_write_tokens(e, s->d_stage, s->d_stage + slots_len,
	                              s->d_stage + slots_len + align16(kv_len), layer0, nlayers,
	                              n)) != KVP_OK)
		return drained(e, rv);
	return wait_stream(e);
}

/* ---- device benchmark ---- */

static int
time_ms(struct kvp_exec *e, cudaEvent_t a, cudaEvent_t b, float *ms)
{
	CK(e, cudaEventSynchronize(b));
	CK(e, cudaEventElapsedTime(ms, a, b));
	return KVP_OK;
}

static int
cuda_bench(struct kvp_exec *e, uint32_t n, int iters, struct kvp_exec_bench *out)
{
	struct cuda_state *s = state(e);
	size_t bytes = (size_t)n * e->block_bytes;
	size_t tokens = (size_t)n * e->shape.block_size;
	size_t kv_len = (size_t)e->shape.num_layers * tokens * e->st.token_elems * e->st.elem_bytes;
	size_t ids_len = align16(2 * n * sizeof(int32_t)), slots_len = align16(tokens * 8);
	size_t need = ids_len + slots_len + align16(bytes) + 2 * align16(kv_len);
	cudaEvent_t a = NULL, b = NULL;
	cudaError_t err = cudaSuccess;
	unsigned char *pageable = NULL; /* the pageable baselines' host memory */
	float ms[9];
	double gb = 0;
	dim3 grid(n, 2 * e->shape.num_layers);
	int rv;

	CK(e, cudaSetDevice(s->device));
	if ((rv = grow(e, need)) != KVP_OK)
		return rv;
	/* ids 0..n-1 then n..2n-1 (copy pairs); slots of blocks n..2n-1 for write_tokens. */
	int32_t *ids = (int32_t *)s->h_stage;
	for (uint32_t i = 0; i < 2 * n; i++)
		ids[i] = (int32_t)i;
	int64_t *slots = (int64_t *)(s->h_stage + ids_len);
	for (size_t t = 0; t < tokens; t++)
		slots[t] = (int64_t)((size_t)n * e->shape.block_size + t);
	CK(e, cudaMemcpyAsync(s->d_stage, s->h_stage, ids_len + slots_len, cudaMemcpyHostToDevice,
	                      s->stream));
	unsigned char *buf = s->d_stage + ids_len + slots_len, *kv = buf + align16(bytes);
	CK(e, cudaMemsetAsync(buf, 0x5a, align16(bytes) + 2 * align16(kv_len), s->stream));
	if ((err = cudaEventCreate(&a)) != cudaSuccess || (err = cudaEventCreate(&b)) != cudaSuccess) {
		rv = fail_cuda(e, err, "cudaEventCreate");
		goto out;
	}
	if ((pageable = (unsigned char *)malloc(bytes)) == NULL) {
		rv = KVP_ENOMEM;
		goto out;
	}
	memset(pageable, 0x3c, bytes);
	for (int which = 0; which < 9; which++) {
		for (int it = -1; it < iters; it++) { /* it = -1: warm-up, not timed */
			if (it == 0 && (err = cudaEventRecord(a, s->stream)) != cudaSuccess)
				break;
			switch (which) {
			case 0:
				gather_kernel<<<grid, THREADS, 0, s->stream>>>(
					s->cache, (const int32_t *)s->d_stage, buf, e->st, e->shape.num_layers);
				break;
			case 1:
				scatter_kernel<<<grid, THREADS, 0, s->stream>>>(
					s->cache, (const int32_t *)s->d_stage, buf, e->st, e->shape.num_layers);
				break;
			case 2:
				copy_kernel<<<grid, THREADS, 0, s->stream>>>(
					s->cache, (const int32_t *)s->d_stage, n, e->st);
				break;
			case 3:
				rv = launch_write_tokens(e, s->d_stage + ids_len, kv, kv + align16(kv_len), 0,
				                         e->shape.num_layers, tokens);
				break;
			case 4:
				err = cudaMemcpyAsync(buf, s->cache, bytes, cudaMemcpyDeviceToDevice,
				                      s->stream);
				break;
			case 5: /* the host baselines: pinned memory, one copy */
				err = cudaMemcpyAsync(buf, s->h_stage + ids_len + slots_len, bytes,
				                      cudaMemcpyHostToDevice, s->stream);
				break;
			case 6:
				err = cudaMemcpyAsync(s->h_stage + ids_len + slots_len, buf, bytes,
				                      cudaMemcpyDeviceToHost, s->stream);
				break;
			case 7: /* and pageable memory, from malloc, as callers hold theirs */
				err = cudaMemcpyAsync(buf, pageable, bytes, cudaMemcpyHostToDevice, s->stream);
				break;
			default:
				err = cudaMemcpyAsync(pageable, buf, bytes, cudaMemcpyDeviceToHost, s->stream);
			}
			if (rv == KVP_OK && err != cudaSuccess)
				rv = fail_cuda(e, err, "cudaMemcpyAsync");
			if (rv == KVP_OK)
				rv = launched(e, "bench kernel");
			if (rv != KVP_OK)
				goto out;
		}
		if (err == cudaSuccess)
			err = cudaEventRecord(b, s->stream);
		if (err != cudaSuccess) {
			rv = fail_cuda(e, err, "cudaEventRecord");
			goto out;
		}
		if ((rv = time_ms(e, a, b, &ms[which])) != KVP_OK)
			goto out;
	}
	out->bytes = bytes;
	gb = (double)bytes * iters / 1e9;
	out->gather_gbps = gb / (ms[0] / 1e3);
	out->scatter_gbps = gb / (ms[1] / 1e3);
	out->copy_gbps = gb / (ms[2] / 1e3);
	out->write_tokens_gbps = gb / (ms[3] / 1e3);
	out->d2d_gbps = gb / (ms[4] / 1e3);
	out->h2d_pinned_gbps = gb / (ms[5] / 1e3);
	out->d2h_pinned_gbps = gb / (ms[6] / 1e3);
	out->h2d_pageable_gbps = gb / (ms[7] / 1e3);
	out->d2h_pageable_gbps = gb / (ms[8] / 1e3);
out:
	free(pageable);
	if (a)
		cudaEventDestroy(a);
	if (b)
		cudaEventDestroy(b);
	return rv;
}

static const struct kvp_exec_ops cuda_ops = {
	"cuda", "GPU", cuda_open, cuda_close, cuda_read_blocks, cuda_write_blocks,
	cuda_copy_blocks, cuda_write_tokens, cuda_bench,
};

extern "C" const struct kvp_exec_ops *
kvp_exec_cuda_ops(void)
{
	return &cuda_ops;
}

extern "C" int
kvp_cuda_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
	int count = 0;
	size_t f = 0, t = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess || device >= count ||
	    cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
		(void)cudaGetLastError(); /* see fail_cuda */
		return KVP_ENODEVICE;
	}
	*free_bytes = f;
	*total_bytes = t;
	return KVP_OK;
}
