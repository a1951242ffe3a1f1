"""``benchmarks/distill_student.py``: ``--help`` checks the script's imports and options every time;
its run on a real distillation is ``tests/training/test_distill_e2e.py``'s (it reads the session's
distillation run), and its GPU mode is in ``benchmarks/gpu_suite.sh`` (``--only distill``)."""


def test_help_lists_the_options(bench):
    out = bench("distill_student.py", "--help")
    for option in ("--run", "--images", "--threads", "--repeats", "--device", "--teacher-model", "--student-model"):
        assert option in out


def test_cpu_mode_needs_a_run():
    import subprocess
    import sys

    from tests.benchmarks.conftest import BENCHMARKS

    done = subprocess.run([sys.executable, str(BENCHMARKS / "distill_student.py")], capture_output=True, text=True)
    assert done.returncode == 2 and "CPU mode needs --run" in done.stderr
