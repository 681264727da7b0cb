/* open + read + close of one file, N times: the loop behind the "C loop"
 * figures of docs/BENCHMARKS.md (a FUSE sandbox's input against the same
 * bytes on tmpfs), with no Rust runtime or allocator in the way, for
 * timing and for `perf record` (scripts/bench-open-c).
 *
 * Usage: open_read_close PATH [ITERATIONS]   (default 200000)
 * Prints: PATH: N iterations, X.XX us each
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH [ITERATIONS]\n", argv[0]);
        return 2;
    }
    long iterations = argc > 2 ? atol(argv[2]) : 200000;
    char buf[4096];
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < iterations; i++) {
        int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            perror(argv[1]);
            return 1;
        }
        if (read(fd, buf, sizeof buf) < 0) {
            perror("read");
            return 1;
        }
        close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec);
    printf("%s: %ld iterations, %.2f us each\n", argv[1], iterations, ns / iterations / 1e3);
    return 0;
}
