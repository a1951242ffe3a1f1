"""``benchmarks/gpu_suite.sh --dry-run`` prints its plan on a machine without a GPU."""

import re

SECTIONS = {"backbone": 75, "backbone_compiled": 190, "pretrain": 145, "detector": 40, "annotate": 120}


def test_dry_run_prints_every_section_with_its_limit(bench):
    out = bench("gpu_suite.sh", "--dry-run")
    assert out.startswith("gpu_suite: sections backbone,backbone_compiled,pretrain,detector,annotate; python ")
    for name, limit in SECTIONS.items():
        assert re.search(rf"^=== {name} \(limit {limit}s\): \S+", out, re.M), out
    assert "benchmarks/backbone_step.py --device cuda --model sapiens2_1b --hw 1024 768" in out
    assert re.search(r"benchmarks/backbone_step.py .* --compile$", out, re.M)
    assert "benchmarks/pretrain_step.py --config" in out and "configs/pretrain_0.4b.yaml" in out
    assert "benchmarks/annotate_throughput.py --device cuda --sizes 0.4b --tasks pose,seg --hw 1024 768" in out
    assert "--precision bf16" in out
    assert sum(SECTIONS.values()) <= 10 * 60 - 30  # the suite's budget, less ~30 s of process start-ups
    assert out.rstrip().endswith("dry run: nothing was run")


def test_dry_run_of_some_sections(bench):
    out = bench("gpu_suite.sh", "--dry-run", "--only", "detector,pretrain")
    assert re.findall(r"^=== (\w+) \(limit", out, re.M) == ["detector", "pretrain"]


def test_dry_run_of_the_distilled_student_block(bench):
    out = bench("gpu_suite.sh", "--dry-run", "--only", "distill")
    assert re.findall(r"^=== (\w+) \(limit (\d+)s\)", out, re.M) == [("distill", "60")]
    assert "benchmarks/distill_student.py --device cuda --teacher-model sapiens2_1b" in out
    assert "--student-model sapiens2_0.1b --hw 1024 768" in out
