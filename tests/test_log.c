/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoold's log lines: text and json forms, escaping, long records, the
 * rate limit; and a configuration that does not load, reported by a real
 * kvpoold in the log format it asked for.
 */
#define _POSIX_C_SOURCE 200809L
#include "kvp_test.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spawn.h"

#include "service/config/config.h"
#include "service/log.h"

/* 2026-11-22T10:00:00.123Z */
#define WALL 1795341600123ull

static void
test_log_text_line_has_time_level_component_and_fields(void **state)
{
	char buf[512];
	struct kvpd_log_field f[] = {{"pool", "default"}, {"reason", "wrong token=x"}, {"e", ""}};
	(void)state;
	size_t n = kvpd_log_format_line(buf, sizeof(buf), KVPD_LOG_TEXT, WALL, KVPD_WARN, "auth",
	                                "refused\nauthentication", f, 3);
	assert_int_equal(n, strlen(buf));
	assert_string_equal(buf, "2026-11-22T10:00:00.123Z warn  auth: refused authentication "
	                         "pool=default reason=\"wrong token=x\" e=\"\"\n");
}

static void
test_log_json_line_is_one_valid_object(void **state)
{
	char buf[1024];
	/* Quotes, backslashes, control bytes and a byte that is not UTF-8. */
	struct kvpd_log_field f[] = {{"peer", "127.0.0.1:5"}, {"client", "a\"b\\c\x01\xff\xc3\xa9"},
	                             {"pid", "32555"}, {"tls", "false"},
	                             {"session", "16232549680349265509"}, {"port", "007"}};
	(void)state;
	kvpd_log_format_line(buf, sizeof(buf), KVPD_LOG_JSON, WALL, KVPD_INFO, "session",
	                     "lease \"expired\"", f, 6);
	assert_int_equal(strchr(buf, '\n') - buf, (long)strlen(buf) - 1); /* one line */
	cJSON *o = cJSON_Parse(buf);
	assert_non_null(o);
	assert_string_equal(cJSON_GetObjectItem(o, "ts")->valuestring, "2026-11-22T10:00:00.123Z");
	assert_string_equal(cJSON_GetObjectItem(o, "level")->valuestring, "info");
	assert_string_equal(cJSON_GetObjectItem(o, "component")->valuestring, "session");
	assert_string_equal(cJSON_GetObjectItem(o, "msg")->valuestring, "lease \"expired\"");
	assert_string_equal(cJSON_GetObjectItem(o, "peer")->valuestring, "127.0.0.1:5");
	assert_string_equal(cJSON_GetObjectItem(o, "client")->valuestring, "a\"b\\c\x01?\xc3\xa9");
	/* numbers and booleans as their JSON types; a 64-bit id and "007" stay strings */
	assert_true(cJSON_IsNumber(cJSON_GetObjectItem(o, "pid")));
	assert_int_equal(cJSON_GetObjectItem(o, "pid")->valueint, 32555);
	assert_true(cJSON_IsFalse(cJSON_GetObjectItem(o, "tls")));
	assert_string_equal(cJSON_GetObjectItem(o, "session")->valuestring, "16232549680349265509");
	assert_string_equal(cJSON_GetObjectItem(o, "port")->valuestring, "007");
	cJSON_Delete(o);
}

/* A record longer than the line: text ends in "...", json stays one valid object. */
static void
test_log_long_records_are_cut_whole(void **state)
{
	static char big[5000], buf[256];
	(void)state;
	memset(big, 'x', sizeof(big) - 1);
	struct kvpd_log_field f[] = {{"detail", big}};
	size_t n = kvpd_log_format_line(buf, sizeof(buf), KVPD_LOG_TEXT, WALL, KVPD_ERROR, "main",
	                                "m", f, 1);
	assert_int_equal(n, sizeof(buf) - 1);
	assert_int_equal(strlen(buf), n);
	assert_string_equal(buf + n - 4, "...\n");
	n = kvpd_log_format_line(buf, sizeof(buf), KVPD_LOG_JSON, WALL, KVPD_ERROR, "main", "m", f, 1);
	assert_int_equal(strlen(buf), n);
	cJSON *o = cJSON_Parse(buf);
	assert_non_null(o);
	assert_non_null(strstr(cJSON_GetObjectItem(o, "msg")->valuestring, "cut"));
	assert_string_equal(cJSON_GetObjectItem(o, "level")->valuestring, "error");
	cJSON_Delete(o);
}

static void
test_log_levels_and_formats_parse(void **state)
{
	(void)state;
	assert_int_equal(kvpd_log_level_parse("debug"), KVPD_DEBUG);
	assert_int_equal(kvpd_log_level_parse("warning"), KVPD_WARN);
	assert_int_equal(kvpd_log_level_parse("error"), KVPD_ERROR);
	assert_int_equal(kvpd_log_level_parse("INFO"), -1);
	assert_int_equal(kvpd_log_level_parse(NULL), -1);
	assert_int_equal(kvpd_log_format_parse("json"), KVPD_LOG_JSON);
	assert_int_equal(kvpd_log_format_parse("yaml"), -1);
	/* Below the least level nothing is written. */
	char out[256] = "";
	FILE *f = fmemopen(out, sizeof(out) - 1, "w");
	assert_non_null(f);
	kvpd_log_setup(f, KVPD_WARN, KVPD_LOG_TEXT);
	kvpd_logf(KVPD_INFO, "t", "quiet %d", 1);
	kvpd_logf(KVPD_ERROR, "t", "loud %d", 2);
	fclose(f);
	kvpd_log_setup(stderr, KVPD_INFO, KVPD_LOG_TEXT);
	assert_null(strstr(out, "quiet"));
	assert_non_null(strstr(out, " error t: loud 2\n"));
}

/* A peer that causes a thousand refusals a second gets five lines, and the next says how many were not. */
static void
test_log_limit_bounds_lines_and_counts_the_rest(void **state)
{
	struct kvpd_log_limit lim = {.per_window = 5, .window_ms = 1000};
	uint64_t dropped = 99;
	int written = 0;
	(void)state;
	for (int i = 0; i < 1000; i++)
		if (kvpd_log_limit_take(&lim, 10000 + (uint64_t)i / 2, &dropped))
			written++;
	assert_int_equal(written, 5);
	assert_int_equal(dropped, 0);
	assert_true(kvpd_log_limit_take(&lim, 11000, &dropped));
	assert_int_equal(dropped, 995);
}

/*
 * Runs kvpoold with argv (argv[0] replaced), KVPOOL_LOG_FORMAT=json in its
 * environment if json_env; its stderr into err. Returns its exit status (or -1).
 */
static int
run_kvpoold(char **argv, bool json_env, char *err, size_t cap)
{
	char path[64];
	int st = -1;
	snprintf(path, sizeof(path), "/tmp/kvp-test-log-err-%d", (int)getpid());
	argv[0] = KVPOOLD_PATH;
	if (json_env)
		setenv("KVPOOL_LOG_FORMAT", "json", 1);
	pid_t pid = kvp_spawn((const char *const *)argv, path);
	unsetenv("KVPOOL_LOG_FORMAT");
	if (pid > 0)
		waitpid(pid, &st, 0);
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(err, 1, cap - 1, f) : 0;
	err[n] = '\0';
	if (f)
		fclose(f);
	unlink(path);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Every line of text is a JSON error log line from component config; returns how many. */
static int
json_config_errors(const char *text, const char *want)
{
	int lines = 0;
	bool found = false;
	for (const char *l = text; *l; lines++) {
		size_t n = strcspn(l, "\n");
		char line[1024];
		snprintf(line, sizeof(line), "%.*s", (int)n, l);
		cJSON *o = cJSON_Parse(line);
		assert_non_null(o);
		assert_string_equal(cJSON_GetObjectItem(o, "level")->valuestring, "error");
		assert_string_equal(cJSON_GetObjectItem(o, "component")->valuestring, "config");
		assert_string_equal(cJSON_GetObjectItem(o, "msg")->valuestring, "invalid configuration");
		found |= strstr(cJSON_GetObjectItem(o, "error")->valuestring, want) != NULL;
		cJSON_Delete(o);
		l += n + (l[n] == '\n');
	}
	assert_true(found);
	return lines;
}

static void
test_log_config_errors_come_in_the_asked_format(void **state)
{
	static char err[8192];
	char cfg[64];
	char *noenv[] = {NULL}, *jsonenv[] = {"KVPOOL_LOG_FORMAT=json", NULL};
	unsetenv("KVPOOL_LOG_FORMAT");
	(void)state;

	/* JSON asked for on the command line, before or after the bad setting. */
	char *a1[] = {"kvpoold", "--log-format", "json", "--pool", "name=a,blocks=x", NULL};
	assert_int_equal(run_kvpoold(a1, false, err, sizeof(err)), 2);
	assert_int_equal(json_config_errors(err, "bad pool spec 'name=a,blocks=x'"), 1);
	char *a2[] = {"kvpoold", "--pool", "name=a,blocks=x", "--log-format", "json", NULL};
	assert_int_equal(run_kvpoold(a2, false, err, sizeof(err)), 2);
	assert_int_equal(json_config_errors(err, "bad pool spec"), 1);
	/* In the config file: the file and line come in the same record. */
	snprintf(cfg, sizeof(cfg), "/tmp/kvp-test-log-cfg-%d", (int)getpid());
	FILE *f = fopen(cfg, "w");
	assert_non_null(f);
	fputs("log-format = json\nlease-ms = 1\n", f);
	fclose(f);
	char *a3[] = {"kvpoold", "--config", cfg, NULL};
	assert_int_equal(run_kvpoold(a3, false, err, sizeof(err)), 2);
	char at[160];
	snprintf(at, sizeof(at), "bad value for lease-ms: '1' (at %s:2)", cfg);
	assert_int_equal(json_config_errors(err, at), 1);
	unlink(cfg);
	/* From the environment; an unknown last flag is unknown, not "needs a value". */
	char *a4[] = {"kvpoold", "--bogus", NULL};
	assert_int_equal(run_kvpoold(a4, true, err, sizeof(err)), 2);
	assert_int_equal(json_config_errors(err, "unknown setting 'bogus'"), 1);
	/* No JSON asked for: the plain line, as before. */
	char *a5[] = {"kvpoold", "--pool", "name=a,blocks=x", NULL};
	assert_int_equal(run_kvpoold(a5, false, err, sizeof(err)), 2);
	assert_string_equal(err, "kvpoold: bad pool spec 'name=a,blocks=x' (see --help)\n");
	/* The format is read past problems, last source winning. */
	char *a6[] = {"kvpoold", "--lease-ms", "1", "--log-format", "json", NULL};
	assert_int_equal(kvpd_config_log_format(5, a6, noenv), KVPD_LOG_JSON);
	assert_int_equal(kvpd_config_log_format(1, a6, noenv), KVPD_LOG_TEXT);
	assert_int_equal(kvpd_config_log_format(1, a6, jsonenv), KVPD_LOG_JSON);
}

/* Waits up to 5 s for path to hold want; returns how often it does. */
static int
log_holds(const char *path, const char *want, int at_least)
{
	static char text[65536];
	int n = 0;
	for (int tries = 0; tries == 0 || (tries < 100 && n < at_least); tries++) {
		FILE *f = fopen(path, "r");
		size_t len = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
		text[len] = '\0';
		if (f)
			fclose(f);
		n = 0;
		for (const char *p = text; (p = strstr(p, want)) != NULL; p += strlen(want))
			n++;
		if (n < at_least)
			nanosleep(&(struct timespec){.tv_nsec = 50 * 1000000}, NULL);
	}
	return n;
}

/*
 * SIGHUP and SIGUSR1/2 used to end kvpoold at once, with no drain and no
 * invariant check: now each is logged and ignored, and SIGTERM still drains
 * to exit 0. --token on the command line is warned about.
 */
static void
test_log_hup_and_usr_signals_are_ignored(void **state)
{
	char path[64], url[96];
	int st = -1;
	(void)state;
	snprintf(path, sizeof(path), "/tmp/kvp-test-log-sig-%d", (int)getpid());
	snprintf(url, sizeof(url), "ipc:///tmp/kvp-test-log-sig-%d.ipc", (int)getpid());
	const char *argv[] = {KVPOOLD_PATH, "--rpc", url, "--admin", "none", "--events", "none",
	                      "--log-format", "json", "--token", "t0k3n", "--pool", "name=a,blocks=8", NULL};
	pid_t pid = kvp_spawn(argv, path);
	assert_true(pid > 0);
	assert_int_equal(log_holds(path, "\"msg\":\"ready\"", 1), 1);
	assert_int_equal(log_holds(path, "shows in the process list", 1), 1);
	int sigs[] = {SIGHUP, SIGUSR1, SIGUSR2};
	for (int i = 0; i < 3; i++) {
		assert_int_equal(kill(pid, sigs[i]), 0);
		assert_int_equal(log_holds(path, "signal ignored", i + 1), i + 1);
	}
	assert_int_equal(waitpid(pid, &st, WNOHANG), 0); /* still running */
	assert_int_equal(kill(pid, SIGTERM), 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(log_holds(path, "t0k3n", 0), 0); /* the token itself never */
	unlink(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_log_text_line_has_time_level_component_and_fields),
		cmocka_unit_test(test_log_json_line_is_one_valid_object),
		cmocka_unit_test(test_log_long_records_are_cut_whole),
		cmocka_unit_test(test_log_levels_and_formats_parse),
		cmocka_unit_test(test_log_limit_bounds_lines_and_counts_the_rest),
		cmocka_unit_test(test_log_config_errors_come_in_the_asked_format),
		cmocka_unit_test(test_log_hup_and_usr_signals_are_ignored),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
