/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Work before authentication (issue #15): kvpoold reads a request's
 * envelope (pool, session, call) from its bytes and decodes the body only
 * for a live session of a known pool, with a Batch's calls counted first.
 * On main before this, an 8 MiB Batch of 4 million empty calls from a peer
 * with no session was decoded whole (RSS 8.5 -> 238 MB for one request).
 * Here the same request, with no session and then with one, must leave the
 * daemon's RSS within a few MB; the scanner itself is checked on crafted
 * bytes; and a pool name with a NUL in it is refused, not cut at the NUL.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "clients/c/kvpool.h"
#include "kvpool.pb-c.h"
#include "service/rpc/envelope.h"

#define CALLS (4u << 20)

static char rpc_url[128], admin[64];
static pid_t daemon_pid;

static int
setup(void **state)
{
	(void)state;
	snprintf(rpc_url, sizeof(rpc_url), "ipc:///tmp/kvpool-envtest-%d.ipc", (int)getpid());
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	const char *args[] = {"--rpc", rpc_url, "--admin", admin, "--events", "none",
	                      "--max-msg-bytes", "16777216", "--executor", "none",
	                      "--pool", "name=default,blocks=64,block_size=16", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

/* Appends a varint; returns the new end. */
static uint8_t *
put_varint(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/*
 * A Request for pool (pool_len bytes) and session with a Batch of n empty
 * calls, into buf; returns its length.
 */
static size_t
batch_request(uint8_t *buf, const char *pool, size_t pool_len, uint64_t session, size_t n)
{
	uint8_t *p = buf;
	p = put_varint(p, 1 << 3 | 0); /* call_id */
	p = put_varint(p, 99);
	p = put_varint(p, 2 << 3 | 2); /* pool */
	p = put_varint(p, pool_len);
	memcpy(p, pool, pool_len);
	p += pool_len;
	p = put_varint(p, 3 << 3 | 0); /* session_id */
	p = put_varint(p, session);
	p = put_varint(p, 22 << 3 | 2); /* batch */
	p = put_varint(p, 2 * n);
	for (size_t i = 0; i < n; i++) { /* calls = 1: an empty BatchCall */
		*p++ = 1 << 3 | 2;
		*p++ = 0;
	}
	return (size_t)(p - buf);
}

/* One request over a fresh REQ socket; the decoded reply (caller frees). */
static Kvpool__V1__Reply *
raw_call(const uint8_t *req, size_t len)
{
	nng_socket s;
	nng_msg *m = NULL;
	assert_int_equal(nng_req0_open(&s), 0);
	assert_int_equal(nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0), 0);
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 20000), 0);
	assert_int_equal(nng_dial(s, rpc_url, NULL, NNG_FLAG_NONBLOCK), 0);
	assert_int_equal(nng_msg_alloc(&m, 0), 0);
	assert_int_equal(nng_msg_append(m, req, len), 0);
	assert_int_equal(nng_sendmsg(s, m, 0), 0);
	assert_int_equal(nng_recvmsg(s, &m, 0), 0);
	Kvpool__V1__Reply *r = kvpool__v1__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
	nng_msg_free(m);
	nng_close(s);
	assert_non_null(r);
	return r;
}

static void
test_envelope_scan_reads_fields_and_refuses_malformed_bytes(void **state)
{
	static uint8_t buf[256];
	struct kvpd_envelope e;
	(void)state;

	size_t n = batch_request(buf, "p\0q", 3, 300, 5);
	assert_int_equal(kvpd_envelope_scan(buf, n, &e), KVP_OK);
	assert_int_equal(e.call_id, 99);
	assert_int_equal(e.session_id, 300);
	assert_int_equal(e.pool_len, 3);
	assert_memory_equal(e.pool, "p\0q", 3);
	assert_int_equal(e.call_case, 22);
	assert_int_equal(e.batch_calls, 5);
	/* Cut anywhere inside, the bytes are refused and e is unchanged. */
	for (size_t cut = 1; cut < n; cut++) {
		e.call_id = 7;
		int rv = kvpd_envelope_scan(buf, cut, &e);
		if (rv == KVP_OK) /* only at a field boundary between whole fields */
			assert_true(cut == 2 || cut == 7 || cut == 10);
		else
			assert_int_equal(e.call_id, 7);
	}
	uint8_t group[] = {0x0b, 0x0c}, zero[] = {0x00, 0x01}, longv[12];
	memset(longv, 0xff, sizeof(longv));
	longv[0] = 0x08;
	assert_int_equal(kvpd_envelope_scan(group, sizeof(group), &e), KVP_EINVAL);
	assert_int_equal(kvpd_envelope_scan(zero, sizeof(zero), &e), KVP_EINVAL);
	assert_int_equal(kvpd_envelope_scan(longv, sizeof(longv), &e), KVP_EINVAL);
	assert_int_equal(kvpd_envelope_scan(NULL, 0, &e), KVP_OK);
	assert_int_equal(e.call_case, 0);
	assert_int_equal(kvpd_envelope_scan(NULL, 1, &e), KVP_EINVAL);
	/* A Batch given twice merges: its calls add up. */
	size_t m = batch_request(buf, "p", 1, 1, 3);
	memcpy(buf + m, buf + 7, 2 + 1 + 6);
	assert_int_equal(kvpd_envelope_scan(buf, m + 9, &e), KVP_OK);
	assert_int_equal(e.batch_calls, 6);
}

static void
test_envelope_no_body_is_decoded_without_a_session(void **state)
{
	static uint8_t buf[2 * CALLS + 64];
	(void)state;

	/* A pool name with a NUL is refused, not taken for "default". */
	size_t n = batch_request(buf, "default\0x", 9, 0, 1);
	Kvpool__V1__Reply *r = raw_call(buf, n);
	assert_int_equal(r->status, KVP_EINVAL);
	assert_non_null(strstr(r->detail, "NUL"));
	kvpool__v1__reply__free_unpacked(r, NULL);

	struct kvp_client_options o = {.url = rpc_url};
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(&o, &c), KVP_OK);
	struct kvp_client_stats st;
	assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	uint64_t sid = kvp_client_info(c)->session_id;
	sleep_ms(200);
	double base = (double)proc_rss_bytes(daemon_pid) / (1 << 20), peak = base;

	/* 4 Mi empty calls, 8 MiB: with no session, with a dead one, with a live one. */
	uint64_t sessions[] = {0, 123456789, sid};
	for (int i = 0; i < 3; i++) {
		n = batch_request(buf, "default", 7, sessions[i], CALLS);
		double t0 = now_s();
		r = raw_call(buf, n);
		double took = now_s() - t0, rss = (double)proc_rss_bytes(daemon_pid) / (1 << 20);
		print_message("session %llu: %s in %.3f s, RSS %.1f MB (from %.1f)\n",
		              (unsigned long long)sessions[i], r->detail, took, rss, base);
		assert_int_equal(r->status, i < 2 ? KVP_EUNAUTH : KVP_EINVAL);
		if (i == 2)
			assert_non_null(strstr(r->detail, "calls in one batch"));
		kvpool__v1__reply__free_unpacked(r, NULL);
		if (rss > peak)
			peak = rss;
	}
	/* The message itself passes through nng (8 MiB, twice at most). */
	assert_true(peak - base < 40);
	/* The session is untouched and the pool still answers. */
	assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	assert_int_equal(st.num_free, st.num_blocks - 1); /* the null block */
	kvp_client_close(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_envelope_scan_reads_fields_and_refuses_malformed_bytes),
		cmocka_unit_test(test_envelope_no_body_is_decoded_without_a_session),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
