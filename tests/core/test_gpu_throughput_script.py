"""benchmarks/gpu_throughput.py: nothing to measure without CUDA (exit 0), and every code path runs in
its --smoke mode on the CPU, so a change that breaks the GPU-only benchmark fails here first."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def benchmark():
    spec = importlib.util.spec_from_file_location("_gpu_throughput", ROOT / "benchmarks" / "gpu_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_says_so_and_exits_0(capsys):
    assert benchmark().main([]) == 0
    assert capsys.readouterr().out == ("gpu_throughput.py needs CUDA (torch.cuda.is_available() is False here): "
                                       "nothing measured.\n")


def test_smoke_run_on_the_cpu(capsys):
    module = benchmark()
    assert module.main(["--smoke", "--archs", "small_cnn", "--dataset", "digits-noisy", "--epochs", "1",
                        "--device", "cpu", "--packing"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("| arch | calib today | calib defaults |")
    assert lines[3].startswith("| small_cnn | ") and "(loader, fp32, off)" in lines[3]


def test_paper_grid_gpu_hours_counts_every_stage1_training():
    module = benchmark()
    # compare_methods has 12 distinct Stage-I trainings per setup (CE shared by vanilla, TS, SMART, TST,
    # V-TST and MaC-Cal; 9 other losses; Mixup; MIT), MIT with two forward passes: 13 passes, each of
    # 45,000 images × 350 epochs on 2 CIFAR datasets; at 1,000 img/s for one architecture:
    assert module.grid_gpu_hours({"resnet110": 1000.0}) == pytest.approx(13 * 45_000 * 350 * 2 / 1000 / 3600)
