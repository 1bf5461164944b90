/* SPDX-License-Identifier: Apache-2.0 */
#include "service/net/memtune.h"

#include <stdio.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "service/log.h"

void
kvpd_malloc_tune(void)
{
#ifdef __GLIBC__
	const char *env = getenv("MALLOC_TRIM_THRESHOLD_") ? "MALLOC_TRIM_THRESHOLD_"
	                  : getenv("MALLOC_MMAP_THRESHOLD_") ? "MALLOC_MMAP_THRESHOLD_"
	                  : getenv("GLIBC_TUNABLES")         ? "GLIBC_TUNABLES"
	                                                     : NULL;
	if (env != NULL) {
		struct kvpd_log_field f[] = {{"by", env}};
		kvpd_log_fields(KVPD_INFO, "main", "malloc tuned by the environment", f, 1);
		return;
	}
	char trim[24], mmap[24];
	snprintf(trim, sizeof(trim), "%u", KVPD_MALLOC_TRIM_THRESHOLD);
	snprintf(mmap, sizeof(mmap), "%u", KVPD_MALLOC_MMAP_THRESHOLD);
	/* mallopt returns 1 on success; a refusal leaves glibc's defaults, which work. */
	if (mallopt(M_MMAP_THRESHOLD, (int)KVPD_MALLOC_MMAP_THRESHOLD) != 1 ||
	    mallopt(M_TRIM_THRESHOLD, (int)KVPD_MALLOC_TRIM_THRESHOLD) != 1) {
		kvpd_log_fields(KVPD_WARN, "main", "malloc kept its defaults (mallopt refused)", NULL, 0);
		return;
	}
	struct kvpd_log_field f[] = {{"trim_threshold", trim}, {"mmap_threshold", mmap}};
	kvpd_log_fields(KVPD_INFO, "main", "malloc keeps freed memory for reuse", f, 2);
#endif
}
