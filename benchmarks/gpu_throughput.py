"""Stage-I training on a GPU: the compile mode per architecture, trials sharing a GPU, the epoch boundary.

Three measurements on ``synthetic-cifar10`` (CIFAR-10-shaped, no download), each side by side in one run:

1. **Compile modes.** For each architecture (``--archs``) and ``torch.compile`` mode (``--modes``; "off" is
   eager), one process runs calib's own Stage-I epoch loop (``calib.training.stage1``: the device pipeline
   with its augmentation, bf16, channels_last, the forward pass compiled as ``stage1.compile`` compiles it,
   the loss, backward, clipping and SGD eager) and, on the same compiled forward, a hand-written loop on one
   GPU-resident batch: the anchor calib's loop is measured against. One more process per architecture
   compiles the *whole* step (forward, loss, backward, clipping, SGD) in ``--full-step-mode``, given
   ``--compile-cap`` seconds. Every process compiles at once (the compiler is CPU-bound; the caches are
   calib's, :func:`calib.training.compile.enable_compile_caches`); then they are timed one at a time.
2. **Packing.** 1, 2 and 4 (``--packing``) trials of calib's loop for each of ``--packing-archs``, each in
   its own process, on one GPU at once: aggregate images/s and the GPU's busy share (nvidia-smi), and
   with ``--mps`` the same under NVIDIA MPS (``nvidia-cuda-mps-control -d``, stopped afterwards).
3. **The epoch boundary.** From (1): the first epoch's last, shorter batch (calib runs it eagerly: compiling a
   second graph for it cost up to 94 s), the same batch one epoch later, the first and second validation pass,
   and the graphs compiled.

Images/s count training steps only. ``--out FILE`` also writes every number as JSON. Without CUDA the
script says so and exits 0; ``--smoke`` runs every code path on any device (the CPU: no compiling).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from calib._help import HelpFormatter
from calib.artifacts.stage1 import stage1_data
from calib.config import parse_trial_config
from calib.models import create_model
from calib.study.rows import METHOD_ROWS
from calib.training.compile import CUDA_GRAPH_MODES, enable_compile_caches
from calib.training.device import autocast, configure_backend, resolve_device
from calib.training.stage1 import (  # calib's own loop, step for step, and its compile-time measure
    _excess_seconds,
    _start_run,
    _train_epoch,
    _validate,
)

PAPER_ARCHS = ("resnet20", "resnet50", "resnet110", "wrn26_10", "densenet121")
DEFAULTS = {"data_pipeline": "auto", "amp": "bf16", "channels_last": True}
CIFAR_TRAIN_IMAGES, CIFAR_EPOCHS, CIFAR_DATASETS = 45_000, 350, 2
WARMUP_STEPS = 5


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _graph_counts() -> dict[str, int]:
    """Graphs Dynamo compiled in this process, and its recompilations."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "recompiles": int(sum(counters["recompiles"].values()))}


def _timed_loop(step: Callable[[], None], steps: int, device: torch.device, batch: int) -> float:
    """Images/s of ``steps`` calls of ``step`` after :data:`WARMUP_STEPS` untimed ones."""
    for _ in range(WARMUP_STEPS):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return steps * batch / (time.perf_counter() - start)


def _calib_run(spec: dict[str, Any], device: torch.device, root: str) -> Any:
    cfg = parse_trial_config({
        "study": "gpu_throughput", "seed": 1, "dataset": spec["dataset"], "arch": spec["arch"],
        "stage1": {"epochs": 3, "milestones": [], "train_size": spec["train_images"], "compile": spec["mode"],
                   **DEFAULTS},
        "method": {"name": "vanilla"}, "data_root": root, "artifact_root": root, "device": str(device),
    })
    return _start_run(cfg, stage1_data(cfg).data, device)


def _hand_step(run: Any, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """A plain training step on one batch through calib's compiled forward; loss to optimizer eager."""
    def step() -> None:
        if run.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast(run.device, "bf16"):
            _, logits = run.forward(x)
        loss = nn.functional.cross_entropy(logits.float(), y, reduction="sum")
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(run.params, 2.0)
        run.optimizer.step()
    return step


def _epoch(run: Any, timed: bool) -> tuple[int, float, list[float]]:
    """One epoch of calib's loop: images, seconds (untimed: no per-step sync) and, timed, each step's seconds."""
    steps: list[float] = []
    cuda = run.device.type == "cuda"  # calib times steps only on CUDA; the CPU (--smoke) gets equal shares
    run.model.train()  # as train_stage1 does before each epoch (a validation left it in eval mode)
    run.loss_fn.train()
    _sync(run.device)
    start = time.perf_counter()
    *_, seen = _train_epoch(run, steps if timed and cuda else None)
    _sync(run.device)
    seconds = time.perf_counter() - start
    if timed and not cuda:
        count = -(-seen // run.cfg.stage1.batch_size)
        steps = [seconds / count] * count
    return seen, seconds, steps


def _seconds(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def calib_worker(spec: dict[str, Any], commands: Any) -> None:
    """Protocol of a calib-loop process: warm up (epoch 0 and a validation), print "ready", then answer
    "measure" (mode comparison) and "run <seconds>" (packing) on stdin until "quit"."""
    device = resolve_device(spec["device"])
    with tempfile.TemporaryDirectory() as root:
        run = _calib_run(spec, device, root)
        *_, warm_steps = _epoch(run, timed=True)  # compiles on its first batch
        first_validation = _seconds(lambda: _validate(run, 0), device)
        _emit({"event": "ready", "compile_seconds": _excess_seconds(warm_steps),
               "first_epoch_last_step": warm_steps[-1], "first_validation": first_validation})
        for line in commands:
            command = line.split()
            if command[0] == "quit":
                break
            if command[0] == "measure":
                _epoch(run, timed=False)  # anything recorded once more after the warm-up's validation
                images, seconds, _ = _epoch(run, timed=False)
                *_, steps = _epoch(run, timed=True)
                x, y = next(iter(run.batches))
                hand = _timed_loop(_hand_step(run, x, y), len(steps), device, x.shape[0])
                _emit({"event": "measured", "images_per_second": images / seconds, "hand_images_per_second": hand,
                       "median_step": statistics.median(steps[:-1]), "later_last_step": steps[-1],
                       "validation": _seconds(lambda: _validate(run, 1), device), **_graph_counts()})
            elif command[0] == "run":
                images, seconds, deadline = 0, 0.0, float(command[1])
                while time.time() < deadline:
                    seen, took, _ = _epoch(run, timed=False)
                    images, seconds = images + seen, seconds + took
                _emit({"event": "ran", "images_per_second": images / seconds})


def full_step_worker(spec: dict[str, Any], commands: Any) -> None:
    """Protocol of the whole-step process: compile forward, loss, backward, clipping and SGD as one
    function, print "ready", time it on "measure"."""
    os.nice(10)  # yields the CPU to the calib processes' compiles
    device = resolve_device(spec["device"])
    configure_backend(device)
    enable_compile_caches()
    cuda = device.type == "cuda"
    model = create_model(spec["arch"], num_classes=10, in_channels=3).to(device)
    model = model.to(memory_format=torch.channels_last) if cuda else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(128, 3, 32, 32, device=device)
    x = x.contiguous(memory_format=torch.channels_last) if cuda else x
    y = torch.randint(0, 10, (128,), device=device)

    def whole_step() -> None:
        with autocast(device, "bf16"):
            loss = nn.functional.cross_entropy(model(x).float(), y, reduction="sum")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        optimizer.step()

    compiled = whole_step if spec["mode"] == "off" else torch.compile(whole_step, mode=spec["mode"])

    def step() -> None:
        if spec["mode"] in CUDA_GRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()
        compiled()

    _emit({"event": "ready", "compile_seconds": _seconds(step, device)})
    for line in commands:
        if line.split()[0] == "measure":
            _emit({"event": "measured", "images_per_second": _timed_loop(step, spec["steps"], device, 128)})
        else:
            break


class Worker:
    """One measuring process, driven by lines on its stdin; its records are JSON lines on its stdout."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.process = subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.ready: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        """The next JSON record (other output is skipped); an error if the process ended."""
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"worker {self.spec} ended with exit code {self.process.wait()}")

    def send(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.send("quit")
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()


def wait_ready(workers: list[Worker], cap: float) -> None:
    """Wait for each worker's "ready" until ``cap`` seconds from now; the late ones are killed."""
    import selectors

    deadline = time.time() + cap
    selector = selectors.DefaultSelector()
    for worker in workers:
        selector.register(worker.process.stdout, selectors.EVENT_READ, worker)
    waiting = set(workers)
    while waiting and time.time() < deadline:
        for key, _ in selector.select(timeout=max(0.0, deadline - time.time())):
            worker = key.data
            try:
                worker.ready = worker.read()
            except RuntimeError as error:
                worker.ready = {"event": "failed", "error": str(error)}
            selector.unregister(worker.process.stdout)
            waiting.discard(worker)
    for worker in waiting:
        worker.process.kill()
        worker.ready = {"event": "late", "error": f"not compiled within {cap:.0f} s"}


class BusyMeter:
    """The GPU's utilisation (nvidia-smi every 200 ms) while in a ``with`` block; None without nvidia-smi."""

    def __enter__(self) -> BusyMeter:
        self.process = None
        self.share: float | None = None
        if shutil.which("nvidia-smi") and torch.cuda.is_available():
            self.process = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu",
                                             "--format=csv,noheader,nounits", "-lms", "200"],
                                            stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            values = [float(v) for v in self.process.communicate()[0].split() if v.strip().isdigit()]
            self.share = statistics.mean(values) if values else None


def measure_modes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Section 1: every (architecture, mode) process and one whole-step process per architecture."""
    base = {"device": args.device, "dataset": args.dataset, "train_images": args.train_images}
    workers = [Worker({**base, "kind": "calib", "arch": arch, "mode": mode})
               for arch in args.archs for mode in args.modes]
    if args.full_step_mode != "none":
        workers += [Worker({**base, "kind": "full", "arch": arch, "mode": args.full_step_mode,
                            "steps": args.train_images // 128}) for arch in args.archs]
    wait_ready(workers, args.compile_cap)
    rows = []
    for worker in workers:  # one at a time: each has the GPU to itself
        row = {**worker.spec, **worker.ready}
        if worker.ready["event"] == "ready":
            worker.send("measure")
            try:
                row.update(worker.read())
            except RuntimeError as error:
                row.update(event="failed", error=str(error))
        worker.stop()
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def best_modes(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Architecture → the mode whose calib loop was fastest."""
    best: dict[str, tuple[float, str]] = {}
    for row in rows:
        if row["kind"] == "calib" and row.get("event") == "measured":
            rate = row["images_per_second"]
            if rate > best.get(row["arch"], (0.0, ""))[0]:
                best[row["arch"]] = (rate, row["mode"])
    return {arch: mode for arch, (_, mode) in best.items()}


def _mps(command: str, env: dict[str, str]) -> str | None:
    """Start ("-d") or stop ("quit") the MPS control daemon; the reason it could not, or None."""
    if shutil.which("nvidia-cuda-mps-control") is None:
        return "nvidia-cuda-mps-control is not on PATH"
    argv, stdin = (["nvidia-cuda-mps-control", "-d"], None) if command == "-d" else (["nvidia-cuda-mps-control"],
                                                                                      "quit\n")
    done = subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True, timeout=30)
    return None if done.returncode == 0 else f"exit {done.returncode}: {(done.stderr or done.stdout).strip()}"


def measure_packing(args: argparse.Namespace, modes: dict[str, str], mps: bool) -> list[dict[str, Any]]:
    """Section 2: ``max(--packing)`` processes per architecture, then rounds of k of them at once."""
    env = dict(os.environ)
    rows: list[dict[str, Any]] = []
    if mps:
        env["CUDA_MPS_PIPE_DIRECTORY"] = tempfile.mkdtemp(prefix="mps-pipe-")
        env["CUDA_MPS_LOG_DIRECTORY"] = tempfile.mkdtemp(prefix="mps-log-")
        reason = _mps("-d", env)
        if reason is not None:
            return [{"mps": True, "error": f"MPS not started: {reason}"}]
    try:
        base = {"device": args.device, "dataset": args.dataset, "train_images": args.train_images, "kind": "calib"}
        workers = {arch: [Worker({**base, "arch": arch, "mode": modes.get(arch, "off")}, env)
                          for _ in range(max(args.packing))] for arch in args.packing_archs}
        wait_ready([w for group in workers.values() for w in group], args.packing_cap)
        for arch, group in workers.items():
            for count in args.packing:
                running = [w for w in group[:count] if w.ready["event"] == "ready"]
                if len(running) < count:
                    rows.append({"arch": arch, "mps": mps, "trials": count, "error": "a process did not start"})
                    continue
                with BusyMeter() as busy:
                    for worker in running:
                        worker.send(f"run {time.time() + args.round_seconds}")
                    rates = [worker.read()["images_per_second"] for worker in running]
                rows.append({"arch": arch, "mode": modes.get(arch, "off"), "mps": mps, "trials": count,
                             "per_trial": rates, "aggregate": sum(rates), "gpu_busy": busy.share})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        for worker in (w for group in workers.values() for w in group):
            worker.stop()
    finally:
        if mps:
            _mps("quit", env)
    return rows


def grid_gpu_hours(throughput: dict[str, float]) -> float:
    """GPU-hours of the paper ``compare_methods`` grid's Stage-I trainings on CIFAR-10 and CIFAR-100:
    one per distinct Stage-I loss or schedule of its rows (MIT's two forward passes count twice)."""
    stage1_rows = {(row.loss["name"], tuple(sorted(row.stage1.items()))) for row in METHOD_ROWS.values()}
    passes = sum(2 if dict(changes).get("mit_alpha") else 1 for _, changes in stage1_rows)
    images = CIFAR_TRAIN_IMAGES * CIFAR_EPOCHS * CIFAR_DATASETS * passes
    return sum(images / rate for rate in throughput.values()) / 3600


def print_tables(modes: list[dict[str, Any]], packing: list[dict[str, Any]]) -> None:
    """The three Markdown tables."""
    def rate(row: dict[str, Any] | None, key: str = "images_per_second") -> str:
        return f"{row[key]:,.0f}" if row and key in row else (row or {}).get("error", "–")

    full = {r["arch"]: r for r in modes if r["kind"] == "full"}
    calib = [r for r in modes if r["kind"] == "calib"]
    print("| arch | mode | calib loop img/s | 128 / median step | hand loop, same compile | calib / hand "
          "| whole step compiled | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in calib:
        measured = "hand_images_per_second" in row
        ratio = f"{row['images_per_second'] / row['hand_images_per_second']:.2f}" if measured else "–"
        per_step = f"{128 / row['median_step']:,.0f}" if measured else "–"
        whole = full.get(row["arch"])
        print(f"| {row['arch']} | {row['mode']} | {rate(row)} | {per_step} | {rate(row, 'hand_images_per_second')} "
              f"| {ratio} | {rate(whole)} ({whole['mode'] if whole else '–'}) | {row.get('compile_seconds', 0):.0f} |")
    print("\n| arch | mode | first epoch's last batch s | a later epoch's last batch s | median step s "
          "| first / later validation s | graphs (recompiles) |")
    print("|---|---|---|---|---|---|---|")
    for row in (r for r in calib if r.get("event") == "measured"):
        print(f"| {row['arch']} | {row['mode']} | {row['first_epoch_last_step']:.2f} | {row['later_last_step']:.3f} "
              f"| {row['median_step']:.4f} | {row['first_validation']:.2f} / {row['validation']:.2f} | "
              f"{row['graphs']} ({row['recompiles']}) |")
    print("\n| arch | mode | MPS | trials | aggregate img/s | × one trial | per trial | GPU busy % |")
    print("|---|---|---|---|---|---|---|---|")
    alone = {(r["arch"], r["mps"]): r["aggregate"] for r in packing if r.get("trials") == 1 and "aggregate" in r}
    for row in packing:
        if "aggregate" not in row:
            print(f"| {row.get('arch', '–')} | – | {row['mps']} | {row.get('trials', '–')} | {row['error']} |||")
            continue
        busy = "–" if row["gpu_busy"] is None else f"{row['gpu_busy']:.0f}"
        single = alone.get((row["arch"], row["mps"]))
        print(f"| {row['arch']} | {row['mode']} | {'on' if row['mps'] else 'off'} | {row['trials']} | "
              f"{row['aggregate']:,.0f} | {'–' if single is None else format(row['aggregate'] / single, '.2f')} | "
              f"{' + '.join(f'{r:,.0f}' for r in row['per_trial'])} | {busy} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--archs", nargs="+", default=list(PAPER_ARCHS), help="architectures of section 1")
    parser.add_argument("--modes", nargs="+", default=["off", "default", "reduce-overhead"],
                        help="torch.compile modes of calib's loop (off: eager)")
    parser.add_argument("--full-step-mode", default="default", help="mode of the whole-step loop (none: skip)")
    parser.add_argument("--compile-cap", type=float, default=240.0, help="seconds every process has to compile")
    parser.add_argument("--packing-cap", type=float, default=120.0,
                        help="seconds the packing processes have to start (they compile from section 1's caches)")
    parser.add_argument("--packing", type=int, nargs="*", default=[1, 2, 4], help="trials sharing the GPU (none: skip)")
    parser.add_argument("--packing-archs", nargs="+", default=["resnet110", "resnet20"],
                        help="architectures of section 2")
    parser.add_argument("--mps", action="store_true", help="measure the packing under NVIDIA MPS too")
    parser.add_argument("--round-seconds", type=float, default=5.0, help="length of each packing round")
    parser.add_argument("--train-images", type=int, default=4168,
                        help="training images of each process: 32 batches of 128 and a last one of 72, as in "
                             "CIFAR's 45,000")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (cpu only with --smoke)")
    parser.add_argument("--dataset", default="synthetic-cifar10", help="dataset of the calib processes")
    parser.add_argument("--out", default=None, help="also write every number to this JSON file")
    parser.add_argument("--smoke", action="store_true",
                        help="run on any device: checks the script, measures nothing (e.g. --archs small_cnn "
                             "--dataset digits-noisy --device cpu --train-images 200)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        (calib_worker if spec["kind"] == "calib" else full_step_worker)(spec, sys.stdin)
        return 0
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_throughput.py needs CUDA (torch.cuda.is_available() is False here): nothing measured.")
        return 0
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"{name} · torch {torch.__version__} · {args.dataset}, {args.train_images} training images, batch 128 · "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    modes = measure_modes(args)
    chosen = best_modes(modes)
    packing = [] if not args.packing else measure_packing(args, chosen, mps=False)
    if args.packing and args.mps:
        packing += measure_packing(args, chosen, mps=True)
    print_tables(modes, packing)
    print(f"\nfastest mode per architecture: {chosen}")
    if set(chosen) >= {"resnet50", "resnet110", "wrn26_10", "densenet121"}:
        rates = {a: max(r["images_per_second"] for r in modes if r["arch"] == a and "images_per_second" in r
                        and r["kind"] == "calib") for a in ("resnet50", "resnet110", "wrn26_10", "densenet121")}
        print(f"paper compare_methods grid, CIFAR-10/100 Stage I on one such GPU: {grid_gpu_hours(rates):,.0f} "
              "GPU-hours at the fastest modes")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "torch": torch.__version__, "modes": modes,
                                              "packing": packing, "chosen": chosen}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
