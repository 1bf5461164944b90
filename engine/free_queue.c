/* SPDX-License-Identifier: Apache-2.0 */
#include "engine/free_queue.h"

#include <assert.h>

#include "common/kvp_status.h"

void
kvp_queue_init(struct kvp_queue *q, struct kvp_block *blocks, uint32_t n,
               const int32_t *order, size_t count)
{
	q->blocks = blocks;
	q->head = (int32_t)n;
	q->tail = (int32_t)n + 1;
	q->num_free = 0;
	for (uint32_t i = 0; i < n; i++) {
		blocks[i].prev = KVP_QUEUE_UNLINKED;
		blocks[i].next = KVP_QUEUE_UNLINKED;
	}
	blocks[q->head].prev = KVP_QUEUE_UNLINKED;
	blocks[q->head].next = q->tail;
	blocks[q->tail].prev = q->head;
	blocks[q->tail].next = KVP_QUEUE_UNLINKED;
	for (size_t i = 0; i < count; i++) {
		assert(order[i] >= 0 && (uint32_t)order[i] < n);
		int rv = kvp_queue_append(q, order[i]);
		assert(rv == KVP_OK);
		(void)rv;
	}
}
