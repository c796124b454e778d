"""Stage-I training throughput on a GPU: calib's trial path against hand-written loops, per architecture.

For each paper architecture on CIFAR-10-shaped data (``synthetic-cifar10``: no download), in one run:

- **calib (today)**: ``run_trial`` as a study runs it, with the settings calib had before the GPU
  work (DataLoader pipeline, fp32, no compile, contiguous memory);
- **calib (defaults)**: the same with the paper preset's settings now (device pipeline, bf16,
  ``compile: auto``, channels_last);
- **eager hand loop**: a plain PyTorch loop on GPU-resident data (bf16, channels_last, no
  augmentation: an upper bound for an uncompiled loop);
- **compiled hand loop**: the same loop under ``torch.compile`` in each of ``--compile-modes``; the
  best mode is printed;
- **packed**: 1, 2 and 4 calib trials (defaults) sharing the GPU at once, aggregate images/s and the
  peak memory of each.

Images/s count training steps only (compilation and validation excluded: ``stage1_images_per_second``
and ``stage1_compile_seconds`` in the store). The last line estimates the GPU-hours of the paper
preset's ``compare_methods`` grid (MaC-Cal Table 1's CIFAR setups × every Stage-I loss) at today's
settings and at the new defaults. ``python benchmarks/gpu_throughput.py`` on a machine without CUDA
says so and exits 0; ``--smoke`` runs every code path briefly (on the CPU too) to check the script.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

from calib.cli import HelpFormatter
from calib.datasets import load_dataset
from calib.models import create_model
from calib.study_rows import METHOD_ROWS
from calib.training.device import configure_backend, resolve_device
from calib.trial import run_trial

PAPER_ARCHS = ("resnet50", "resnet110", "wrn26_10", "densenet121")
TODAY = {"data_pipeline": "loader", "amp": "off", "compile": "off", "channels_last": False}
DEFAULTS = {"data_pipeline": "auto", "amp": "bf16", "compile": "auto", "channels_last": True}
CIFAR_TRAIN_IMAGES, CIFAR_EPOCHS, CIFAR_DATASETS = 45_000, 350, 2


def calib_trial(arch: str, dataset: str, settings: dict, device: str, epochs: int) -> dict:
    """One Stage-I training through ``run_trial`` (vanilla, a fresh artifact); what the store records."""
    with tempfile.TemporaryDirectory() as tmp:
        result = run_trial({
            "study": "gpu_throughput", "seed": 1, "dataset": dataset, "arch": arch,
            "stage1": {"epochs": epochs, "milestones": [], **settings},
            "method": {"name": "vanilla"}, "data_root": tmp, "artifact_root": tmp, "device": device,
        })
    return {"images_per_second": result.timings["stage1_images_per_second"],
            "compile_seconds": result.timings["stage1_compile_seconds"], **result.stage1_execution}


def hand_loop(arch: str, device: torch.device, *, steps: int, batch_size: int, mode: str | None) -> float:
    """Images/s of a plain loop on GPU-resident random batches (bf16 autocast on CUDA, channels_last),
    compiled with ``mode`` (None: eager); the first steps (compilation, warm-up) are not timed."""
    configure_backend(device)
    model = create_model(arch, num_classes=10, in_channels=3).to(device)
    cuda = device.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    x = torch.randn(batch_size, 3, 32, 32, device=device)
    x = x.contiguous(memory_format=torch.channels_last) if cuda else x
    y = torch.randint(0, 10, (batch_size,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = criterion(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        optimizer.step()

    run = step if mode is None else torch.compile(step, mode=mode)
    warmup = 5
    for i in range(steps + warmup):
        if i == warmup:
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        if mode in ("reduce-overhead", "max-autotune"):
            torch.compiler.cudagraph_mark_step_begin()
        run()
    if cuda:
        torch.cuda.synchronize(device)
    return steps * batch_size / (time.perf_counter() - start)


def packed(arch: str, args: argparse.Namespace, count: int) -> dict:
    """``count`` calib trials (defaults) at once on the GPU, each in its own process."""
    command = [sys.executable, __file__, "--worker", arch, "--device", args.device, "--epochs", str(args.epochs),
               "--dataset", args.dataset]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    peaks = [r["stage1_peak_memory_bytes"] for r in results]
    return {"aggregate_images_per_second": sum(r["images_per_second"] for r in results),
            "peak_memory_gib": [None if p is None else round(p / 2**30, 2) for p in peaks]}


def grid_gpu_hours(throughput: dict[str, float]) -> float:
    """GPU-hours of the paper ``compare_methods`` grid's Stage-I trainings on CIFAR-10 and CIFAR-100:
    one per distinct Stage-I loss or schedule of its rows (MIT's two forward passes count twice)."""
    stage1_rows = {(row.loss["name"], tuple(sorted(row.stage1.items()))) for row in METHOD_ROWS.values()}
    passes = sum(2 if dict(changes).get("mit_alpha") else 1 for _, changes in stage1_rows)
    images = CIFAR_TRAIN_IMAGES * CIFAR_EPOCHS * CIFAR_DATASETS * passes
    return sum(images / rate for rate in throughput.values()) / 3600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--archs", nargs="+", default=list(PAPER_ARCHS), help="architectures to measure")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (cpu only with --smoke)")
    parser.add_argument("--dataset", default="synthetic-cifar10", help="dataset of the calib trials")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each calib trial (the first compiles)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps of each hand loop")
    parser.add_argument("--batch-size", type=int, default=128, help="batch size of the hand loops")
    parser.add_argument("--compile-modes", nargs="+",
                        default=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                        help="torch.compile modes of the compiled hand loop")
    parser.add_argument("--packing", type=int, nargs="*", default=[1, 2, 4], help="trials sharing the GPU (none: skip)")
    parser.add_argument("--smoke", action="store_true",
                        help="run on any device with 3 hand-loop steps: checks the script, measures nothing "
                             "(with e.g. --archs small_cnn --dataset digits-noisy --epochs 1 --device cpu)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one packed trial: print its record as the last line
        print(json.dumps(calib_trial(args.worker, args.dataset, DEFAULTS, args.device, args.epochs)))
        return 0
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_throughput.py needs CUDA (torch.cuda.is_available() is False here): nothing measured.")
        return 0
    device = resolve_device(args.device)
    load_dataset(args.dataset, "")  # generate (or check) the data once before timing anything
    steps = 3 if args.smoke else args.steps
    print(f"device {device} · torch {torch.__version__} · {args.dataset} · batch {args.batch_size}")
    print("| arch | calib today | calib defaults | eager hand loop | best compiled hand loop | defaults / best |"
          " compile s | packed 1 / 2 / 4 (img/s) | peak GiB per trial |")
    print("|---|---|---|---|---|---|---|---|---|")
    today, new = {}, {}
    for arch in args.archs:
        old = calib_trial(arch, args.dataset, TODAY, str(device), args.epochs)
        ours = calib_trial(arch, args.dataset, DEFAULTS, str(device), args.epochs)
        eager = hand_loop(arch, device, steps=steps, batch_size=args.batch_size, mode=None)
        compiled = {}
        if device.type == "cuda":
            for mode in args.compile_modes:
                compiled[mode] = hand_loop(arch, device, steps=steps, batch_size=args.batch_size, mode=mode)
        best_mode = max(compiled, key=compiled.get) if compiled else "eager"
        best = max([eager, *compiled.values()])
        packs = {k: packed(arch, args, k) for k in args.packing}
        today[arch], new[arch] = old["images_per_second"], ours["images_per_second"]
        print(f"| {arch} | {old['images_per_second']:,.0f} | {ours['images_per_second']:,.0f} "
              f"({ours['stage1_pipeline']}, {ours['stage1_precision']}, {ours['stage1_compile_mode']}) | "
              f"{eager:,.0f} | {best:,.0f} ({best_mode}) | {ours['images_per_second'] / best:.2f} | "
              f"{ours['compile_seconds']:.0f} | "
              + " / ".join(f"{p['aggregate_images_per_second']:,.0f}" for p in packs.values())
              + f" | {' / '.join(str(p['peak_memory_gib'][0]) for p in packs.values())} |", flush=True)
    if set(args.archs) == set(PAPER_ARCHS):
        print(f"paper compare_methods grid, CIFAR-10/100 Stage I on one GPU: {grid_gpu_hours(today):,.0f} GPU-hours "
              f"at today's settings, {grid_gpu_hours(new):,.0f} at the new defaults")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
