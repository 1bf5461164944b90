/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_pack.h: a Batch request's bytes, written by hand. protobuf-c
 * packs by walking descriptors, twice (size, then bytes), over every
 * member of each BatchCall's oneof: on S256 (a step of 272 calls, eight
 * prompts) its packer was 85% of the client's instructions in
 * kvp_client_batch. The calls a scheduler batches (Allocate, Touch, Free,
 * Cache, Lookup, AllocateSlots, FreeRequest, GetComputedBlocks, slots
 * runs) are written here, a RequestKeys among them packed by protobuf-c in
 * its place; any other call is packed by protobuf-c in its place, and any
 * other request wholly by protobuf-c.
 * The bytes are protobuf-c's own for the same message (with a prompt
 * moved to its 32-bit field under kvpc_plan.prompt_u32;
 * tests/test_request_pack.c compares them).
 */
#ifndef KVPC_REQUEST_PACK_H
#define KVPC_REQUEST_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.pb-c.h"

/* One BatchCall's lengths, measured once and kept for writing it. */
struct kvpc_call_plan {
	size_t len;    /* the BatchCall's body */
	size_t inner;  /* its request message's body (hand-written kinds) */
	size_t arr[4]; /* the request's packed arrays, in field order */
};

/* Lengths kept between measuring a request and writing it. */
struct kvpc_plan {
	struct kvpc_call_plan *calls; /* one per BatchCall; grown as needed */
	size_t cap;
	size_t batch; /* the BatchRequest's body */
	int by_hand;  /* the last kvpc_request_size measured by hand */
	/*
	 * Set by the caller: the daemon reads prompt_token_ids_u32 (PoolInfo's
	 * prompt_u32). A hand-written AllocateSlots whose prompt ids all lie in
	 * [0, 2^32) then carries them there, 4 bytes each and copied, instead
	 * of as varints in prompt_token_ids: the bytes protobuf-c writes for
	 * the message with the prompt moved to that field.
	 */
	int prompt_u32;
};

/*
 * rq's packed size. A Batch request is measured by hand into plan when
 * plan can hold its calls (KVP_ENOMEM otherwise leaves it to protobuf-c);
 * any other request is protobuf-c's. Always returns the exact size.
 */
size_t kvpc_request_size(const Kvpool__V1__Request *rq, struct kvpc_plan *plan);
/* Writes rq (as measured by the last kvpc_request_size with plan) into buf; its length. */
size_t kvpc_request_pack(const Kvpool__V1__Request *rq, const struct kvpc_plan *plan,
                         uint8_t *buf);
void kvpc_plan_fini(struct kvpc_plan *plan);

/*
 * A prompt narrowed to 32-bit ids (malloc'd; the caller frees), for a call
 * packed by protobuf-c to a daemon with prompt_u32. NULL if an id lies
 * outside [0, 2^32), n is 0, or memory is short: the prompt then goes as
 * varints.
 */
uint32_t *kvpc_prompt_u32(const int64_t *v, size_t n);

#endif /* KVPC_REQUEST_PACK_H */
