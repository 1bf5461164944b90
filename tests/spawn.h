/* SPDX-License-Identifier: Apache-2.0 */
/*
 * spawn.h: starts and stops a child program (kvpoold) for tests and
 * benchmarks, one way for all of them. fork+exec before the caller touches
 * nng (nng is not fork-safe: the child execs at once); the child gets
 * SIGTERM when its parent dies, so a crashed test or a ^C'd benchmark never
 * leaves a daemon behind holding its sockets.
 *
 * The includer defines _POSIX_C_SOURCE (or _GNU_SOURCE) before any header.
 */
#ifndef KVP_SPAWN_H
#define KVP_SPAWN_H

#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/*
 * Runs argv[0] with argv (NULL-terminated); log_path: a file for its stderr,
 * or NULL to share the caller's. Returns the child's pid, or -1.
 */
static inline pid_t
kvp_spawn(const char *const *argv, const char *log_path)
{
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (log_path != NULL && freopen(log_path, "w", stderr) == NULL)
			_exit(126);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/*
 * Waits up to timeout_ms for pid to exit by itself; then SIGKILLs it.
 * Returns its exit status, or -1 (killed, or did not exit normally).
 */
static inline int
kvp_wait_exit(pid_t pid, long timeout_ms)
{
	int status = 0;
	if (pid <= 0)
		return -1;
	for (long waited = 0; waited < timeout_ms; waited += 10) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return -1;
}


/*
 * SIGTERM, then waits up to timeout_ms (then SIGKILL). Returns the child's
 * exit status, or -1 if it was killed by a signal or did not exit in time.
 */
static inline int
kvp_reap(pid_t pid, long timeout_ms)
{
	if (pid <= 0)
		return -1;
	kill(pid, SIGTERM);
	return kvp_wait_exit(pid, timeout_ms);
}

#endif /* KVP_SPAWN_H */
