/* Exercises every function and every status code of the C ABI.
 *
 * Built and run by `cargo test -p caching-allocator-capi` (tests/c_examples.rs) with
 * -Wall -Wextra -Werror, once against the shared library and once, statically, under
 * -fsanitize=address,undefined. Exits 0 when every check holds; prints each failed check. */
#include "caching_allocator.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
static int checks = 0;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        checks++;                                                                       \
        if (!(cond)) {                                                                  \
            failures++;                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
        }                                                                               \
    } while (0)

/* The last error on `a` (NULL: without a handle) has code `code` and a message that names the
 * failing function; the code is marked as seen. */
static int seen[CA_STATUS_INTERNAL + 1];

static void expect_error(const CaAllocator *a, CaStatus code, const char *function) {
    CaError e = ca_last_error(a);
    CHECK(e.code == code);
    CHECK(e.message != NULL);
    CHECK(strncmp(e.message, function, strlen(function)) == 0);
    /* It speaks C: CaConfig fields and ca_* calls, no Rust paths or types. */
    CHECK(strstr(e.message, "::") == NULL && strstr(e.message, "Scope") == NULL &&
          strstr(e.message, "isize") == NULL);
    if (e.code != code) {
        fprintf(stderr, "  expected %s, got %s: %s\n", ca_status_name((int)code),
                ca_status_name((int)e.code), e.message);
    }
    if (e.code == code && (int)code >= 0 && (int)code <= CA_STATUS_INTERNAL) {
        seen[code] = 1;
    }
}

static void null_handles_and_arguments(void) {
    CaStats stats;
    CaError none = ca_last_error(NULL);
    CHECK(none.code == CA_STATUS_OK); /* nothing failed on this thread yet */
    CHECK(strcmp(none.message, "CA_STATUS_OK") == 0);
    seen[CA_STATUS_OK] = 1;

    CHECK(ca_create(NULL) == NULL);
    expect_error(NULL, CA_STATUS_NULL_ARGUMENT, "ca_create");

    CHECK(ca_allocate(NULL, 64, 64) == NULL);
    expect_error(NULL, CA_STATUS_NULL_HANDLE, "ca_allocate");
    CHECK(ca_release(NULL, &stats) == CA_STATUS_NULL_HANDLE);
    expect_error(NULL, CA_STATUS_NULL_HANDLE, "ca_release");
    CHECK(ca_reset(NULL) == CA_STATUS_NULL_HANDLE);
    expect_error(NULL, CA_STATUS_NULL_HANDLE, "ca_reset");
    CHECK(ca_free_cached(NULL) == CA_STATUS_NULL_HANDLE);
    expect_error(NULL, CA_STATUS_NULL_HANDLE, "ca_free_cached");
    CHECK(ca_trim(NULL, 0) == CA_STATUS_NULL_HANDLE);
    expect_error(NULL, CA_STATUS_NULL_HANDLE, "ca_trim");
    CHECK(ca_stats(NULL, &stats) == CA_STATUS_NULL_HANDLE);
    expect_error(NULL, CA_STATUS_NULL_HANDLE, "ca_stats");
    CHECK(ca_destroy(NULL) == CA_STATUS_NULL_HANDLE);
    expect_error(NULL, CA_STATUS_NULL_HANDLE, "ca_destroy");

    CaConfig config = ca_config_default();
    CaAllocator *a = ca_create(&config);
    CHECK(a != NULL);
    CHECK(ca_last_error(a).code == CA_STATUS_OK);
    CHECK(ca_release(a, NULL) == CA_STATUS_NULL_ARGUMENT);
    expect_error(a, CA_STATUS_NULL_ARGUMENT, "ca_release");
    CHECK(ca_stats(a, NULL) == CA_STATUS_NULL_ARGUMENT);
    expect_error(a, CA_STATUS_NULL_ARGUMENT, "ca_stats");
    CHECK(ca_destroy(a) == CA_STATUS_OK);
}

static void allocation_errors(void) {
    CaConfig config = ca_config_default();
    config.limit_bytes = 1 << 20;
    CaAllocator *a = ca_create(&config);
    CHECK(a != NULL);

    CHECK(ca_allocate(a, 64, 0) == NULL);
    expect_error(a, CA_STATUS_INVALID_ALIGNMENT, "ca_allocate");
    CHECK(ca_allocate(a, 64, 48) == NULL);
    expect_error(a, CA_STATUS_INVALID_ALIGNMENT, "ca_allocate");
    CHECK(ca_allocate(a, 64, (size_t)CA_MAX_ALIGN * 2) == NULL);
    expect_error(a, CA_STATUS_INVALID_ALIGNMENT, "ca_allocate");

    CHECK(ca_allocate(a, SIZE_MAX, 64) == NULL);
    expect_error(a, CA_STATUS_SIZE_OVERFLOW, "ca_allocate");

    void *half = ca_allocate(a, 600 << 10, 64);
    CHECK(half != NULL);
    CHECK(ca_allocate(a, 600 << 10, 64) == NULL); /* 1.2 MiB > the 1 MiB limit */
    expect_error(a, CA_STATUS_LIMIT_EXCEEDED, "ca_allocate");
    CHECK(strstr(ca_last_error(a).message, "CaConfig.limit_bytes") != NULL);
    CHECK(ca_release(a, half) == CA_STATUS_OK);

    int on_stack = 0;
    CHECK(ca_release(a, &on_stack) == CA_STATUS_UNKNOWN_POINTER);
    expect_error(a, CA_STATUS_UNKNOWN_POINTER, "ca_release");
    CHECK(strstr(ca_last_error(a).message, " 0x") != NULL); /* the address, in hex */
    CHECK(ca_release(a, half) == CA_STATUS_UNKNOWN_POINTER); /* released twice */
    CHECK(ca_destroy(a) == CA_STATUS_OK);

    /* 4 PiB: more than any process's address space, so the system allocator refuses. */
    config = ca_config_default();
    a = ca_create(&config);
    CHECK(ca_allocate(a, (size_t)1 << 52, 64) == NULL);
    expect_error(a, CA_STATUS_OUT_OF_MEMORY, "ca_allocate");
    CHECK(ca_destroy(a) == CA_STATUS_OK);
}

static void debug_checks_find_overruns(void) {
    CaConfig config = ca_config_default();
    config.debug_checks = true;
    CaAllocator *a = ca_create(&config);
    CaStats stats;

    unsigned char *p = ca_allocate(a, 100, 64);
    CHECK(p != NULL && p[0] == 0xFF && p[99] == 0xFF); /* poisoned */
    p[100] = 0; /* one byte past the request: inside the block, over the canary */
    CHECK(ca_release(a, p) == CA_STATUS_CORRUPTED);
    expect_error(a, CA_STATUS_CORRUPTED, "ca_release");

    unsigned char *q = ca_allocate(a, 200, 64);
    unsigned char *r = ca_allocate(a, 300, 64);
    CHECK(q != NULL && r != NULL);
    memset(r, 1, 300); /* in bounds */
    q[200] = 0;        /* out of bounds: found by the reset */
    CHECK(ca_reset(a) == CA_STATUS_CORRUPTED);
    expect_error(a, CA_STATUS_CORRUPTED, "ca_reset");
    CHECK(ca_stats(a, &stats) == CA_STATUS_OK);
    CHECK(stats.corrupted_blocks == 2);
    CHECK(stats.live_blocks == 0); /* the intact block was reset all the same */
    CHECK(stats.cached_blocks == 1);
    CHECK(ca_destroy(a) == CA_STATUS_OK);
}

static void cache_reset_trim_stats(void) {
    CaConfig config = ca_config_default();
    config.max_cached_bytes = 4 << 20;
    config.arena_max_bytes = 0; /* every block of its own size class: what the counts check */
    CaAllocator *a = ca_create(&config);
    CaStats stats;
    void *blocks[8];

    for (int i = 0; i < 8; i++) {
        blocks[i] = ca_allocate(a, (size_t)(i + 1) * 1000, 256);
        CHECK(blocks[i] != NULL && (uintptr_t)blocks[i] % 256 == 0);
        memset(blocks[i], i, (size_t)(i + 1) * 1000);
    }
    CHECK(ca_release(a, blocks[0]) == CA_STATUS_OK);
    CHECK(ca_stats(a, &stats) == CA_STATUS_OK);
    CHECK(stats.live_blocks == 7 && stats.cached_blocks == 1 && stats.misses == 8);
    CHECK(stats.requested_bytes == 35000); /* 2000 + 3000 + ... + 8000 */

    CHECK(ca_reset(a) == CA_STATUS_OK); /* every live block back to the cache */
    CHECK(ca_stats(a, &stats) == CA_STATUS_OK);
    CHECK(stats.live_blocks == 0 && stats.cached_blocks == 8);

    for (int i = 0; i < 8; i++) { /* the same sizes again: all hits */
        blocks[i] = ca_allocate(a, (size_t)(i + 1) * 1000, 256);
        CHECK(blocks[i] != NULL);
    }
    CHECK(ca_stats(a, &stats) == CA_STATUS_OK);
    CHECK(stats.hits == 8 && stats.misses == 8 && stats.system_allocs == 8);
    CHECK(ca_reset(a) == CA_STATUS_OK);

    CHECK(ca_trim(a, 10000) == CA_STATUS_OK);
    CHECK(ca_stats(a, &stats) == CA_STATUS_OK);
    CHECK(stats.cached_bytes <= 10000 && stats.cached_blocks > 0 && stats.evictions > 0);
    CHECK(ca_free_cached(a) == CA_STATUS_OK);
    CHECK(ca_stats(a, &stats) == CA_STATUS_OK);
    CHECK(stats.cached_bytes == 0 && stats.reserved_bytes == 0);
    CHECK(stats.system_frees == stats.system_allocs);

    void *empty = ca_allocate(a, 0, 128); /* zero bytes: non-NULL, aligned, never touched */
    CHECK(empty != NULL && (uintptr_t)empty % 128 == 0);
    CHECK(ca_release(a, empty) == CA_STATUS_OK);

    void *leftover = ca_allocate(a, 5000, 64); /* ca_destroy frees live blocks too */
    CHECK(leftover != NULL);
    CHECK(ca_destroy(a) == CA_STATUS_OK);
}

/* Another thread's failure on the same handle does not touch this thread's last error. */
static void *fail_on_other_thread(void *arg) {
    CaAllocator *a = arg;
    CHECK(ca_last_error(a).code == CA_STATUS_OK);
    CHECK(ca_allocate(a, SIZE_MAX, 64) == NULL);
    CHECK(ca_last_error(a).code == CA_STATUS_SIZE_OVERFLOW);
    void *p = ca_allocate(a, 64, 64); /* blocks cross threads: released by the main thread */
    CHECK(p != NULL);
    return p;
}

static void last_error_is_per_thread(void) {
    CaConfig config = ca_config_default();
    CaAllocator *a = ca_create(&config);
    CHECK(ca_allocate(a, 64, 3) == NULL);
    CaError mine = ca_last_error(a);
    pthread_t thread;
    void *from_thread = NULL;
    CHECK(pthread_create(&thread, NULL, fail_on_other_thread, a) == 0);
    CHECK(pthread_join(thread, &from_thread) == 0);
    CaError after = ca_last_error(a);
    CHECK(after.code == CA_STATUS_INVALID_ALIGNMENT);
    CHECK(after.message == mine.message); /* still valid, still ours */
    CHECK(ca_release(a, from_thread) == CA_STATUS_OK);
    CHECK(ca_destroy(a) == CA_STATUS_OK);
}

static void status_names(void) {
    CHECK(strcmp(ca_status_name(CA_STATUS_LIMIT_EXCEEDED), "CA_STATUS_LIMIT_EXCEEDED") == 0);
    CHECK(strcmp(ca_status_name(CA_STATUS_INTERNAL), "CA_STATUS_INTERNAL") == 0);
    CHECK(strcmp(ca_status_name(-1), "CA_STATUS_UNKNOWN") == 0);
    for (int i = 0; i <= CA_STATUS_INTERNAL; i++) {
        CHECK(strncmp(ca_status_name(i), "CA_STATUS_", 10) == 0);
    }
}

int main(void) {
    null_handles_and_arguments();
    allocation_errors();
    debug_checks_find_overruns();
    cache_reset_trim_stats();
    last_error_is_per_thread();
    status_names();

    /* Every code but CA_STATUS_INTERNAL was produced above. INTERNAL means a bug in the library
     * (a caught panic); no correct input produces it, so it is checked by the Rust unit test
     * panics_become_internal_with_their_message instead. */
    for (int code = 0; code < CA_STATUS_INTERNAL; code++) {
        if (!seen[code]) {
            failures++;
            fprintf(stderr, "status %s was never produced\n", ca_status_name(code));
        }
    }
    printf("capi_test: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
