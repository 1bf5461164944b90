/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoold's ipc:// sockets (issue #15): created owner-only whatever the
 * umask (with 000 any local user could connect or read events), the group
 * let in only when ipc-mode says so; a path another user owns (a squatter
 * who could listen in kvpoold's place and collect tokens) or that is not a
 * socket is refused at start.
 */
#include "daemon_util.h"

#include "kvp_test.h"

#include <sys/stat.h>

static char dir[64];

/* Waits up to 5 s for path to exist; its permission bits, or -1. */
static int
mode_of(const char *path)
{
	struct stat st;
	for (int i = 0; i < 100; i++) {
		if (stat(path, &st) == 0)
			return (int)(st.st_mode & 0777);
		sleep_ms(50);
	}
	return -1;
}

/* kvpoold with these arguments until it exits; its status and stderr in out. */
static int
run_to_exit(const char *const *args, char *out, size_t cap)
{
	char log[96];
	int st = -1;
	snprintf(log, sizeof(log), "%s/log", dir);
	pid_t pid = daemon_start_log(args, log);
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	FILE *f = fopen(log, "r");
	size_t n = f ? fread(out, 1, cap - 1, f) : 0;
	out[n] = '\0';
	if (f)
		fclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void
test_ipc_sockets_are_owner_only_whatever_the_umask(void **state)
{
	char rpc[96], ev[96], vllm[96], url[3][104];
	(void)state;
	snprintf(rpc, sizeof(rpc), "%s/rpc.ipc", dir);
	snprintf(ev, sizeof(ev), "%s/ev.ipc", dir);
	snprintf(vllm, sizeof(vllm), "%s/vllm.ipc", dir);
	snprintf(url[0], sizeof(url[0]), "ipc://%s", rpc);
	snprintf(url[1], sizeof(url[1]), "ipc://%s", ev);
	snprintf(url[2], sizeof(url[2]), "ipc://%s", vllm);

	const char *modes[] = {NULL, "0660"};
	int want[] = {0600, 0660};
	mode_t old = umask(0); /* the daemon inherits it: the loosest an operator could have */
	for (int i = 0; i < 2; i++) {
		const char *args[] = {"--rpc", url[0], "--events", url[1], "--vllm-events", url[2],
		                      "--admin", "none", "--executor", "none", "--pool", "a:8",
		                      modes[i] ? "--ipc-mode" : NULL, modes[i], NULL};
		pid_t pid = daemon_start(args);
		assert_true(pid > 0);
		assert_int_equal(mode_of(rpc), want[i]);
		assert_int_equal(mode_of(ev), want[i]);
		assert_int_equal(mode_of(vllm), want[i]);
		assert_int_equal(daemon_stop(pid), 0);
	}
	umask(old);
	const char *bad[] = {"--rpc", url[0], "--ipc-mode", "0444", NULL};
	char out[2048];
	assert_int_equal(run_to_exit(bad, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "ipc-mode"));
}

static void
test_ipc_foreign_or_non_socket_paths_are_refused(void **state)
{
	char path[96], url[104], out[4096];
	(void)state;
	snprintf(path, sizeof(path), "%s/taken.ipc", dir);
	snprintf(url, sizeof(url), "ipc://%s", path);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fclose(f);
	const char *args[] = {"--rpc", url, "--admin", "none", "--events", "none",
	                      "--executor", "none", "--pool", "a:8", NULL};
	assert_int_equal(run_to_exit(args, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "is not a socket"));
	if (geteuid() == 0 && chown(path, 65534, 65534) == 0) {
		assert_int_equal(run_to_exit(args, out, sizeof(out)), 1);
		assert_non_null(strstr(out, "belongs to uid 65534"));
	} else {
		print_message("not root: the foreign owner case is not checked\n");
	}
	unlink(path);
}

static int
setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/kvp-ipc-test-%d", (int)getpid());
	return mkdir(dir, 0700);
}

static int
teardown(void **state)
{
	char cmd[96];
	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ipc_sockets_are_owner_only_whatever_the_umask),
		cmocka_unit_test(test_ipc_foreign_or_non_socket_paths_are_refused),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
