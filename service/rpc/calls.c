/* SPDX-License-Identifier: Apache-2.0 */
/* The call table's generated parts; calls.h says how to add a call. */
#include "service/rpc/calls.h"

#include "service/rpc/call.h"

/* Each row's wire number is the proto's. */
#define WIRE_ASSERT(U, n, w, f, b) \
	_Static_assert((int)KVPOOL__V1__REQUEST__CALL_##U == (w), #U " is not oneof number " #w);
KVPD_CALLS(WIRE_ASSERT)
#undef WIRE_ASSERT

/* A batchable call has the same oneof number in BatchCall as in Request. */
#define BATCH_ASSERT_Y(U) \
	_Static_assert((int)KVPOOL__V1__BATCH_CALL__CALL_##U == (int)KVPOOL__V1__REQUEST__CALL_##U, #U);
#define BATCH_ASSERT_N(U)
#define BATCH_ASSERT(U, n, w, f, b) BATCH_ASSERT_##b(U)
KVPD_CALLS(BATCH_ASSERT)
#undef BATCH_ASSERT

/* One typed wrapper per handler: the table holds one function type. */
#define RUN(U, n, w, f, b) \
	static int run_##n(struct call *c, const void *m, Kvpool__V1__Reply *o) \
	{                                                                       \
		return kvpd_h_##n(c, m, o);                                     \
	}
KVPD_CALLS(RUN)
#undef RUN

#define BATCHABLE_Y true
#define BATCHABLE_N false
#define ROW(U, n, w, f, b) [KVPD_CALL_##U] = {#n, (f), BATCHABLE_##b, run_##n},
static const struct kvpd_call_op ops[KVPD_NUM_CALLS] = {KVPD_CALLS(ROW)};
#undef ROW

const struct kvpd_call_op *
kvpd_call_lookup(int wire)
{
	switch (wire) {
#define CASE(U, n, w, f, b) \
	case KVPOOL__V1__REQUEST__CALL_##U: \
		return &ops[KVPD_CALL_##U];
		KVPD_CALLS(CASE)
#undef CASE
	default:
		return NULL;
	}
}

enum kvpd_call_index
kvpd_call_index(const struct kvpd_call_op *op)
{
	return (enum kvpd_call_index)(op - ops);
}

const char *
kvpd_call_name(int i)
{
	return i >= 0 && i < KVPD_NUM_CALLS ? ops[i].name : NULL;
}
