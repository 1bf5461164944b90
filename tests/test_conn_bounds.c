/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport's bounds on what non-reading peers may hold (issue #49),
 * as pure decisions over the contexts holding unread replies
 * (service/net/conn_bounds.c): one connection, one unauthenticated address,
 * all unauthenticated peers, and the pressure watch's choice.
 */
#include "kvp_test.h"

#include <arpa/inet.h>

#include "service/net/conn_bounds.h"

/* The clock of every check below, and the wait that makes a reply stale. */
#define NOW 1000
#define STALE 50

static uint64_t
v4(const char *ip)
{
	nng_sockaddr sa = {.s_in = {.sa_family = NNG_AF_INET}};
	assert_int_equal(inet_pton(AF_INET, ip, &sa.s_in.sa_addr), 1);
	return kvpd_peer_value(&sa);
}

static uint64_t
v6(const char *ip)
{
	nng_sockaddr sa = {.s_in6 = {.sa_family = NNG_AF_INET6}};
	assert_int_equal(inet_pton(AF_INET6, ip, sa.s_in6.sa_addr), 1);
	return kvpd_peer_value(&sa);
}

static void
test_conn_bounds_peer_values(void **state)
{
	(void)state;
	nng_sockaddr ipc = {.s_ipc = {.sa_family = NNG_AF_IPC}};
	assert_true(v4("10.0.0.1") != 0 && v4("10.0.0.1") == v4("10.0.0.1"));
	assert_true(v4("10.0.0.1") != v4("10.0.0.2"));
	assert_true(kvpd_peer_addr(v4("10.0.0.1")) != 0);
	/* One IPv6 /64 is one address; another /64 is another. */
	assert_true(v6("2001:db8:1:2::1") == v6("2001:db8:1:2:ffff::9"));
	assert_true(v6("2001:db8:1:2::1") != v6("2001:db8:1:3::1"));
	/* ipc:// and unknown peers: no address bound, but never 0. */
	assert_true(kvpd_peer_value(&ipc) != 0 && kvpd_peer_value(NULL) != 0);
	assert_true(kvpd_peer_addr(kvpd_peer_value(&ipc)) == 0);
	assert_true(kvpd_peer_addr(kvpd_peer_value(NULL)) == 0);
	/* Trust does not change the address. */
	assert_true(kvpd_peer_addr(v4("10.0.0.1") | KVPD_PEER_TRUSTED) == kvpd_peer_addr(v4("10.0.0.1")));
}

static void
test_conn_bounds_one_connection(void **state)
{
	(void)state;
	struct kvpd_bound_verdict v;
	uint64_t t = v4("10.0.0.1") | KVPD_PEER_TRUSTED;
	struct kvpd_held h[] = {{10, 7, t}, {11, 7, t}, {12, 7, t}, {13, 8, t}};

	/* 3 of 8 held by pipe 7: it may send again; a 4th (half) closes it, trusted or not. */
	kvpd_bound_check(h, 3, 8, 7, t, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	struct kvpd_held h4[] = {{10, 7, t}, {11, 7, t}, {12, 7, t}, {13, 7, t}};
	kvpd_bound_check(h4, 4, 8, 7, t, NOW, STALE, &v);
	assert_false(v.serve);
	assert_int_equal(v.close, 7);
	assert_int_equal(v.reason, KVPD_CLOSE_NO_READ);
	/* Another trusted connection is served whatever the trusted ones hold. */
	kvpd_bound_check(h, 4, 8, 9, t, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	/* Bad input changes nothing and serves. */
	kvpd_bound_check(NULL, 0, 8, 9, t, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	kvpd_bound_check(h, 4, 8, 0, t, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	kvpd_bound_check(h, 4, 8, 9, t, NOW, STALE, NULL);
	/* Each bound's log line names it; an unknown reason still gets one. */
	assert_non_null(strstr(kvpd_bound_why(KVPD_CLOSE_ADDRESS_BOUND), "address"));
	assert_non_null(strstr(kvpd_bound_why(KVPD_CLOSE_UNAUTH_BOUND), "unauthenticated peers"));
	assert_non_null(strstr(kvpd_bound_why(KVPD_CLOSE_NO_READ), "half the contexts"));
	assert_non_null(kvpd_bound_why((enum kvpd_close_reason)99));
}

static void
test_conn_bounds_one_address(void **state)
{
	(void)state;
	struct kvpd_bound_verdict v;
	uint64_t a = v4("192.0.2.1"), b = v4("192.0.2.2");
	/* 8 contexts: one unauthenticated address holds 2 at most. */
	struct kvpd_held h[] = {{50, 3, a}, {20, 4, a}};

	kvpd_bound_check(h, 1, 8, 5, a, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	/* At its share: the address's longest waiter (pipe 4, since 20) goes, the request is served. */
	kvpd_bound_check(h, 2, 8, 5, a, NOW, STALE, &v);
	assert_true(v.serve);
	assert_int_equal(v.close, 4);
	assert_int_equal(v.reason, KVPD_CLOSE_ADDRESS_BOUND);
	/* ...or the request's own connection, when it is that waiter. */
	kvpd_bound_check(h, 2, 8, 4, a, NOW, STALE, &v);
	assert_false(v.serve);
	assert_int_equal(v.close, 4);
	/* Another address is not bound by a's share. */
	kvpd_bound_check(h, 2, 8, 6, b, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	/* Nor is a's own trusted connection. */
	kvpd_bound_check(h, 2, 8, 6, a | KVPD_PEER_TRUSTED, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	/* ipc:// peers share no address. */
	uint64_t local = kvpd_peer_value(NULL);
	struct kvpd_held l[] = {{50, 3, local}, {20, 4, local}};
	kvpd_bound_check(l, 2, 8, 5, local, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
}

static void
test_conn_bounds_all_unauthenticated(void **state)
{
	(void)state;
	struct kvpd_bound_verdict v;
	uint64_t t = v4("198.51.100.7") | KVPD_PEER_TRUSTED;
	/* Four addresses, one context each, and two trusted: 8 contexts. */
	struct kvpd_held h[] = {{40, 1, v4("192.0.2.1")}, {30, 2, v4("192.0.2.2")},
	                        {35, 3, v4("192.0.2.3")}, {45, 4, v4("192.0.2.4")},
	                        {5, 9, t}, {6, 9, t}};

	kvpd_bound_check(h, 3, 8, 5, v4("192.0.2.5"), NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	/* Half the contexts held by unauthenticated peers: the longest of them
	 * (pipe 2), not a trusted one that waited longer, goes. */
	kvpd_bound_check(h, 6, 8, 5, v4("192.0.2.5"), NOW, STALE, &v);
	assert_true(v.serve);
	assert_int_equal(v.close, 2);
	assert_int_equal(v.reason, KVPD_CLOSE_UNAUTH_BOUND);
	/* An authenticated request is served and closes nothing. */
	kvpd_bound_check(h, 6, 8, 10, t, NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	/* Replies that have not waited STALE are readers' in flight: not counted. */
	struct kvpd_held young[] = {{990, 1, v4("192.0.2.1")}, {995, 2, v4("192.0.2.2")},
	                            {960, 3, v4("192.0.2.3")}, {999, 4, v4("192.0.2.4")}};
	kvpd_bound_check(young, 4, 8, 5, v4("192.0.2.5"), NOW, STALE, &v);
	assert_true(v.serve && v.close == 0);
	/* One context: any unauthenticated holder goes for the next one. */
	kvpd_bound_check(h, 1, 1, 5, kvpd_peer_value(NULL), NOW, STALE, &v);
	assert_int_equal(v.close, 1);
}

static void
test_conn_bounds_pressure(void **state)
{
	(void)state;
	size_t slow = 99;
	enum kvpd_close_reason why = KVPD_CLOSE_IDLE;
	uint64_t t = v4("198.51.100.7") | KVPD_PEER_TRUSTED, u = v4("192.0.2.1");
	struct kvpd_held h[] = {{100, 1, t}, {200, 2, u}, {250, 3, u}, {900, 4, u}};

	/* At 450 with 250 ms: two of four slow (1 and 2): half; unauthenticated 2 goes first. */
	assert_int_equal(kvpd_pressure_victim(h, 4, 4, 450, 250, 1000, &slow, &why), 2);
	assert_int_equal(slow, 2);
	assert_int_equal(why, KVPD_CLOSE_NO_READ);
	/* Fewer than half slow, no share passed (stale 1000 ms): nothing. */
	assert_int_equal(kvpd_pressure_victim(h, 4, 8, 450, 250, 1000, &slow, &why), 0);
	assert_int_equal(slow, 2);
	/* Only trusted ones slow: the longest of them. */
	assert_int_equal(kvpd_pressure_victim(h, 1, 2, 450, 250, 1000, &slow, NULL), 1);
	/* A clock behind a send's start counts it as not slow. */
	assert_int_equal(kvpd_pressure_victim(h, 4, 4, 50, 250, 1000, &slow, NULL), 0);
	assert_int_equal(kvpd_pressure_victim(NULL, 4, 4, 450, 250, 1000, NULL, NULL), 0);
	/* No request comes, but address u holds 3 stale replies of 16 contexts
	 * (its share: 4)... then 5: past it, its longest waiter goes. */
	struct kvpd_held a[] = {{300, 2, u}, {200, 3, u}, {250, 4, u}, {260, 5, u}, {270, 6, u}};
	assert_int_equal(kvpd_pressure_victim(a, 3, 16, 450, 250, 50, &slow, &why), 0);
	assert_int_equal(kvpd_pressure_victim(a, 5, 16, 450, 250, 50, &slow, &why), 3);
	assert_int_equal(why, KVPD_CLOSE_ADDRESS_BOUND);
	/* Five addresses, one stale reply each, of 8 contexts (share 4): the longest goes. */
	struct kvpd_held b[] = {{300, 1, v4("192.0.2.1")}, {200, 2, v4("192.0.2.2")},
	                        {250, 3, v4("192.0.2.3")}, {260, 4, v4("192.0.2.4")},
	                        {270, 5, v4("192.0.2.5")}};
	assert_int_equal(kvpd_pressure_victim(b, 4, 8, 400, 1000, 10, &slow, &why), 0);
	assert_int_equal(kvpd_pressure_victim(b, 5, 8, 400, 1000, 10, &slow, &why), 2);
	assert_int_equal(why, KVPD_CLOSE_UNAUTH_BOUND);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conn_bounds_peer_values),
		cmocka_unit_test(test_conn_bounds_one_connection),
		cmocka_unit_test(test_conn_bounds_one_address),
		cmocka_unit_test(test_conn_bounds_all_unauthenticated),
		cmocka_unit_test(test_conn_bounds_pressure),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
