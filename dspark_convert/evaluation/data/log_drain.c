/* Loaded into llama.cpp's programs (LD_PRELOAD) by dspark eval: it lets llama.cpp's own
 * logger finish writing what the program logged before the process ends. Nothing else.
 *
 * Why: llama.cpp 0c1e570 logs through a worker thread of a logger it deliberately never
 * destroys (common/log.cpp, common_log_main: "logs may be lost if not flushed before the
 * program exits"). main() returns while the worker still holds queued lines; exit() then
 * ends every thread and those lines, the statistics and the closing timings among them, are
 * lost. Measured on a 2-core machine with three busy processes: 16 to 24 runs of 40 lost
 * lines (docs/ENGINES.md, "llama.cpp's log at exit").
 *
 * How: this destructor runs inside exit(), after main() returned and before the process
 * ends. It waits until every other thread of the process sleeps in the futex system call:
 * the logger's worker sleeps there (its condition variable) only once its queue is empty,
 * and a thread that is writing, runnable or on a CPU is seen as not sleeping there
 * (/proc/self/task/TID/syscall says "running" or names another call). Two such
 * observations 1 ms apart end the wait; so does a deadline (DEADLINE_MS), so that a
 * thread that never sleeps in futex cannot hold the process. Where /proc cannot be read
 * it does not wait at all: the eval's rerun of a cut log is the fallback.
 *
 * It reads only /proc and the clock: it never touches llama.cpp's memory, its output or
 * its exit status.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEADLINE_MS 5000

/* 1: every other thread sleeps in futex; 0: one does not; -1: cannot tell. */
static int others_sleep_in_futex(void) {
    long self = syscall(SYS_gettid);
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL) {
        return -1;
    }
    int answer = 1;
    struct dirent *entry;
    while (answer == 1 && (entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] == '.') {
            continue;
        }
        long tid = strtol(entry->d_name, NULL, 10);
        if (tid == self) {
            continue;
        }
        char path[64];
        char line[64] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
        FILE *file = fopen(path, "r");
        if (file == NULL) {
            answer = -1;               /* no such file here, or not allowed to read it */
            break;
        }
        size_t n = fread(line, 1, sizeof line - 1, file);
        fclose(file);
        if (n == 0) {
            answer = -1;
        } else if (strncmp(line, "running", 7) == 0 || strtol(line, NULL, 10) != SYS_futex) {
            answer = 0;
        }
    }
    closedir(dir);
    return answer;
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

__attribute__((destructor)) static void wait_for_the_log(void) {
    const struct timespec one_ms = {0, 1000000L};
    long deadline = now_ms() + DEADLINE_MS;
    int quiet = 0;
    while (now_ms() < deadline) {
        int answer = others_sleep_in_futex();
        if (answer < 0) {
            return;
        }
        quiet = answer ? quiet + 1 : 0;
        if (quiet >= 2) {
            return;
        }
        nanosleep(&one_ms, NULL);
    }
}
