/* SPDX-License-Identifier: Apache-2.0 */
/* bench_util.h: what every benchmark program needs: a monotonic clock and sorting. */
#ifndef KVP_BENCH_UTIL_H
#define KVP_BENCH_UTIL_H

#include <dirent.h>
#include <sys/types.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

/*
 * A loopback tcp port for this process, one per slot (0..2), all below
 * Linux's ephemeral range (32768-60999): a port there may be the local end
 * of some connection (or its TIME_WAIT), and then cannot be bound.
 */
static inline int
bench_tcp_port(int slot)
{
	return 20000 + 4000 * slot + (int)(getpid() % 4000);
}

/* Monotonic seconds. */
static inline double
now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds of the whole process (every thread). */
static inline double
cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A process's CPU time over all its threads, from schedstat (seconds). */
static inline double
proc_cpu(pid_t pid)
{
	char path[64];
	double sum = 0;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (d == NULL)
		return -1;
	for (struct dirent *e; (e = readdir(d)) != NULL;) {
		if (e->d_name[0] == '.')
			continue;
		char p2[400];
		unsigned long long ns = 0;
		snprintf(p2, sizeof(p2), "%s/%s/schedstat", path, e->d_name);
		FILE *f = fopen(p2, "r");
		if (f == NULL)
			continue;
		if (fscanf(f, "%llu", &ns) == 1)
			sum += (double)ns / 1e9;
		fclose(f);
	}
	closedir(d);
	return sum;
}

/* A string as a JSON string's contents (quotes and backslashes escaped, controls dropped). */
static inline void
bench_json_str(FILE *f, const char *s)
{
	for (; *s != '\0'; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		if ((unsigned char)*s >= 0x20)
			fputc(*s, f);
	}
}

/* KVP_BENCH_JSON's file for one more line, begun with the area; NULL without one. */
static inline FILE *
bench_json_open(const char *area)
{
	const char *path = getenv("KVP_BENCH_JSON");
	FILE *f = path != NULL && path[0] != '\0' ? fopen(path, "a") : NULL;
	if (f != NULL) {
		fputs("{\"area\": \"", f);
		bench_json_str(f, area);
	}
	return f;
}

/*
 * Machine-readable figures: with KVP_BENCH_JSON=FILE, one line of JSON per
 * figure appended to FILE, beside its same-run baseline (better: "higher"
 * or "lower"); tests/bench/report.py makes BENCHMARKS.md's tables of them.
 */
static inline void
bench_json(const char *area, const char *row, double value, const char *unit,
           const char *baseline, double baseline_value, const char *better)
{
	FILE *f = bench_json_open(area);
	if (f == NULL)
		return;
	fputs("\", \"row\": \"", f);
	bench_json_str(f, row);
	fprintf(f, "\", \"value\": %.6g, \"unit\": \"", value);
	bench_json_str(f, unit);
	fputs("\", \"baseline\": \"", f);
	bench_json_str(f, baseline);
	fprintf(f, "\", \"baseline_value\": %.6g, \"better\": \"%s\"}\n", baseline_value,
	        strcmp(better, "lower") == 0 ? "lower" : "higher");
	fclose(f);
}

/*
 * A fact beside an area's figures that is no ratio (a count that must be 0,
 * a peak): with KVP_BENCH_JSON=FILE, one line {"area", "note"}; report.py
 * lists an area's notes under its table.
 */
static inline void
bench_note(const char *area, const char *note)
{
	FILE *f = bench_json_open(area);
	if (f == NULL)
		return;
	fputs("\", \"note\": \"", f);
	bench_json_str(f, note);
	fputs("\"}\n", f);
	fclose(f);
}

/* qsort comparator for doubles. */
static inline int
cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Sorts v and returns its median. */
static inline double
median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return v[n / 2];
}

/*
 * An argument no flag of the bench took: --help/-h prints usage and exits 0;
 * a KVPOOLD path must be executable; anything else is a usage error (exit 2),
 * never a daemon path the bench would wait on forever.
 */
static inline const char *
bench_daemon_arg(const char *prog, const char *usage, const char *a)
{
	if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
		printf("usage: %s %s\n", prog, usage);
		exit(0);
	}
	if (a[0] == '-' || access(a, X_OK) != 0) {
		fprintf(stderr, "%s: bad argument '%s' (%s)\nusage: %s %s\n", prog, a,
		        a[0] == '-' ? "unknown option" : "not an executable kvpoold", prog, usage);
		exit(2);
	}
	return a;
}

#endif /* KVP_BENCH_UTIL_H */
