"""benchmarks/gpu_throughput.py: nothing to measure without CUDA (exit 0), and every code path runs in
its --smoke mode on the CPU, so a change that breaks the GPU-only benchmark fails here first."""

import importlib.util
import json
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


def test_smoke_run_on_the_cpu(capsys, tmp_path):
    module = benchmark()
    out = tmp_path / "gpu.json"
    assert module.main(["--smoke", "--archs", "small_cnn", "--dataset", "digits-noisy", "--device", "cpu",
                        "--train-images", "200", "--modes", "off", "--full-step-mode", "off", "--packing", "2",
                        "--packing-archs", "small_cnn", "--round-seconds", "0.5", "--mps", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("| arch | mode | calib loop img/s | 128 / median step | hand loop, same compile |")
    assert lines[3].startswith("| small_cnn | off | ")
    record = json.loads(out.read_text())
    calib_row = next(r for r in record["modes"] if r["kind"] == "calib")
    # 200 images in batches of 128: one full batch and a last one of 72, whose step is timed apart
    assert calib_row["event"] == "measured" and calib_row["graphs"] == 0
    assert [(r["trials"], len(r["per_trial"])) for r in record["packing"] if not r["mps"]] == [(2, 2)]
    assert next(r for r in record["modes"] if r["kind"] == "full")["event"] == "measured"
    # no MPS on this machine: the benchmark says why instead of measuring
    assert [r["error"] for r in record["packing"] if r["mps"]] == [
        "MPS not started: nvidia-cuda-mps-control is not on PATH"]
    assert record["chosen"] == {"small_cnn": "off"}


def test_paper_grid_gpu_hours_counts_every_stage1_training():
    module = benchmark()
    # compare_methods has 19 distinct Stage-I trainings per setup (CE shared by vanilla, TS, SMART, TST,
    # V-TST and MaC-Cal; 14 other losses; Mixup; MIT; PLP; BalCAL), MIT with two forward passes: 20 passes, each
    # of 45,000 images × 350 epochs on 2 CIFAR datasets; at 1,000 img/s for one architecture:
    assert module.grid_gpu_hours({"resnet110": 1000.0}) == pytest.approx(20 * 45_000 * 350 * 2 / 1000 / 3600)
