/* SPDX-License-Identifier: Apache-2.0 */
/*
 * service_fixture.h: the kvpoold that test_service and test_service_wire
 * each start (fork+exec) for their tests: its URLs, pools and log, and
 * helpers to open a session on it and read its log.
 */
#ifndef KVP_SERVICE_FIXTURE_H
#define KVP_SERVICE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "clients/c/kvpool.h"

extern char ipc_url[256], tcp_url[256], admin_url[64], token_pool[256], token_path[96],
	events_url[96], log_path[96];
extern pid_t daemon_pid;

/* cmocka group setup and teardown: the daemon (its exit status checks its invariants). */
int setup(void **state);
int teardown(void **state);

/* A session on url's pool, retried while the daemon starts; fails the test if it cannot. */
struct kvp_client *open_on(const char *url, const char *pool, uint32_t lease_ms);

/*
 * Polls c's pool (Stats every 50 ms, 5 s at most) until it has want free
 * blocks, as a lease expiry releases them; the last Stats in *st.
 */
void wait_free(struct kvp_client *c, uint32_t want, struct kvp_client_stats *st);

/*
 * The free blocks of c's pool (the tiny one), failing the test outside
 * 3..7: earlier tests may still hold some of it.
 */
uint32_t tiny_free(struct kvp_client *c);

/* The daemon's log so far, NUL-terminated, into buf. */
void read_log(char *buf, size_t cap);

#endif /* KVP_SERVICE_FIXTURE_H */
