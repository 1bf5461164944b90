/* SPDX-License-Identifier: Apache-2.0 */
/* Block tables and slot mapping: vLLM's block_table.py on the host. */
#include "gpu/executor.h"
#include "common/kvp_status.h"

int
kvp_kernel_block_ratio(uint32_t block_size, uint32_t kernel_block_size, uint32_t *ratio)
{
	if (ratio == NULL || block_size == 0 || kernel_block_size == 0 ||
	    block_size % kernel_block_size != 0)
		return KVP_EINVAL;
	*ratio = block_size / kernel_block_size;
	return KVP_OK;
}

int
kvp_map_to_kernel_blocks(const int32_t *ids, size_t n, uint32_t m, int32_t *out, size_t out_cap)
{
	if (m == 0 || (n > 0 && (ids == NULL || out == NULL)) || n > out_cap / m)
		return KVP_EINVAL;
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || (int64_t)ids[i] * m + (m - 1) > INT32_MAX)
			return KVP_ERANGE;
	for (size_t i = 0; i < n; i++)
		for (uint32_t j = 0; j < m; j++)
			out[i * m + j] = ids[i] * (int32_t)m + (int32_t)j;
	return KVP_OK;
}

/* The effective CP settings: zero world sizes and interleave mean 1. */
static int
normalise_cp(const struct kvp_cp *in, struct kvp_cp *cp)
{
	*cp = *in;
	if (cp->pcp_world == 0)
		cp->pcp_world = 1;
	if (cp->dcp_world == 0)
		cp->dcp_world = 1;
	if (cp->interleave == 0)
		cp->interleave = 1;
	if (cp->pcp_rank >= cp->pcp_world || cp->dcp_rank >= cp->dcp_world ||
	    (uint64_t)cp->pcp_world * cp->dcp_world > (1u << 16))
		return KVP_EINVAL;
	return KVP_OK;
}

int
kvp_compute_slot_mapping(const struct kvp_slot_args *a, int64_t *out, size_t out_len)
{
	struct kvp_cp cp;
	size_t num_tokens;

	if (a == NULL || out == NULL || a->query_start_loc == NULL || a->block_size == 0 ||
	    normalise_cp(&a->cp, &cp) != KVP_OK)
		return KVP_EINVAL;
	if (a->num_reqs > 0 && (a->block_table == NULL || a->row_stride == 0))
		return KVP_EINVAL;
	if (a->query_start_loc[0] != 0)
		return KVP_EINVAL;
	for (size_t r = 0; r < a->num_reqs; r++)
		if (a->query_start_loc[r + 1] < a->query_start_loc[r])
			return KVP_EINVAL;
	num_tokens = (size_t)a->query_start_loc[a->num_reqs];
	if (num_tokens > out_len || (num_tokens > 0 && a->positions == NULL))
		return KVP_EINVAL;

	/* Every position must fall inside its row's used blocks. */
	uint64_t vb = (uint64_t)a->block_size * cp.pcp_world * cp.dcp_world;
	for (size_t r = 0; r < a->num_reqs; r++) {
		uint64_t len = a->row_len ? a->row_len[r] : a->row_stride;
		if (len > a->row_stride)
			return KVP_EINVAL;
		for (int32_t t = a->query_start_loc[r]; t < a->query_start_loc[r + 1]; t++)
			if (a->positions[t] < 0 || (uint64_t)a->positions[t] / vb >= len)
				return KVP_ERANGE;
	}

	for (size_t r = 0; r < a->num_reqs; r++) {
		const int32_t *row = a->block_table + r * a->row_stride;
		for (int32_t t = a->query_start_loc[r]; t < a->query_start_loc[r + 1]; t++)
			out[t] = kvp_slot_of(row, a->block_size, a->positions[t], &cp);
	}
	for (size_t t = num_tokens; t < out_len; t++)
		out[t] = KVP_PAD_SLOT;
	return KVP_OK;
}
