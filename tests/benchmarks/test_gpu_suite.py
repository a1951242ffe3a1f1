"""``benchmarks/gpu_suite.sh --dry-run`` prints its plan on a machine without a GPU."""

import re

import pytest

PART1 = {"backbone": 75, "backbone_compiled": 190, "pretrain": 145, "detector": 40}
PART2 = {"annotate": 120, "annotate_onnx_fp16": 240}
SECTIONS = PART1 | PART2
BUDGET = 10 * 60 - 30  # one 10-minute command per part, less ~30 s of process start-ups


def test_dry_run_prints_every_section_with_its_limit(bench):
    out = bench("gpu_suite.sh", "--dry-run")
    assert out.startswith(f"gpu_suite: sections {','.join(SECTIONS)}; python ")
    for name, limit in SECTIONS.items():
        assert re.search(rf"^=== {name} \(limit {limit}s\): \S+", out, re.M), out
    assert "benchmarks/backbone_step.py --device cuda --model sapiens2_1b --hw 1024 768" in out
    assert re.search(r"benchmarks/backbone_step.py .* --compile$", out, re.M)
    assert "benchmarks/pretrain_step.py --config" in out and "configs/pretrain_0.4b.yaml" in out
    assert "benchmarks/annotate_throughput.py --device cuda --sizes 0.4b --tasks pose,seg --hw 1024 768" in out
    assert "--precision bf16" in out
    onnx = re.search(r"^=== annotate_onnx_fp16 .*$", out, re.M).group(0)
    assert "benchmarks/annotate_throughput.py --device cuda --sizes 0.4b --tasks pose --hw 1024 768" in onnx
    assert "--runtimes torch,onnx-fp16" in onnx and "--no-loop" in onnx
    assert sum(PART1.values()) <= BUDGET and sum(PART2.values()) <= BUDGET
    assert out.rstrip().endswith("dry run: nothing was run")


@pytest.mark.parametrize("part, sections", [("1", PART1), ("2", PART2)])
def test_each_part_is_one_command_within_the_budget(bench, part, sections):
    out = bench("gpu_suite.sh", "--dry-run", "--part", part)
    assert re.findall(r"^=== (\w+) \(limit", out, re.M) == list(sections)


def test_dry_run_of_some_sections(bench):
    out = bench("gpu_suite.sh", "--dry-run", "--only", "detector,pretrain")
    assert re.findall(r"^=== (\w+) \(limit", out, re.M) == ["detector", "pretrain"]


def test_dry_run_of_the_distilled_student_block(bench):
    out = bench("gpu_suite.sh", "--dry-run", "--only", "distill")
    assert re.findall(r"^=== (\w+) \(limit (\d+)s\)", out, re.M) == [("distill", "60")]
    assert "benchmarks/distill_student.py --device cuda --teacher-model sapiens2_1b" in out
    assert "--student-model sapiens2_0.1b --hw 1024 768" in out
