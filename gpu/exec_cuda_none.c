/* SPDX-License-Identifier: Apache-2.0 */
/* Built when CUDA is not: the cuda backend is absent and says so. */
#include "gpu/exec_impl.h"
#include "common/kvp_status.h"

const struct kvp_exec_ops *
kvp_exec_cuda_ops(void)
{
	return NULL;
}

int
kvp_cuda_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
	(void)device, (void)free_bytes, (void)total_bytes;
	return KVP_ENOTSUP;
}
