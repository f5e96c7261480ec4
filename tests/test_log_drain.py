"""The log drain every llama.cpp program runs with (evaluation/log_drain.py, data/log_drain.c):
llama.cpp 0c1e570's logger writes from a thread the process never waits for, so a run's last
lines (the statistics, the closing timings) were lost at exit, and CI's gate failed on a log
cut four runs in a row. These tests prove the mechanism on a program of our own whose late
line is certain to be lost without it, that it bounds its wait and changes nothing else, and
that the real binaries under load keep their whole log with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dspark_convert.evaluation import engine_llama_cpp as L
from dspark_convert.evaluation import log_drain

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the drain reads /proc: Linux only")

# A worker thread that writes its line 1 s after main() returned, then waits on a
# condition variable forever, as llama.cpp's logger does once its queue is empty.
LATE_WRITER = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;

static void *late(void *arg) {
    (void) arg;
    struct timespec t = {1, 0};
    nanosleep(&t, NULL);
    fputs("late line\n", stdout);
    fflush(stdout);
    pthread_mutex_lock(&m);
    for (;;) pthread_cond_wait(&c, &m);
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t t;
    pthread_create(&t, NULL, late, NULL);
    fputs("main done\n", stdout);
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "segv") == 0) {
        volatile int *nowhere = NULL;
        *nowhere = 1;                      /* a real fault, as a crashing engine's */
    }
    return argc > 1 ? atoi(argv[1]) : 0;
}
"""

# A thread that never sleeps in futex (it naps 1 ms at a time, forever).
NEVER_RESTS = r"""
#include <pthread.h>
#include <time.h>

static void *nap(void *arg) {
    (void) arg;
    struct timespec t = {0, 1000000L};
    for (;;) nanosleep(&t, NULL);
    return NULL;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, nap, NULL);
    return 0;
}
"""


def _compile(tmp_path: Path, name: str, source: str) -> Path:
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    exe = tmp_path / name
    cc = os.environ.get("CC") or "cc"
    subprocess.run([cc, "-O1", "-pthread", "-o", str(exe), str(c)], check=True,
                   capture_output=True, timeout=60)
    return exe


def _run(exe: Path, *args: str, drain: bool) -> tuple[subprocess.CompletedProcess, float]:
    env = log_drain.environment() if drain else {k: v for k, v in os.environ.items()
                                                 if k != "LD_PRELOAD"}
    t0 = time.monotonic()
    done = subprocess.run([str(exe), *args], capture_output=True, env=env, timeout=60)
    return done, time.monotonic() - t0


def test_the_drain_is_built_on_this_machine():
    """CI and every machine that built llama.cpp has a C compiler: the drain is there."""
    status = log_drain.status()
    assert status.why_not is None, status.why_not
    assert status.library is not None and status.library.is_file()
    assert str(status.library) in log_drain.environment()["LD_PRELOAD"].split(" ")


def test_a_line_written_after_main_returned_is_kept_and_the_exit_status_is_the_programs(tmp_path):
    exe = _compile(tmp_path, "late_writer", LATE_WRITER)
    without, _ = _run(exe, "3", drain=False)
    assert without.stdout == b"main done\n"        # exit() ended the thread before its line
    assert without.returncode == 3
    with_drain, seconds = _run(exe, "3", drain=True)
    assert with_drain.stdout == b"main done\nlate line\n" and with_drain.stderr == b""
    assert with_drain.returncode == 3 and seconds < 5


def test_a_program_killed_by_a_fault_keeps_its_late_line_and_dies_by_the_same_signal(tmp_path):
    """A crash loses the queued log the same way, and those are the lines that say why the
    engine died (the AMX crash of a native build): the drain's handler waits for them, then the process
    still dies by SIGSEGV, its status unchanged."""
    exe = _compile(tmp_path, "late_writer", LATE_WRITER)
    without, _ = _run(exe, "segv", drain=False)
    assert without.stdout == b"main done\n" and without.returncode == -signal.SIGSEGV
    with_drain, seconds = _run(exe, "segv", drain=True)
    assert with_drain.stdout == b"main done\nlate line\n"
    assert with_drain.returncode == -signal.SIGSEGV and seconds < 5


def test_what_ld_preload_already_holds_is_kept(monkeypatch, tmp_path):
    other = tmp_path / "other.so"
    monkeypatch.setenv("LD_PRELOAD", str(other))
    assert log_drain.environment()["LD_PRELOAD"] == f"{log_drain.status().library} {other}"


@pytest.mark.slow
def test_a_thread_that_never_rests_holds_the_process_a_bounded_time(tmp_path):
    """The deadline (5 s): a program whose thread never sleeps in futex still ends."""
    exe = _compile(tmp_path, "never_rests", NEVER_RESTS)
    done, seconds = _run(exe, drain=True)
    assert done.returncode == 0
    assert 4 < seconds < 30


@pytest.mark.parametrize("env, why", [({"CC": "/nonexistent/cc"}, "no C compiler"),
                                      ({"CC": "false"}, "could not compile it")])
def test_without_a_compiler_the_runs_go_on_without_it_and_say_why(env, why):
    code = ("from dspark_convert.evaluation import log_drain as d; s = d.status(); "
            "print(s.library, '|', s.why_not); assert 'LD_PRELOAD' not in d.environment()")
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**base, **env}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("None | ") and why in done.stdout


@pytest.mark.slow
def test_the_real_binaries_keep_their_whole_log_under_load(llama_golden):
    """llama-speculative-simple, 30 runs while two processes keep both cores busy (the
    shape of CI's failure): every log ends with its closing timings."""
    bins = L.find_binaries(llama_golden.engine.bin)
    args = ["-m", str(llama_golden.target), "-md", str(llama_golden.exports["vanilla_conf_markov"]),
            "--spec-type", "draft-dspark", "--spec-draft-n-max", "7", "--spec-draft-p-min", "0",
            "--temp", "0", "-p", "hello world", "-n", "16", "-t", "1", "-v", *L.LOG_ARGS]
    closing = re.compile(rb"common_perf_print: +total time =(?:.*\n)*.*graphs reused")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        cut = 0
        for _ in range(30):
            done = subprocess.run([str(bins.speculative), *args], capture_output=True,
                                  timeout=120, stdin=subprocess.DEVNULL,
                                  env=log_drain.environment())
            assert done.returncode == 0, done.stderr[-2000:]
            cut += closing.search(done.stderr) is None or not done.stdout.endswith(b"\n\n")
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert cut == 0, f"{cut} of 30 runs lost the end of their log with the drain"
