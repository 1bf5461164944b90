/* SPDX-License-Identifier: Apache-2.0 */
/* kvpoold's configuration: defaults, file, environment and flags, in that order. */
#include "kvp_test.h"

#include <stdlib.h>
#include <unistd.h>

#include "service/config.h"

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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config_defaults_are_documented_values),
		cmocka_unit_test(test_config_flags_over_env_over_file),
		cmocka_unit_test(test_config_bad_settings_are_refused),
	};
	sink = fopen("/dev/null", "w");
	int rv = cmocka_run_group_tests(tests, NULL, NULL);
	fclose(sink);
	return rv;
}
