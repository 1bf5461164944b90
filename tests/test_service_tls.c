/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoold over tls+tcp:// with mutual TLS: a CA, a server certificate and a
 * client certificate are made at test time with the openssl command; a
 * client with the CA and its certificate is served, one without a
 * certificate is not; each refusal is named to the client (certificate
 * required, unknown CA on either side, name mismatch) and counted and
 * logged by the daemon. Skipped (stated) if the openssl command is missing.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "clients/c/subscriber.h"

static char ev_url[64];
static char dir[128], url[64], ca[192], srv_cert[192], srv_key[192], cli_cert[192], cli_key[192];
static char other_ca[192], other_cert[192], other_key[192]; /* a CA the daemon does not know */
static pid_t daemon_pid;
static int have_openssl;

static int
sh(const char *cmd)
{
	int rv = system(cmd);
	return WIFEXITED(rv) ? WEXITSTATUS(rv) : -1;
}

static int
setup(void **state)
{
	char cmd[2048];

	(void)state;
	have_openssl = sh("openssl version >/dev/null 2>&1") == 0;
	if (!have_openssl)
		return 0;
	snprintf(dir, sizeof(dir), "/tmp/kvpool-tls-%d", (int)getpid());
	snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
	snprintf(srv_cert, sizeof(srv_cert), "%s/server.pem", dir);
	snprintf(srv_key, sizeof(srv_key), "%s/server.key", dir);
	snprintf(cli_cert, sizeof(cli_cert), "%s/client.pem", dir);
	snprintf(cli_key, sizeof(cli_key), "%s/client.key", dir);
	snprintf(other_ca, sizeof(other_ca), "%s/other-ca.pem", dir);
	snprintf(other_cert, sizeof(other_cert), "%s/other.pem", dir);
	snprintf(other_key, sizeof(other_key), "%s/other.key", dir);
	snprintf(cmd, sizeof(cmd),
	         "set -e; mkdir -p %s; cd %s; "
	         "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=kvpool-test-ca "
	         "  -keyout ca.key -out ca.pem 2>/dev/null; "
	         "for who in server client; do "
	         "  openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout $who.key "
	         "    -out $who.csr 2>/dev/null; "
	         "  printf 'subjectAltName=DNS:localhost\\n' > $who.ext; "
	         "  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
	         "    -extfile $who.ext -out $who.pem 2>/dev/null; "
	         "done; "
	         "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca "
	         "  -keyout other-ca.key -out other-ca.pem 2>/dev/null; "
	         "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout other.key "
	         "  -out other.csr 2>/dev/null; "
	         "openssl x509 -req -in other.csr -CA other-ca.pem -CAkey other-ca.key "
	         "  -CAcreateserial -days 2 -extfile client.ext -out other.pem 2>/dev/null",
	         dir, dir);
	if (sh(cmd) != 0)
		return -1;
	snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", 22000 + 2 * (int)(getpid() % 4000));
	char admin[64];
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(ev_url, sizeof(ev_url), "tls+tcp://127.0.0.1:%d", 22000 + 2 * (int)(getpid() % 4000) + 1);
	const char *args[] = {"--rpc", url, "--admin", admin, "--events", ev_url, "--tls-cert", srv_cert,
	                      "--tls-key", srv_key, "--tls-ca", ca,
	                      "--pool", "name=default,blocks=16,block_size=4", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	char cmd[256];
	(void)state;
	if (!have_openssl)
		return 0;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	(void)sh(cmd);
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

static void
test_service_tls_mutual_client_is_served(void **state)
{
	struct kvp_client_options o = {.url = url, .tls_ca_file = ca, .tls_cert_file = cli_cert,
	                               .tls_key_file = cli_key, .tls_server_name = "localhost",
	                               .timeout_ms = 3000, .retries = 3};
	struct kvp_client *c = NULL;
	int32_t ids[3];
	int rv = KVP_EBUSY;

	(void)state;
	if (!have_openssl)
		skip(); /* stated: no openssl command to make certificates */
	for (int i = 0; i < 10 && rv == KVP_EBUSY; i++)
		rv = kvp_client_open(&o, &c);
	assert_ok(rv);
	assert_ok(kvp_client_allocate(c, 3, ids));
	assert_ids(ids, 3, 1, 2, 3);
	kvp_client_close(c);
}

static void
test_service_tls_client_without_certificate_is_refused(void **state)
{
	struct kvp_client_options o = {.url = url, .tls_ca_file = ca, .tls_server_name = "localhost",
	                               .timeout_ms = 300, .retries = 1};
	struct kvp_client *c = NULL;

	(void)state;
	if (!have_openssl)
		skip();
	int rv = kvp_client_open(&o, &c);
	assert_int_not_equal(rv, KVP_OK);
	assert_null(c);
	print_message("no client certificate: %s\n", kvp_client_open_detail());
	assert_non_null(strstr(kvp_client_open_detail(), "certificate required"));
}

/* Opens with o, expecting a refusal whose detail says want. */
static void
refused_saying(struct kvp_client_options *o, const char *want)
{
	struct kvp_client *c = NULL;
	assert_int_equal(kvp_client_open(o, &c), KVP_EUNAVAILABLE);
	assert_null(c);
	print_message("%s\n", kvp_client_open_detail());
	assert_non_null(strstr(kvp_client_open_detail(), want));
}

/* Each way a handshake fails is named to the client; the daemon counts and logs them. */
static void
test_service_tls_failures_are_named_and_counted(void **state)
{
	struct kvp_client_options o = {.url = url, .tls_ca_file = other_ca, .tls_cert_file = cli_cert,
	                               .tls_key_file = cli_key, .tls_server_name = "localhost",
	                               .timeout_ms = 300, .retries = 1, .connect_timeout_ms = 500};

	(void)state;
	if (!have_openssl)
		skip();
	double before = metric_value("kvpool_connections_closed_total{reason=\"tls_handshake\"}");
	assert_true(before >= 0);
	refused_saying(&o, "unknown CA: the daemon's certificate is not signed by a CA in");
	o.tls_ca_file = ca;
	o.tls_server_name = "kvpool.example";
	refused_saying(&o, "name mismatch: the daemon's certificate does not name kvpool.example");
	o.tls_server_name = "localhost";
	o.tls_cert_file = other_cert;
	o.tls_key_file = other_key;
	refused_saying(&o, "unknown CA: the daemon does not trust the CA that signed our client");
	double after = before;
	for (int i = 0; i < 40 && after <= before; i++) { /* counted once a second */
		sleep_ms(100);
		after = metric_value("kvpool_connections_closed_total{reason=\"tls_handshake\"}");
	}
	assert_true(after > before);
}

/*
 * Verification is the default: with no CA given the system's bundle is
 * used (it does not know the test CA, so the handshake fails, and says so);
 * an IP address URL needs a server name; only tls_insecure skips the check.
 */
static void
test_service_tls_verifies_the_daemon_by_default(void **state)
{
	struct kvp_client_options o = {.url = url, .tls_cert_file = cli_cert, .tls_key_file = cli_key,
	                               .tls_server_name = "localhost", .timeout_ms = 500,
	                               .retries = 1, .connect_timeout_ms = 1500};
	struct kvp_client *c = NULL;
	bool bundle = access("/etc/ssl/certs/ca-certificates.crt", R_OK) == 0;

	(void)state;
	if (!have_openssl)
		skip();
	int rv = kvp_client_open(&o, &c);
	print_message("no CA given: %s\n", kvp_client_open_detail());
	assert_int_not_equal(rv, KVP_OK);
	assert_null(c);
	if (bundle)
		assert_non_null(strstr(kvp_client_open_detail(), "TLS handshake with"));
	else
		assert_non_null(strstr(kvp_client_open_detail(), "no system CA bundle"));

	o.tls_ca_file = ca;
	o.tls_server_name = NULL;
	assert_int_equal(kvp_client_open(&o, &c), KVP_EINVAL);
	assert_non_null(strstr(kvp_client_open_detail(), "IP address"));

	o.tls_ca_file = NULL;
	o.tls_insecure = true;
	o.connect_timeout_ms = 5000;
	assert_ok(kvp_client_open(&o, &c));
	kvp_client_close(c);
}

static int batches_seen;

static void
on_batch(void *ctx, const char *pool, uint64_t epoch, uint64_t seq, uint64_t ts,
         const struct kvp_event_batch *b)
{
	(void)ctx;
	(void)epoch;
	(void)seq;
	(void)ts;
	batches_seen += kvp_event_batch_count(b) > 0;
}

/* The event stream over tls+tcp:// with mutual TLS. */
static void
test_service_tls_events_reach_a_tls_subscriber(void **state)
{
	struct kvp_sub_options so = {.events_url = ev_url, .rpc_url = url, .tls_ca_file = ca,
	                             .tls_cert_file = cli_cert, .tls_key_file = cli_key,
	                             .tls_server_name = "localhost", .timeout_ms = 3000};
	struct kvp_sub_handler h = {.batch = on_batch};
	struct kvp_client_options o = {.url = url, .tls_ca_file = ca, .tls_cert_file = cli_cert,
	                               .tls_key_file = cli_key, .tls_server_name = "localhost",
	                               .timeout_ms = 3000, .retries = 3};
	struct kvp_sub *sub = NULL;
	struct kvp_client *c = NULL;
	int32_t ids[2];
	int64_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	(void)state;
	if (!have_openssl)
		skip();
	assert_ok(kvp_sub_open(&so, &h, &sub));
	assert_ok(kvp_client_open(&o, &c));
	sleep_ms(300); /* the SUB's TLS handshake */
	assert_ok(kvp_client_allocate(c, 2, ids));
	struct kvp_client_cache ca_ = {.block_ids = ids, .num_block_ids = 2, .num_full_blocks = 2,
	                               .tokens = tok, .num_tokens = 8};
	assert_ok(kvp_client_cache(c, &ca_, NULL));
	for (int i = 0; i < 100 && batches_seen == 0; i++)
		assert_ok(kvp_sub_poll(sub, 20));
	assert_true(batches_seen >= 1);
	kvp_client_close(c);
	kvp_sub_close(sub);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_service_tls_mutual_client_is_served),
		cmocka_unit_test(test_service_tls_client_without_certificate_is_refused),
		cmocka_unit_test(test_service_tls_failures_are_named_and_counted),
		cmocka_unit_test(test_service_tls_verifies_the_daemon_by_default),
		cmocka_unit_test(test_service_tls_events_reach_a_tls_subscriber),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
