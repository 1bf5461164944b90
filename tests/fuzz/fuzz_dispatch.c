/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: arbitrary bytes into kvpoold's request decoder and
 * dispatcher, against a live in-process server (two small pools), with the
 * pools' invariants and session ownership checked after every input.
 *
 * An input is a sequence of frames: a 2-byte little-endian length, then the
 * bytes. Each frame is handed to the server as it is; if it decodes as a
 * Request, it is also sent again with the pool and session of a live
 * session, so the fuzzer reaches the handlers, not only the decoder.
 * Time advances 700 ms per input, so leases (2 s) expire as it runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/config/config.h"
#include "common/kvp_status.h"
#include "kvpool.pb-c.h"
#include "service/pool/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct kvpd_server *srv;
static uint64_t now_ms = 1000;

static uint64_t
hello(const char *pool)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	uint8_t buf[256], *reply = NULL;
	size_t len, rlen = 0;
	uint64_t sid = 0;

	h.protocol_version = 1;
	rq.pool = (char *)pool;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	len = kvpool__v1__request__pack(&rq, buf);
	if (kvpd_server_handle(srv, buf, len, now_ms, &reply, &rlen) == KVP_OK) {
		Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, rlen, reply);
		if (r && r->result_case == KVPOOL__V1__REPLY__RESULT_HELLO)
			sid = r->hello->session_id;
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	free(reply);
	return sid;
}

/* At the run's end: the pools' region files in /dev/shm go with the server. */
static void
destroy_server(void)
{
	kvpd_server_destroy(srv);
	srv = NULL;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static char *args[] = {"fuzz", "--pool", "name=fuzz,blocks=64,block_size=4,seed=0",
	                       "--pool", "name=f2,blocks=16,block_size=2", "--max-ids", "64",
	                       "--max-sessions", "8", "--lease-ms", "2000", "--quiet",
	                       "--kv-layers", "1", "--kv-heads", "1", "--kv-head-size", "2", NULL};
	struct kvpd_config cfg;
	char err[256];
	(void)argc;
	(void)argv;
	if (kvpd_config_load(&cfg, 18, args, NULL, stdout, stderr) != 0 ||
	    kvpd_server_create(&cfg, &srv, err, sizeof(err)) != KVP_OK) {
		fprintf(stderr, "fuzz: cannot create the server: %s\n", err);
		abort(); /* the harness itself is broken: not an input */
	}
	atexit(destroy_server);
	return 0;
}

static void
handle(const uint8_t *buf, size_t len)
{
	uint8_t *reply = NULL;
	size_t rlen = 0;
	if (kvpd_server_handle(srv, buf, len, now_ms, &reply, &rlen) != KVP_OK)
		return;
	/* Every reply must decode. */
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, rlen, reply);
	if (r == NULL) {
		fprintf(stderr, "fuzz: the server sent a reply that does not decode\n");
		abort();
	}
	kvpool__v1__reply__free_unpacked(r, NULL);
	free(reply);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint64_t sid;
	char detail[256];

	now_ms += 700;
	kvpd_server_expire(srv, now_ms);
	if (sid == 0 || (now_ms / 700) % 3 == 0)
		sid = hello((now_ms / 700) % 2 ? "fuzz" : "f2");
	while (size >= 2) {
		size_t len = (size_t)data[0] | (size_t)data[1] << 8;
		data += 2;
		size -= 2;
		if (len > size)
			len = size;
		handle(data, len);
		Kvpool__V1__Request *rq = kvpool__v1__request__unpack(NULL, len, data);
		if (rq != NULL) {
			/* Re-aim a decodable request at a live session. */
			char *orig = rq->pool;
			rq->session_id = sid;
			rq->pool = (char *)((now_ms / 700) % 2 ? "fuzz" : "f2");
			size_t n = kvpool__v1__request__get_packed_size(rq);
			uint8_t *buf = malloc(n ? n : 1);
			if (buf) {
				kvpool__v1__request__pack(rq, buf);
				handle(buf, n);
				free(buf);
			}
			rq->pool = orig; /* free_unpacked frees what unpack allocated */
			kvpool__v1__request__free_unpacked(rq, NULL);
		}
		data += len;
		size -= len;
	}
	if (kvpd_server_check(srv, detail, sizeof(detail)) != KVP_OK) {
		fprintf(stderr, "fuzz: invariant broken: %s\n", detail);
		abort();
	}
	return 0;
}
