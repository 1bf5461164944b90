/* SPDX-License-Identifier: Apache-2.0 */
/* service_fixture.c: the daemon test_service and test_service_wire run against. */
#include "daemon_util.h"

#include "kvp_test.h"

#include "service_fixture.h"

char ipc_url[256], tcp_url[256], admin_url[64], token_pool[256], token_path[96],
	events_url[96], log_path[96];
pid_t daemon_pid;

int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(admin_url, sizeof(admin_url), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(token_path, sizeof(token_path), "/tmp/kvpool-test-%d.token", (int)getpid());
	FILE *f = fopen(token_path, "w");
	if (f == NULL || fputs("s3cret\n", f) < 0 || fclose(f) != 0)
		return -1;
	snprintf(token_pool, sizeof(token_pool), "name=locked,blocks=8,block_size=4,token_file=%s",
	         token_path);
	snprintf(events_url, sizeof(events_url), "ipc:///tmp/kvpool-test-events-%d.ipc", (int)getpid());
#define CBOR0 "seed=0,hash_algo=sha256_cbor"
	const char *args[] = {"--rpc", ipc_url, "--rpc", tcp_url, "--admin", admin_url,
	                      "--events", events_url,
	                      /* The tests' vectors are sha256_cbor's with seed "0". */
	                      "--pool", "name=fresh,blocks=10,block_size=4," CBOR0,
	                      "--pool", token_pool,
	                      "--pool", "name=default,blocks=10,block_size=4," CBOR0,
	                      "--pool", "name=secure,blocks=32,block_size=4," CBOR0,
	                      "--pool", "name=tiny,blocks=8,block_size=4," CBOR0,
	                      "--max-ids", "64", "--max-sessions", "12", "--max-msg-bytes", "65536",
	                      "--lease-ms", "5000", "--log-format", "json", NULL};
	unsetenv("KVPOOL_TOKEN");
	snprintf(log_path, sizeof(log_path), "/tmp/kvpool-test-%d.log", (int)getpid());
	daemon_pid = daemon_start_log(args, log_path);
	return daemon_pid > 0 ? 0 : -1;
}

int
teardown(void **state)
{
	(void)state;
	unlink(token_path);
	/* The daemon checks its invariants on the way out: exit 0 means they held. */
	int rv = daemon_stop(daemon_pid) == 0 ? 0 : -1;
	/* Its log, for whoever reads the test's output. */
	FILE *f = fopen(log_path, "r");
	char line[4096];
	while (f && fgets(line, sizeof(line), f))
		fputs(line, stderr);
	if (f)
		fclose(f);
	unlink(log_path);
	return rv;
}

struct kvp_client *
open_on(const char *url, const char *pool, uint32_t lease_ms)
{
	struct kvp_client_options o = {.url = url, .pool = pool, .lease_ms = lease_ms,
	                               .timeout_ms = 2000, .retries = 3};
	struct kvp_client *c = NULL;
	int rv = KVP_EBUSY;
	/* The daemon may still be starting: nng redials in the background. */
	for (int i = 0; i < 50 && rv == KVP_EBUSY; i++)
		rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK)
		fail_msg("open %s/%s: %s", url, pool, kvp_status_name(rv));
	return c;
}

/* The daemon's log so far, into buf. */
void
read_log(char *buf, size_t cap)
{
	FILE *f = fopen(log_path, "r");
	size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
	buf[n] = '\0';
	if (f)
		fclose(f);
}

void
wait_free(struct kvp_client *c, uint32_t want, struct kvp_client_stats *st)
{
	assert_int_equal(kvp_client_stats(c, st), KVP_OK);
	for (int i = 0; i < 100 && st->num_free != want; i++) {
		sleep_ms(50);
		assert_int_equal(kvp_client_stats(c, st), KVP_OK);
	}
}

uint32_t
tiny_free(struct kvp_client *c)
{
	struct kvp_client_stats st;
	assert_int_equal(kvp_client_stats(c, &st), KVP_OK);
	if (st.num_free < 3 || st.num_free > 7)
		fail_msg("tiny pool has %u free blocks; the test needs 3 to 7", st.num_free);
	return st.num_free;
}
