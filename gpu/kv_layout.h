/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kv_layout.h: the index math of paged KV memory, shared by the CPU backend,
 * the CUDA kernels and the tests.
 *
 * Everything here is a pure function of its arguments, compiled for the
 * host and (under nvcc) for the device, so the CPU tests cover the very
 * expressions the kernels run.
 *
 * Memory (one allocation per executor), in elements:
 *
 *   cache[layer][kv][block][...one block...]     kv: 0 = K, 1 = V
 *
 * that is, per layer vLLM's flash-attention tensor `[2, num_blocks, ...]`.
 * Inside one block of one layer's K (or V), the element (offset o, head h,
 * dim d) is at `o*page_stride + h*head_stride + d`:
 *
 *   NHD (vLLM's default flash layout, `[num_blocks, block_size, heads, head_size]`):
 *       page_stride = heads*head_size, head_stride = head_size
 *   HND (`[num_blocks, heads, block_size, head_size]`):
 *       page_stride = head_size,       head_stride = block_size*head_size
 *
 * Both keep one block of one layer contiguous (block_elems elements), which
 * is what block transfers move. A new layout needs new strides here, and
 * nothing else as long as it keeps blocks contiguous.
 *
 * Rows (shape.rows = 1, a shared region's memory): block-major instead,
 *
 *   cache[block][layer][kv][...one block...]
 *
 * each block's row holding exactly its transfer payload (below), padded to
 * a multiple of KVP_ROW_ALIGN bytes, so a client that maps the region
 * reads and writes a block as one contiguous row.
 *
 * A block's transfer payload (read_blocks / write_blocks) is its 2*layers
 * chunks back to back: layer 0 K, layer 0 V, layer 1 K, ..., each chunk in
 * the cache's own layout. A list of blocks is their payloads back to back.
 */
#ifndef KVP_KV_LAYOUT_H
#define KVP_KV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KVP_HD __host__ __device__
#else
#define KVP_HD
#endif

enum kvp_dtype { KVP_DTYPE_FP16 = 0, KVP_DTYPE_BF16 = 1, KVP_DTYPE_FP32 = 2 };
enum kvp_cache_layout { KVP_LAYOUT_NHD = 0, KVP_LAYOUT_HND = 1 };

/* vLLM's PAD_SLOT_ID: a slot-mapping entry that writes nothing. */
#define KVP_PAD_SLOT (-1)

/* The shape of one executor's KV memory. */
struct kvp_kv_shape {
	uint32_t num_blocks;   /* physical blocks (the pool's, null block included) */
	uint32_t block_size;   /* tokens per block */
	uint32_t num_layers;
	uint32_t num_heads;    /* KV heads */
	uint32_t head_size;
	uint32_t dtype;        /* enum kvp_dtype */
	uint32_t layout;       /* enum kvp_cache_layout */
	uint32_t rows;         /* 1: block-major rows (a region); 0: per-layer tensors */
};

/* A row's alignment and padding in a region: the page size. */
#define KVP_ROW_ALIGN 4096u

/* Strides derived from a shape, in elements. */
struct kvp_kv_strides {
	uint64_t elem_bytes;
	uint64_t page_stride;  /* from token offset o to o+1 inside a block */
	uint64_t head_stride;  /* from head h to h+1 */
	uint64_t block_elems;  /* one block of one layer's K: block_size*heads*head_size */
	uint64_t kv_stride;    /* from a layer's K to its V: num_blocks*block_elems */
	uint64_t layer_stride; /* from layer l to l+1: 2*kv_stride */
	uint64_t block_stride; /* from block b to b+1: block_elems, or a padded row */
	uint64_t token_elems;  /* one token's K (or V) of one layer: heads*head_size */
};

KVP_HD static inline uint32_t
kvp_dtype_size(uint32_t dtype)
{
	return dtype == KVP_DTYPE_FP32 ? 4u : 2u;
}

/* Strides of a shape (assumed valid: see kvp_kv_shape_check). */
KVP_HD static inline struct kvp_kv_strides
kvp_kv_strides_of(const struct kvp_kv_shape *s)
{
	struct kvp_kv_strides st;
	st.elem_bytes = kvp_dtype_size(s->dtype);
	st.token_elems = (uint64_t)s->num_heads * s->head_size;
	st.block_elems = (uint64_t)s->block_size * st.token_elems;
	if (s->layout == KVP_LAYOUT_HND) {
		st.page_stride = s->head_size;
		st.head_stride = (uint64_t)s->block_size * s->head_size;
	} else {
		st.page_stride = st.token_elems;
		st.head_stride = s->head_size;
	}
	if (s->rows) {
		uint64_t row = 2 * (uint64_t)s->num_layers * st.block_elems * st.elem_bytes;
		row = (row + KVP_ROW_ALIGN - 1) / KVP_ROW_ALIGN * KVP_ROW_ALIGN;
		st.kv_stride = st.block_elems;
		st.layer_stride = 2 * st.block_elems;
		st.block_stride = row / st.elem_bytes;
	} else {
		st.kv_stride = (uint64_t)s->num_blocks * st.block_elems;
		st.layer_stride = 2 * st.kv_stride;
		st.block_stride = st.block_elems;
	}
	return st;
}

/* Element offset of the chunk (layer, kv, block) in the cache. */
KVP_HD static inline uint64_t
kvp_chunk_offset(const struct kvp_kv_strides *st, uint32_t layer, uint32_t kv, uint64_t block)
{
	return layer * st->layer_stride + kv * st->kv_stride + block * st->block_stride;
}

/* Element offset of (layer, kv, block, offset in block, head, dim) in the cache. */
KVP_HD static inline uint64_t
kvp_elem_offset(const struct kvp_kv_strides *st, uint32_t layer, uint32_t kv, uint64_t block,
                uint32_t off, uint32_t head, uint32_t dim)
{
	return kvp_chunk_offset(st, layer, kv, block) + off * st->page_stride +
	       head * st->head_stride + dim;
}

/* Element offset of chunk (layer, kv) of the i-th block in a transfer payload. */
KVP_HD static inline uint64_t
kvp_payload_offset(const struct kvp_kv_strides *st, uint32_t num_layers, uint64_t i,
                   uint32_t layer, uint32_t kv)
{
	return ((i * num_layers + layer) * 2 + kv) * st->block_elems;
}

/* reshape_and_cache_flash's destination of (slot, head): block, then offset in block. */
KVP_HD static inline uint64_t
kvp_slot_block(int64_t slot, uint32_t block_size)
{
	return (uint64_t)slot / block_size;
}
KVP_HD static inline uint32_t
kvp_slot_offset(int64_t slot, uint32_t block_size)
{
	return (uint32_t)((uint64_t)slot % block_size);
}

/*
 * The legacy paged layout of reshape_and_cache (not an executor layout;
 * here so the element placement of vLLM's other kernels is pinned by tests):
 * key_cache [nb, H, D/x, B, x], value_cache [nb, H, D, B], x = 16/elem size.
 */
KVP_HD static inline uint64_t
kvp_paged_key_offset(uint64_t b, uint32_t o, uint32_t h, uint32_t d, uint32_t H, uint32_t D,
                     uint32_t B, uint32_t x)
{
	return (((b * H + h) * (D / x) + d / x) * B + o) * x + d % x;
}
KVP_HD static inline uint64_t
kvp_paged_value_offset(uint64_t b, uint32_t o, uint32_t h, uint32_t d, uint32_t H, uint32_t D,
                       uint32_t B)
{
	return ((b * H + h) * D + d) * B + o;
}

/* Context parallelism for compute_slot_mapping (world sizes 1: none). */
struct kvp_cp {
	uint32_t pcp_world, pcp_rank;
	uint32_t dcp_world, dcp_rank;
	uint32_t interleave;   /* cp_kv_cache_interleave_size (I) */
};

/*
 * vLLM's compute_slot_mapping for one token at position pos of a request
 * whose block-table row is row (block_size B, already in kernel blocks):
 * W = pcp*dcp, rank = pcp_rank*dcp + dcp_rank, VB = B*W,
 * blk = row[pos / VB], off = pos % VB; local iff (off/I) % W == rank, then
 * slot = blk*B + (off/(W*I))*I + off%I, else -1. World sizes and I of 0
 * mean 1. The row is assumed long enough and ranks below their worlds (the
 * host wrapper checks both).
 */
KVP_HD static inline int64_t
kvp_slot_of(const int32_t *row, uint32_t block_size, int64_t pos, const struct kvp_cp *cp)
{
	uint64_t pcp = cp->pcp_world ? cp->pcp_world : 1, dcp = cp->dcp_world ? cp->dcp_world : 1;
	uint64_t w = pcp * dcp;
	uint64_t rank = (uint64_t)cp->pcp_rank * dcp + cp->dcp_rank;
	uint64_t in = cp->interleave ? cp->interleave : 1;
	uint64_t vb = (uint64_t)block_size * w;
	int64_t blk = row[(uint64_t)pos / vb];
	uint64_t off = (uint64_t)pos % vb;
	if ((off / in) % w != rank)
		return KVP_PAD_SLOT;
	return blk * (int64_t)block_size + (int64_t)((off / (w * in)) * in + off % in);
}

#endif /* KVP_KV_LAYOUT_H */
