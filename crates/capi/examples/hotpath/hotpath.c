/* Instruction counts of the C ABI's success paths, for valgrind --tool=callgrind (counts do
 * not depend on the machine's load). counts.sh builds and runs it.
 *
 * Usage: hotpath MODE N. Modes: `release` (ca_allocate 4 KiB + ca_release), `reset16` (16
 * ca_allocate of 64 B - 4 KiB, then ca_reset: the arena path, ExecuTorch's temp allocator).
 * Run with N and with 0; the difference over N is the cost of one iteration. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "caching_allocator.h"

static const size_t SIZES16[16] = {64,  128,  256,  512,  1024, 2048, 4096, 64,
                                   128, 256, 512, 1024, 2048, 4096, 64,   128};

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "release";
    const long n = argc > 2 ? atol(argv[2]) : 100000;
    CaConfig config = ca_config_default();
    CaAllocator* a = ca_create(&config);
    if (a == NULL) return 1;
    /* A volatile sink, so the compiler keeps every call and its result. */
    void* volatile sink;
    if (strcmp(mode, "release") == 0) {
        for (long i = 0; i < n; i++) {
            void* p = ca_allocate(a, 4096, 64);
            sink = p;
            if (p == NULL || ca_release(a, p) != CA_STATUS_OK) return 2;
        }
    } else if (strcmp(mode, "reset16") == 0) {
        for (long i = 0; i < n; i++) {
            for (int k = 0; k < 16; k++) {
                void* p = ca_allocate(a, SIZES16[k], 64);
                sink = p;
                if (p == NULL) return 2;
            }
            if (ca_reset(a) != CA_STATUS_OK) return 2;
        }
    } else {
        fprintf(stderr, "unknown mode %s (release, reset16)\n", mode);
        return 1;
    }
    (void)sink;
    return ca_destroy(a) == CA_STATUS_OK ? 0 : 3;
}
