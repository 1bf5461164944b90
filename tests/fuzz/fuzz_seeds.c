/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writes a seed corpus for fuzz_dispatch into DIR: a few sequences of valid
 * requests (every call at least once), framed as fuzz_dispatch reads them.
 * Made at build/CI time, never committed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.pb-c.h"

static uint8_t out[1 << 16];
static size_t out_len;

static void
frame(Kvpool__V1__Request *rq)
{
	size_t n = kvpool__v1__request__get_packed_size(rq);
	out[out_len++] = (uint8_t)n;
	out[out_len++] = (uint8_t)(n >> 8);
	kvpool__v1__request__pack(rq, out + out_len);
	out_len += n;
}

static void
save(const char *dir, const char *name)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (f == NULL || fwrite(out, 1, out_len, f) != out_len) {
		perror(path);
		exit(1);
	}
	fclose(f);
	out_len = 0;
}

int
main(int argc, char **argv)
{
	int32_t ids[] = {1, 2, 3};
	int64_t tok[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;

	if (argc != 2) {
		fprintf(stderr, "usage: fuzz_seeds DIR\n");
		return 2;
	}
	rq.pool = "fuzz";
	rq.session_id = 1;

	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	h.protocol_version = 1;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	frame(&rq);
	save(argv[1], "hello");

	Kvpool__V1__AllocateRequest al = KVPOOL__V1__ALLOCATE_REQUEST__INIT;
	al.num_blocks = 3;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE;
	rq.allocate = &al;
	rq.call_id = 1;
	frame(&rq);
	Kvpool__V1__CacheRequest ca = KVPOOL__V1__CACHE_REQUEST__INIT;
	ca.block_ids = ids;
	ca.n_block_ids = 3;
	ca.num_full_blocks = 3;
	ca.token_ids = tok;
	ca.n_token_ids = 12;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_CACHE;
	rq.cache = &ca;
	rq.call_id = 2;
	frame(&rq);
	Kvpool__V1__FreeRequest fr = KVPOOL__V1__FREE_REQUEST__INIT;
	fr.block_ids = ids;
	fr.n_block_ids = 3;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_FREE;
	rq.free = &fr;
	rq.call_id = 3;
	frame(&rq);
	Kvpool__V1__LookupRequest lk = KVPOOL__V1__LOOKUP_REQUEST__INIT;
	lk.token_ids = tok;
	lk.n_token_ids = 12;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_LOOKUP;
	rq.lookup = &lk;
	frame(&rq);
	Kvpool__V1__TouchRequest tc = KVPOOL__V1__TOUCH_REQUEST__INIT;
	tc.block_ids = ids;
	tc.n_block_ids = 2;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_TOUCH;
	rq.touch = &tc;
	rq.call_id = 4;
	frame(&rq);
	Kvpool__V1__EvictRequest ev = KVPOOL__V1__EVICT_REQUEST__INIT;
	ev.block_ids = ids;
	ev.n_block_ids = 3;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_EVICT;
	rq.evict = &ev;
	rq.call_id = 5;
	frame(&rq);
	save(argv[1], "blocks");

	Kvpool__V1__AllocateSlotsRequest as = KVPOOL__V1__ALLOCATE_SLOTS_REQUEST__INIT;
	as.request_id = 7;
	as.prompt_token_ids = tok;
	as.n_prompt_token_ids = 12;
	as.use_prefix_cache = 1;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE_SLOTS;
	rq.allocate_slots = &as;
	rq.call_id = 6;
	frame(&rq);
	/* the same prompt as 32-bit ids, for another request */
	uint32_t tok32[12];
	for (int i = 0; i < 12; i++)
		tok32[i] = (uint32_t)tok[i];
	Kvpool__V1__AllocateSlotsRequest as32 = KVPOOL__V1__ALLOCATE_SLOTS_REQUEST__INIT;
	as32.request_id = 8;
	as32.prompt_token_ids_u32 = tok32;
	as32.n_prompt_token_ids_u32 = 12;
	as32.use_prefix_cache = 1;
	rq.allocate_slots = &as32;
	frame(&rq);
	rq.allocate_slots = &as;
	Kvpool__V1__GetComputedBlocksRequest gc = KVPOOL__V1__GET_COMPUTED_BLOCKS_REQUEST__INIT;
	gc.request_id = 7;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_GET_COMPUTED_BLOCKS;
	rq.get_computed_blocks = &gc;
	frame(&rq);
	Kvpool__V1__FreeRequestRequest fq = KVPOOL__V1__FREE_REQUEST_REQUEST__INIT;
	fq.request_id = 7;
	fq.preempt = 1;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_FREE_REQUEST;
	rq.free_request = &fq;
	rq.call_id = 7;
	frame(&rq);
	save(argv[1], "requests");

	/* A request, then a step's decodes as a slots run (kvpool.proto) beside a plain call. */
	as.request_id = 9;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE_SLOTS;
	rq.allocate_slots = &as;
	rq.call_id = 9;
	frame(&rq);
	uint64_t run_ids[3] = {9, 9, 10};
	uint32_t run_new[3] = {1, 2, 1}, run_ntok[3] = {1, 2, 0};
	Kvpool__V1__SlotsRunRequest sr = KVPOOL__V1__SLOTS_RUN_REQUEST__INIT;
	sr.request_ids = run_ids;
	sr.n_request_ids = sr.n_num_new_tokens = sr.n_num_token_ids = 3;
	sr.num_new_tokens = run_new;
	sr.num_token_ids = run_ntok;
	sr.token_ids = tok;
	sr.n_token_ids = 3;
	Kvpool__V1__BatchCall r0 = KVPOOL__V1__BATCH_CALL__INIT, r1 = KVPOOL__V1__BATCH_CALL__INIT;
	Kvpool__V1__StatsRequest rst = KVPOOL__V1__STATS_REQUEST__INIT;
	r0.call_case = KVPOOL__V1__BATCH_CALL__CALL_SLOTS_RUN;
	r0.slots_run = &sr;
	r1.call_case = KVPOOL__V1__BATCH_CALL__CALL_STATS;
	r1.stats = &rst;
	Kvpool__V1__BatchCall *run_calls[] = {&r1, &r0};
	Kvpool__V1__BatchRequest rbr = KVPOOL__V1__BATCH_REQUEST__INIT;
	rbr.calls = run_calls;
	rbr.n_calls = 2;
	rbr.continue_on_error = 1;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	rq.batch = &rbr;
	rq.call_id = 10;
	frame(&rq);
	save(argv[1], "run");

	Kvpool__V1__BatchCall b0 = KVPOOL__V1__BATCH_CALL__INIT, b1 = KVPOOL__V1__BATCH_CALL__INIT;
	Kvpool__V1__StatsRequest st = KVPOOL__V1__STATS_REQUEST__INIT;
	b0.call_case = KVPOOL__V1__BATCH_CALL__CALL_ALLOCATE;
	b0.allocate = &al;
	b1.call_case = KVPOOL__V1__BATCH_CALL__CALL_STATS;
	b1.stats = &st;
	Kvpool__V1__BatchCall *calls[] = {&b0, &b1};
	Kvpool__V1__BatchRequest br = KVPOOL__V1__BATCH_REQUEST__INIT;
	br.calls = calls;
	br.n_calls = 2;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_BATCH;
	rq.batch = &br;
	rq.call_id = 8;
	frame(&rq);
	Kvpool__V1__ResetRequest rs = KVPOOL__V1__RESET_REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_RESET;
	rq.reset = &rs;
	frame(&rq);
	Kvpool__V1__HeartbeatRequest hb = KVPOOL__V1__HEARTBEAT_REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HEARTBEAT;
	rq.heartbeat = &hb;
	frame(&rq);
	Kvpool__V1__ReplayRequest rp = KVPOOL__V1__REPLAY_REQUEST__INIT;
	rp.from_seq = 0;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_REPLAY;
	rq.replay = &rp;
	frame(&rq);
	Kvpool__V1__SnapshotRequest sn = KVPOOL__V1__SNAPSHOT_REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_SNAPSHOT;
	rq.snapshot = &sn;
	frame(&rq);
	Kvpool__V1__GoodbyeRequest gb = KVPOOL__V1__GOODBYE_REQUEST__INIT;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_GOODBYE;
	rq.goodbye = &gb;
	frame(&rq);
	save(argv[1], "batch");

	/* The data plane: blocks of 32 bytes in pool fuzz (1 layer, 1 head of 2, bs 4, fp16). */
	static uint8_t payload[96];
	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)i;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	frame(&rq);
	rq.call_case = KVPOOL__V1__REQUEST__CALL_ALLOCATE;
	rq.allocate = &al;
	frame(&rq);
	Kvpool__V1__WriteBlocksRequest wb = KVPOOL__V1__WRITE_BLOCKS_REQUEST__INIT;
	wb.block_ids = ids;
	wb.n_block_ids = 3;
	wb.payload.data = payload;
	wb.payload.len = sizeof(payload);
	rq.call_case = KVPOOL__V1__REQUEST__CALL_WRITE_BLOCKS;
	rq.write_blocks = &wb;
	frame(&rq);
	Kvpool__V1__ReadBlocksRequest rb = KVPOOL__V1__READ_BLOCKS_REQUEST__INIT;
	rb.block_ids = ids;
	rb.n_block_ids = 3;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_READ_BLOCKS;
	rq.read_blocks = &rb;
	frame(&rq);
	Kvpool__V1__CopyBlocksRequest cb = KVPOOL__V1__COPY_BLOCKS_REQUEST__INIT;
	cb.src_block_ids = ids;
	cb.n_src_block_ids = 1;
	cb.dst_block_ids = ids + 1;
	cb.n_dst_block_ids = 1;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_COPY_BLOCKS;
	rq.copy_blocks = &cb;
	frame(&rq);
	Kvpool__V1__WriteTokensRequest wt = KVPOOL__V1__WRITE_TOKENS_REQUEST__INIT;
	int64_t slots[2] = {4, -1};
	wt.all_layers = 1;
	wt.slot_mapping = slots;
	wt.n_slot_mapping = 2;
	wt.key.data = payload;
	wt.key.len = 8;
	wt.value.data = payload + 8;
	wt.value.len = 8;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_WRITE_TOKENS;
	rq.write_tokens = &wt;
	frame(&rq);
	save(argv[1], "data");
	return 0;
}
