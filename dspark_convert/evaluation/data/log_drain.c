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
 * A run that dies by a signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) loses its queued
 * lines the same way, and those are the lines that say why it died (on a CPU with
 * AMX a native build crashes on a quantized drafter right after "AMX model buffer size").
 * So a handler for those signals does the same bounded wait, then restores the default
 * action and raises the signal again: the process still dies by that signal (its exit
 * status is unchanged), with its log written. The handler uses only async-signal-safe
 * calls (open, read, getdents64, nanosleep, clock_gettime), as the wait below does.
 *
 * It reads only /proc and the clock: it never touches llama.cpp's memory, its output or
 * its exit status.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEADLINE_MS 5000

/* The decimal number at the start of s (a thread id, a syscall number), or -1. */
static long leading_number(const char *s) {
    long n = -1;
    for (; *s >= '0' && *s <= '9'; s++) {
        n = (n < 0 ? 0 : n * 10) + (*s - '0');
    }
    return n;
}

struct linux_dirent64 {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* 1: every other thread sleeps in futex; 0: one does not; -1: cannot tell. Raw system
 * calls only (no stdio, no malloc): it also runs in a handler of a fatal signal. */
static int others_sleep_in_futex(void) {
    long self = syscall(SYS_gettid);
    int dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) {
        return -1;
    }
    int answer = 1;
    char buf[4096];
    long got;
    while (answer == 1 && (got = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
        for (long at = 0; answer == 1 && at < got;) {
            struct linux_dirent64 *entry = (struct linux_dirent64 *)(buf + at);
            at += entry->d_reclen;
            long tid = leading_number(entry->d_name);
            if (tid < 0 || tid == self) {
                continue;              /* ".", "..", this thread */
            }
            char path[64] = "/proc/self/task/";
            char digits[24];
            int k = 0;
            do {
                digits[k++] = (char)('0' + tid % 10);
                tid /= 10;
            } while (tid > 0 && k < (int)sizeof digits);
            size_t len = strlen(path);
            while (k > 0) {
                path[len++] = digits[--k];
            }
            memcpy(path + len, "/syscall", sizeof "/syscall");
            char line[64] = {0};
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                answer = -1;           /* no such file here, or not allowed to read it */
                break;
            }
            ssize_t n = read(fd, line, sizeof line - 1);
            close(fd);
            if (n <= 0) {
                answer = -1;
            } else if (strncmp(line, "running", 7) == 0 || leading_number(line) != SYS_futex) {
                answer = 0;
            }
        }
    }
    if (got < 0) {
        answer = -1;
    }
    close(dir);
    return answer;
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

static void wait_for_the_log(void) {
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

__attribute__((destructor)) static void at_exit(void) {
    wait_for_the_log();
}

static const int FATAL[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

static void on_fatal(int sig) {
    wait_for_the_log();
    /* SA_RESETHAND put the default action back on entry, SA_NODEFER left the signal
     * unblocked: this raise ends the process by the same signal. */
    raise(sig);
}

__attribute__((constructor)) static void catch_fatal_signals(void) {
    /* Its own stack: a crash from a stack overflow still runs the handler. */
    static char stack[64 * 1024];
    stack_t alt = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
    int on_alt = sigaltstack(&alt, NULL) == 0;
    for (size_t i = 0; i < sizeof FATAL / sizeof FATAL[0]; i++) {
        struct sigaction old;
        if (sigaction(FATAL[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL) {
            continue;                  /* the program has its own (or ignores it): keep it */
        }
        struct sigaction act;
        memset(&act, 0, sizeof act);
        act.sa_handler = on_fatal;
        act.sa_flags = SA_RESETHAND | SA_NODEFER | (on_alt ? SA_ONSTACK : 0);
        sigemptyset(&act.sa_mask);
        sigaction(FATAL[i], &act, NULL);
    }
}
