/* SPDX-License-Identifier: Apache-2.0 */
/* kvpoold's configuration: defaults, file, environment and flags, in that order. */
#define _POSIX_C_SOURCE 200809L
#include "kvp_test.h"

#include <stdlib.h>
#include <unistd.h>

#include "service/config/config.h"
#include "service/log.h"

static FILE *sink;

static int
load(struct kvpd_config *c, char **argv, char **envp)
{
	int argc = 0;
	while (argv[argc])
		argc++;
	return kvpd_config_load(c, argc, argv, envp, sink, sink);
}

static void
test_config_defaults_are_documented_values(void **state)
{
	struct kvpd_config c;
	char *argv[] = {"kvpoold", NULL};

	(void)state;
	assert_int_equal(load(&c, argv, NULL), 0);
	assert_int_equal(c.num_rpc, 1);
	assert_string_equal(c.rpc[0], "ipc:///tmp/kvpool.ipc");
	assert_string_equal(c.admin, "http://127.0.0.1:9471");
	assert_int_equal(c.num_pools, 1);
	assert_string_equal(c.pools[0].name, "default");
	assert_int_equal(c.pools[0].num_blocks, 4096);
	assert_int_equal(c.pools[0].block_size, 16);
	assert_false(c.pools[0].has_seed);
	assert_int_equal(c.lease_ms, 30000);
	assert_int_equal(c.contexts, 8);
	assert_int_equal(c.max_ids, 65536);
}

static void
test_config_flags_over_env_over_file(void **state)
{
	struct kvpd_config c;
	char path[64], tok[64];
	snprintf(path, sizeof(path), "/tmp/kvpool-config-%d.conf", (int)getpid());
	snprintf(tok, sizeof(tok), "/tmp/kvpool-config-%d.token", (int)getpid());
	FILE *f = fopen(path, "w");
	fprintf(f, "# a comment\nlease-ms = 1000\ncontexts = 3\nmax-ids = 10\n"
	           "pool = filepool:100\nrpc = tcp://127.0.0.1:9999\n");
	fclose(f);
	f = fopen(tok, "w");
	fprintf(f, "tok123\n\n");
	fclose(f);
	char cfgarg[96];
	snprintf(cfgarg, sizeof(cfgarg), "KVPOOL_CONFIG=%s", path);
	char tokarg[96];
	snprintf(tokarg, sizeof(tokarg), "KVPOOL_TOKEN_FILE=%s", tok);
	char *envp[] = {cfgarg, "KVPOOL_CONTEXTS=5", "KVPOOL_POOL=a:10;name=b,blocks=20,seed=0",
	                tokarg, NULL};
	char *argv[] = {"kvpoold", "--max-ids", "20", "--admin", "none", NULL};

	(void)state;
	assert_int_equal(load(&c, argv, envp), 0);
	assert_int_equal(c.lease_ms, 1000);   /* file */
	assert_int_equal(c.contexts, 5);      /* env over file */
	assert_int_equal(c.max_ids, 20);      /* flag over file */
	assert_string_equal(c.admin, "");     /* none */
	assert_string_equal(c.rpc[0], "tcp://127.0.0.1:9999");
	assert_int_equal(c.num_pools, 2);     /* env pools replace the file's */
	assert_string_equal(c.pools[0].name, "a");
	assert_int_equal(c.pools[0].num_blocks, 10);
	assert_string_equal(c.pools[1].name, "b");
	assert_true(c.pools[1].has_seed);
	assert_string_equal(c.pools[1].seed, "0");
	assert_string_equal(c.pools[0].token, "tok123"); /* trimmed */
	/* Flags' pools replace the environment's. */
	char *argv2[] = {"kvpoold", "--pool", "z:5:4", NULL};
	assert_int_equal(load(&c, argv2, envp), 0);
	assert_int_equal(c.num_pools, 1);
	assert_string_equal(c.pools[0].name, "z");
	assert_int_equal(c.pools[0].block_size, 4);
	unlink(path);
	unlink(tok);
}

static void
test_config_bad_settings_are_refused(void **state)
{
	struct kvpd_config c;
	char *bad[][6] = {
		{"kvpoold", "--nope", "1", NULL},
		{"kvpoold", "--lease-ms", "abc", NULL},
		{"kvpoold", "--lease-ms", "5", NULL},           /* below 100 */
		{"kvpoold", "--contexts", "0", NULL},
		{"kvpoold", "--pool", "x", NULL},                /* no block count */
		{"kvpoold", "--pool", "name=x,blocks=0", NULL},
		{"kvpoold", "--pool", "bad name:10", NULL},
		{"kvpoold", "--pool", "a:10", "--pool", "a:20", NULL},
		{"kvpoold", "--pool", "name=x,blocks=4,colour=red", NULL},
		{"kvpoold", "--rpc", "tls+tcp://127.0.0.1:1", NULL}, /* no certificate */
		{"kvpoold", "--tls-cert", "/x", NULL},             /* no key */
		{"kvpoold", "--max-ids", NULL},
		{"kvpoold", "stray", NULL},
		{"kvpoold", "--token-file", "/nonexistent/token", NULL},
	};

	(void)state;
	for (size_t i = 0; i < N_ELEMS(bad); i++)
		if (load(&c, bad[i], NULL) != -1)
			fail_msg("case %zu (%s %s) was accepted", i, bad[i][1], bad[i][2] ? bad[i][2] : "");
	char *help[] = {"kvpoold", "--help", NULL};
	assert_int_equal(load(&c, help, NULL), 1);
	char *version[] = {"kvpoold", "--pool", "bad", "--version", NULL};
	assert_int_equal(load(&c, version, NULL), 1); /* printed, whatever else is wrong */
}

/* Writes text to a fresh temporary file; returns its path (static). */
static const char *
conf_file(const char *text)
{
	static char path[64];
	snprintf(path, sizeof(path), "/tmp/kvpool-test-conf-%d", (int)getpid());
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
	return path;
}

/*
 * A line too long for the reader is refused whole: its tail must never be
 * read as a setting (here one that would open the admin port to all).
 * Directories and devices are not config files; an over-long variable says so.
 */
static void
test_config_long_lines_devices_and_directories_are_refused(void **state)
{
	static char text[12000];
	static char msg[4096];
	struct kvpd_config c;
	(void)state;

	memset(text, 0, sizeof(text));
	text[0] = '#';
	memset(text + 1, 'x', 5000);
	strcat(text, "admin = http://0.0.0.0:9999\n");
	const char *path = conf_file(text);
	char *argv[] = {"kvpoold", "--config", (char *)path, NULL};
	assert_int_equal(load(&c, argv, NULL), -1);
	/* The same settings on lines of their own are accepted. */
	path = conf_file("# a comment\nadmin = http://127.0.0.1:9999\n");
	assert_int_equal(load(&c, argv, NULL), 0);
	assert_string_equal(c.admin, "http://127.0.0.1:9999");
	unlink(path);

	char *dir[] = {"kvpoold", "--config", "/tmp", NULL};
	assert_int_equal(load(&c, dir, NULL), -1);
	char *dev[] = {"kvpoold", "--config", "/dev/zero", NULL};
	assert_int_equal(load(&c, dev, NULL), -1);

	/* An over-long KVPOOL_POOL is refused with a message naming it. */
	static char env[20000];
	snprintf(env, sizeof(env), "KVPOOL_POOL=");
	memset(env + strlen(env), 'p', 10000);
	char *envp[] = {env, NULL};
	char *plain[] = {"kvpoold", NULL};
	FILE *err = fmemopen(msg, sizeof(msg), "w");
	assert_non_null(err);
	assert_int_equal(kvpd_config_load(&c, 1, plain, envp, sink, err), -1);
	fclose(err);
	assert_non_null(strstr(msg, "KVPOOL_POOL is longer than"));
}

/* Writes n bytes to a fresh temporary file; returns its path (static). */
static const char *
token_file(const char *bytes, size_t n)
{
	static char path[64];
	snprintf(path, sizeof(path), "/tmp/kvpool-test-token-%d", (int)getpid());
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(bytes, 1, n, f), n);
	assert_int_equal(fclose(f), 0);
	return path;
}

/* Loads with err captured into msg (cap bytes). */
static int
load_err(struct kvpd_config *c, char **argv, char **envp, char *msg, size_t cap)
{
	int argc = 0;
	while (argv[argc])
		argc++;
	memset(msg, 0, cap);
	FILE *err = fmemopen(msg, cap - 1, "w");
	assert_non_null(err);
	int rv = kvpd_config_load(c, argc, argv, envp, sink, err);
	fclose(err);
	return rv;
}

/*
 * A token that would start a pool with no authentication (empty, white
 * space, a NUL first) is refused; 255 bytes with a newline are accepted; a
 * longer one is refused without being printed; --token is noted for a warning.
 */
static void
test_config_tokens_are_checked_and_never_printed(void **state)
{
	static char msg[2048], big[400], arg[420];
	struct kvpd_config c;
	(void)state;

	const char *bad[][2] = {{"", "empty"}, {" \n\t\n", "empty"}, {"\0secret\n", "NUL"}};
	for (size_t i = 0; i < 3; i++) {
		size_t n = i == 2 ? 8 : strlen(bad[i][0]);
		char *argv[] = {"kvpoold", "--token-file", (char *)token_file(bad[i][0], n), NULL};
		assert_int_equal(load_err(&c, argv, NULL, msg, sizeof(msg)), -1);
		assert_non_null(strstr(msg, bad[i][1]));
		char *pool[] = {"kvpoold", "--pool", NULL, NULL};
		static char spec[128];
		snprintf(spec, sizeof(spec), "name=a,blocks=8,token_file=%s", argv[2]);
		pool[2] = spec;
		assert_int_equal(load_err(&c, pool, NULL, msg, sizeof(msg)), -1);
	}

	memset(big, 'k', 255);
	big[255] = '\n';
	char *argv[] = {"kvpoold", "--token-file", (char *)token_file(big, 256), NULL};
	assert_int_equal(load_err(&c, argv, NULL, msg, sizeof(msg)), 0);
	assert_int_equal(strlen(c.pools[0].token), 255);
	assert_false(c.token_in_argv);

	memset(big, 'k', 300);
	argv[2] = (char *)token_file(big, 300);
	assert_int_equal(load_err(&c, argv, NULL, msg, sizeof(msg)), -1);
	assert_non_null(strstr(msg, "longer than 255"));
	assert_null(strstr(msg, "kkkkkkkk"));
	unlink(argv[2]);

	snprintf(arg, sizeof(arg), "--token=%.300s", big);
	char *flag[] = {"kvpoold", arg, NULL};
	assert_int_equal(load_err(&c, flag, NULL, msg, sizeof(msg)), -1);
	assert_non_null(strstr(msg, "longer than 255"));
	assert_null(strstr(msg, "kkkkkkkk"));
	char *empty[] = {"kvpoold", "--token", "  ", NULL};
	assert_int_equal(load_err(&c, empty, NULL, msg, sizeof(msg)), -1);
	char *good[] = {"kvpoold", "--token", "s3cret", NULL};
	assert_int_equal(load_err(&c, good, NULL, msg, sizeof(msg)), 0);
	assert_string_equal(c.pools[0].token, "s3cret");
	assert_true(c.token_in_argv);
}

/* The vLLM wire: off by default; ranks, offsets and the topic resolved or refused at start. */
static void
test_config_vllm_wire(void **state)
{
	struct kvpd_config c;
	(void)state;
	char *off[] = {"kvpoold", NULL};
	assert_int_equal(load(&c, off, NULL), 0);
	assert_string_equal(c.vllm.endpoint, "");
	assert_string_equal(c.vllm.topic, "kv@{pod}@{model}");
	assert_int_equal(c.vllm.buffer_steps, 10000);
	assert_int_equal(c.vllm.buffer_mib, 64);
	assert_int_equal(c.replay_mib, 64);
	assert_int_equal(c.vllm.hwm, 10000);
	assert_true(c.vllm.replay_topic);
	char *mib[] = {"kvpoold", "--replay-mib", "3", "--vllm-buffer-mib", "5", NULL};
	assert_int_equal(load(&c, mib, NULL), 0);
	assert_int_equal(c.replay_mib, 3);
	assert_int_equal(c.vllm.buffer_mib, 5);
	char *zero[] = {"kvpoold", "--replay-mib", "0", NULL};
	assert_int_not_equal(load(&c, zero, NULL), 0);
	/* libzmq's 0 means no limit: one subscriber that does not read could take every byte */
	char *hwm0[] = {"kvpoold", "--vllm-hwm", "0", NULL};
	assert_int_not_equal(load(&c, hwm0, NULL), 0);
	/* replay budgets: at least 1 MiB, a peer's within the total */
	char *rb[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--vllm-replay-peer-mib", "2",
	              "--vllm-replay-total-mib", "8", NULL};
	assert_int_equal(load(&c, rb, NULL), 0);
	assert_int_equal(c.vllm.replay_peer_mib, 2);
	assert_int_equal(c.vllm.replay_total_mib, 8);
	char *rb0[] = {"kvpoold", "--vllm-replay-total-mib", "0", NULL};
	assert_int_not_equal(load(&c, rb0, NULL), 0);
	char *rbx[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--vllm-replay-peer-mib", "9",
	               "--vllm-replay-total-mib", "8", NULL};
	assert_int_not_equal(load(&c, rbx, NULL), 0);

	char *two[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--vllm-replay", "tcp://*:5558",
	               "--pool", "a:10", "--pool", "name=b,blocks=10,model=llama,dp_rank=4",
	               "--vllm-format", "array", "--vllm-hashes", "bytes", "--vllm-pod", "p0",
	               NULL};
	char *env[] = {"KVPOOL_VLLM_REPLAY_TOPIC=off", NULL};
	assert_int_equal(load(&c, two, env), 0);
	assert_int_equal(c.pools[0].dp_rank, 0);
	assert_string_equal(c.pools[0].model, "a");
	assert_int_equal(c.pools[1].dp_rank, 4);
	assert_string_equal(c.pools[1].model, "llama");
	assert_true(c.vllm.array_form);
	assert_true(c.vllm.hash_bytes);
	assert_false(c.vllm.replay_topic);
	assert_string_equal(c.vllm.pod, "p0");

	/* ipc cannot be offset (vLLM refuses too), so a second pool at rank 1 is refused. */
	char *ipc[] = {"kvpoold", "--vllm-events", "ipc:///tmp/x", "--pool", "a:10", "--pool",
	               "b:10", NULL};
	assert_int_equal(load(&c, ipc, NULL), -1);
	char *same[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--pool", "a:10", "--pool",
	                "name=b,blocks=10,dp_rank=0", NULL};
	assert_int_equal(load(&c, same, NULL), -1);
	/* vLLM's own clash: rank 1's PUB port is rank 0's replay port. */
	char *clash[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--vllm-replay",
	                 "tcp://*:5558", "--pool", "a:10", "--pool", "b:10", NULL};
	assert_int_equal(load(&c, clash, NULL), -1);
	char *noev[] = {"kvpoold", "--vllm-replay", "tcp://*:5558", NULL};
	assert_int_equal(load(&c, noev, NULL), -1);
	char *noev2[] = {"kvpoold", "--vllm-replay-plain", "tcp://*:5559", NULL};
	assert_int_equal(load(&c, noev2, NULL), -1);
	/* The plain replay endpoint on the topic one's port, or on rank 1's PUB. */
	char *both[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--vllm-replay",
	                "tcp://*:5558", "--vllm-replay-plain", "tcp://*:5558", NULL};
	assert_int_equal(load(&c, both, NULL), -1);
	char *plain_clash[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--vllm-replay-plain",
	                       "tcp://*:5558", "--pool", "a:10", "--pool", "b:10", NULL};
	assert_int_equal(load(&c, plain_clash, NULL), -1);
	char *plain_ok[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--vllm-replay",
	                    "tcp://*:5558", "--vllm-replay-plain", "tcp://*:5559", NULL};
	assert_int_equal(load(&c, plain_ok, NULL), 0);
	assert_string_equal(c.vllm.replay_plain, "tcp://*:5559");
	char *topic[] = {"kvpoold", "--vllm-events", "tcp://*:5557", "--vllm-topic", "kv@{host}",
	                 NULL};
	assert_int_equal(load(&c, topic, NULL), -1);
	char *fmt[] = {"kvpoold", "--vllm-format", "json", NULL};
	assert_int_equal(load(&c, fmt, NULL), -1);
	char *unk[] = {"kvpoold", "--vllm-nope", "1", NULL};
	assert_int_equal(load(&c, unk, NULL), -1);
}

static int
count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
		n++;
	return n;
}

/* --log-level and --log-format: parsed like every setting, refused when unknown. */
static void
test_config_log_settings(void **state)
{
	struct kvpd_config c;
	(void)state;
	char *dflt[] = {"kvpoold", NULL};
	assert_int_equal(load(&c, dflt, NULL), 0);
	assert_int_equal(c.log_level, KVPD_INFO);
	assert_int_equal(c.log_format, KVPD_LOG_TEXT);
	char *set[] = {"kvpoold", "--log-level", "warn", NULL};
	char *envp[] = {"KVPOOL_LOG_FORMAT=json", NULL};
	assert_int_equal(load(&c, set, envp), 0);
	assert_int_equal(c.log_level, KVPD_WARN);
	assert_int_equal(c.log_format, KVPD_LOG_JSON);
	char *bad[] = {"kvpoold", "--log-level", "loud", NULL};
	assert_int_equal(load(&c, bad, NULL), -1);
	char *badf[] = {"kvpoold", "--log-format", "xml", NULL};
	assert_int_equal(load(&c, badf, NULL), -1);
	/* The actions have no variable: KVPOOL_CHECK_CONFIG does nothing. */
	char *chk[] = {"KVPOOL_CHECK_CONFIG=1", NULL};
	assert_int_equal(load(&c, dflt, chk), 0);
	assert_false(c.check_config);
}

/* --check-config: every problem of every source, not just the first; a good one passes. */
static void
test_config_check_reports_every_problem(void **state)
{
	struct kvpd_config c;
	static char msg[8192];
	char path[64];
	(void)state;
	snprintf(path, sizeof(path), "/tmp/kvpool-check-%d.conf", (int)getpid());
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("lease-ms = 5\nnot a setting line\npool = name=ok,blocks=64\n", f);
	fclose(f);
	char *envp[] = {"KVPOOL_CONTEXTS=0", NULL};
	char *argv[] = {"kvpoold", "--check-config", "--config", path, "--max-ids", "x",
	                "--pool", "name=w,groups=full:16+sliding_window:16:0",
	                "--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem",
	                "--rpc", "ipc:///nonexistent-dir/k.ipc", "--rpc", "udp://127.0.0.1:1",
	                "--admin", "ftp://127.0.0.1:1", "--pool",
	                "name=huge,blocks=1073741824,layers=1024,heads=64,head_size=256", NULL};
	assert_int_equal(load_err(&c, argv, envp, msg, sizeof(msg)), -1);
	const char *want[] = {
		"bad value for lease-ms", "expected name = value", "KVPOOL_CONTEXTS",
		"bad value for max-ids", "sliding_window", "tls-cert /nonexistent/cert.pem",
		"tls-key /nonexistent/key.pem", "cannot create a socket in /nonexistent-dir",
		"scheme udp", "scheme ftp", "host memory", "problem(s) in the configuration"};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		if (strstr(msg, want[i]) == NULL)
			fail_msg("--check-config did not report '%s'; it said:\n%s", want[i], msg);
	assert_int_equal(count(msg, "problem(s) in the configuration"), 1);
	/* Without --check-config the first problem stops it: one message. */
	assert_int_equal(load_err(&c, argv + 1, envp, msg, sizeof(msg)), -1);
	assert_null(strstr(msg, "problem(s)"));
	/* What the daemon refuses when it binds, the check refuses first. */
	char *binds[] = {"kvpoold", "--check-config", "--pool", "name=g,blocks=64",
	                 "--rpc", "tcp://127.0.0.1:99999", "--rpc", "tcp://127.0.0.1:7470",
	                 "--events", "tcp://0.0.0.0:7470", "--admin", "http://127.0.0.1:abc",
	                 "--region-dir", "/nonexistent/regions", NULL};
	assert_int_equal(load_err(&c, binds, NULL, msg, sizeof(msg)), -1);
	const char *bind_want[] = {"port 99999 is not a number in 0..65535",
	                           "port abc is not a number", "one port for two endpoints",
	                           "region-dir /nonexistent/regions"};
	for (size_t i = 0; i < sizeof(bind_want) / sizeof(bind_want[0]); i++)
		if (strstr(msg, bind_want[i]) == NULL)
			fail_msg("--check-config did not report '%s'; it said:\n%s", bind_want[i], msg);
	/* restart=warm needs a region: a pool without an executor, or region-dir none, has none. */
	char *warm[] = {"kvpoold", "--check-config", "--region-dir", "none", "--pool",
	                "name=w1,blocks=64,restart=warm", "--pool",
	                "name=w2,blocks=64,executor=none,restart=warm", "--pool",
	                "name=w3,blocks=64,restart=lukewarm", "--pool",
	                "name=w4,blocks=64,disk=/tmp/w4.disk,cluster_wait_ms=5",
	                "--pool", "name=w5,blocks=64,disk=relative.disk,disk_rows=8", "--pool",
	                "name=w6,blocks=64,disk=/nonexistent-dir/w6.disk,disk_rows=8", "--pool",
	                "name=w7,blocks=64,disk=/tmp/w7.disk,disk_rows=1073741824", NULL};
	assert_int_equal(load_err(&c, warm, NULL, msg, sizeof(msg)), -1);
	const char *warm_want[] = {"pool w1: restart=warm needs a shared region, which needs a "
	                           "region-dir", "pool w2: restart=warm needs a shared region, "
	                           "which needs executor=cpu", "restart=lukewarm",
	                           "pool w4: disk=/tmp/w4.disk needs disk_rows",
	                           "disk=relative.disk", "pool w6: disk=/nonexistent-dir/w6.disk: "
	                           "/nonexistent-dir is not a directory", "pool w7: disk=/tmp/w7.disk "
	                           "needs"};
	for (size_t i = 0; i < sizeof(warm_want) / sizeof(warm_want[0]); i++)
		if (strstr(msg, warm_want[i]) == NULL)
			fail_msg("--check-config did not report '%s'; it said:\n%s", warm_want[i], msg);
	/* One URL twice; a certificate that is not one (the daemon's own loader says so). */
	char bad_pem[] = "/tmp/kvpool-check-XXXXXX";
	int pfd = mkstemp(bad_pem);
	assert_true(pfd >= 0);
	assert_int_equal(write(pfd, "not a certificate\n", 18), 18);
	close(pfd);
	char *twice[] = {"kvpoold", "--check-config", "--pool", "name=g,blocks=64",
	                 "--rpc", "ipc:///tmp/kvpool-twice.ipc", "--rpc", "ipc:///tmp/kvpool-twice.ipc",
	                 NULL};
	assert_int_equal(load_err(&c, twice, NULL, msg, sizeof(msg)), -1);
	if (strstr(msg, "is given twice") == NULL)
		fail_msg("--check-config passed one --rpc given twice; it said:\n%s", msg);
	char *tls[] = {"kvpoold", "--check-config", "--pool", "name=g,blocks=64",
	               "--rpc", "tls+tcp://127.0.0.1:7471", "--tls-cert", bad_pem, "--tls-key",
	               bad_pem, NULL};
	assert_int_equal(load_err(&c, tls, NULL, msg, sizeof(msg)), -1);
	if (strstr(msg, "TLS certificate") == NULL)
		fail_msg("--check-config passed an unparsable certificate; it said:\n%s", msg);
	unlink(bad_pem);
	/* A good configuration passes the check and says so by returning 0. */
	char *good[] = {"kvpoold", "--check-config", "--pool", "name=g,blocks=64", "--rpc",
	                "ipc:///tmp/kvpool-check.ipc", "--admin", "http://127.0.0.1:9471", NULL};
	assert_int_equal(load_err(&c, good, NULL, msg, sizeof(msg)), 0);
	assert_true(c.check_config);
	assert_string_equal(msg, "");
	unlink(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config_defaults_are_documented_values),
		cmocka_unit_test(test_config_flags_over_env_over_file),
		cmocka_unit_test(test_config_bad_settings_are_refused),
		cmocka_unit_test(test_config_long_lines_devices_and_directories_are_refused),
		cmocka_unit_test(test_config_tokens_are_checked_and_never_printed),
		cmocka_unit_test(test_config_vllm_wire),
		cmocka_unit_test(test_config_log_settings),
		cmocka_unit_test(test_config_check_reports_every_problem),
	};
	sink = fopen("/dev/null", "w");
	int rv = cmocka_run_group_tests(tests, NULL, NULL);
	fclose(sink);
	return rv;
}
