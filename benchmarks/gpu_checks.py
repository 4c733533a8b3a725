"""Checks that need a GPU, run as one prepared script: timing, out-of-memory, fp16, a search.

1. **Synchronized timing.** (a) One process times the same steps on a batch already on the
   device with the clock stopped right after the last launch and after
   ``torch.cuda.synchronize()``: how wrong an unsynchronized clock reads. (b) ``trainopt
   measure`` against a plain hand-written loop that synchronizes at the edges of its timed
   window, interleaved run by run: the ratio of medians should be close to 1. (c) The same
   with both sides reading the loss alike (``fidelity``): every step, and never.
2. **fp16 with GradScaler**, bf16 and full precision: ``trainopt measure`` of each, with the
   scaler's figures for fp16 (scale, skipped steps) and a finite loss.
3. **A real CUDA out-of-memory under a cap.** ``trainopt measure`` of a batch too large for
   ``limits.memory_gb`` must come back ``oom``; then (last) a search of the batch size
   alone under the same cap backs off from the probes that ran out of memory.
4. **A small search on the GPU**: amp and pin_memory, with sessions of live arms where they
   fit on the device together; the session modes and verdicts.
5. **Where a step's time goes** (``breakdown``): diagnosed trials of ResNet-18 at batch 32
   without loader workers (expected input- or host-bound) and at batch 256 with workers
   (expected compute-bound): each phase's share, ``device_busy`` from the profiler, NVML's
   figures where ``nvidia-ml-py`` is installed, and the bottleneck verdict.
6. **The training check** of bf16, fp16 (with the GradScaler's skipped steps) and compile on
   ResNet-18: ``trainopt verify --set`` of each against the small search's baseline.

Every step has its own time limit and the script stops starting steps past ``--budget-s``;
``summary.json`` and ``summary.md`` in ``--out`` hold what ran. ``--device cpu --quick``
runs the same steps on a CPU with a tiny model (to check the script itself).

    python benchmarks/gpu_checks.py --out DIR
    python benchmarks/gpu_checks.py --out DIR --device cpu --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# A plain loop over the same workload: warm-up, then timed steps between two synchronizations.
# With "resident", one batch already on the device, so the clock measures the device's work.
PLAIN = r"""
import json, sys, time, torch
from trainopt.contract.spec import load_spec
from trainopt.trial.workloads import build_workload
spec = load_spec(sys.argv[1]); r = spec.resolved(); resident = sys.argv[2] == "resident"; item = sys.argv[2] == "item"
dev = torch.device(r["device"] if r["device"] != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
torch.manual_seed(r["seed"])
w = build_workload(r, spec.source_dir())
model = w.model.to(dev); model.train()
bs = r["baseline"]["batch_size"]
loader = torch.utils.data.DataLoader(w.dataset, batch_size=bs, shuffle=True, drop_last=True)
opt = w.optimizer_factory(model.parameters(), "default")
def batches():
    while True:
        yield from loader
it = batches()
fixed = [t.to(dev) for t in next(it)]
def step():
    x, y = fixed if resident else [t.to(dev) for t in next(it)]
    loss = w.loss_fn(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    if item:
        loss.item()  # the loss read on the host every step, as a script that logs it does
def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
m = r["measure"]
sync(); t0 = time.perf_counter(); n = 0
while n < m["warmup_steps"] or time.perf_counter() - t0 < m["warmup_seconds"]:
    step(); n += 1
sync()
steps = max(1, int(m["windows"] * m["window_seconds"] / ((time.perf_counter() - t0) / n)))
t0 = time.perf_counter()
for _ in range(steps):
    step()
launched = time.perf_counter() - t0
sync()
done = time.perf_counter() - t0
print(json.dumps({"samples_per_s": steps * bs / done, "unsynced_samples_per_s": steps * bs / launched,
                  "steps": steps, "device": str(dev)}))
"""


def base_spec(device: str, quick: bool) -> dict:
    """ResNet-18 (width 64) on CIFAR-sized synthetic images; a tiny MLP with --quick."""
    if quick:
        model = {"name": "mlp", "args": {"hidden": 32, "layers": 1}}
        data = {"name": "synthetic-tabular", "args": {"size": 2048, "features": 16}}
        measure = {"warmup_steps": 2, "warmup_seconds": 0.2, "window_seconds": 0.2, "windows": 3,
                   "trial_timeout_s": 120, "pairs": 3, "max_pairs": 7}
    else:
        model = {"name": "resnet18", "args": {"num_classes": 10, "width": 64}}
        data = {"name": "synthetic-images", "args": {"size": 8192, "shape": [3, 32, 32], "num_classes": 10}}
        measure = {"warmup_steps": 3, "warmup_seconds": 1.0, "window_seconds": 0.4, "windows": 3,
                   "trial_timeout_s": 240, "pairs": 6, "max_pairs": 8}
    return {
        "name": "gpu-checks",
        "device": device,
        "model": model,
        "data": data,
        "loss": "cross_entropy",
        "optimizer": {"name": "sgd", "args": {"lr": 0.1, "momentum": 0.9}},
        "baseline": {"batch_size": 256, "amp": "off", "num_workers": 0},
        "measure": measure,
    }


class Checks:
    def __init__(self, out: Path, device: str, quick: bool, budget_s: float):
        self.out, self.device, self.quick = out, device, quick
        self.deadline = time.monotonic() + budget_s
        self.work = out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.summary: dict = {"device": device, "quick": quick, "steps": {}}
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")

    def spec_file(self, name: str, **changes) -> Path:
        doc = base_spec(self.device, self.quick)
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key] = {**doc[key], **value}
            else:
                doc[key] = value
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        left = self.deadline - time.monotonic()
        return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=self.env,
                              timeout=max(5.0, min(timeout, left + 30)))

    def measure(self, spec: Path, name: str, *sets: str, timeout: float = 300) -> dict:
        args = [sys.executable, "-m", "trainopt", "measure", str(spec), "--json", "--out", str(self.work / name)]
        for item in sets:
            args += ["--set", item]
        proc = self.run(args, timeout)
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError:
            return {"status": "no-json", "rc": proc.returncode, "stderr": proc.stderr[-1500:]}

    def plain(self, spec: Path, how: str) -> dict:
        proc = self.run([sys.executable, "-c", PLAIN, str(spec), how], 300)
        if proc.returncode:
            return {"error": proc.stderr[-1500:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def step(self, name: str, fn) -> None:
        if time.monotonic() > self.deadline:
            self.summary["steps"][name] = {"skipped": "out of time"}
            print(f"== {name}: skipped (out of time)", flush=True)
            return
        t0 = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            result = fn()
        except Exception as exc:  # one failed check must not lose the others' figures
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["wall_s"] = round(time.monotonic() - t0, 1)
        self.summary["steps"][name] = result
        print(json.dumps(result, indent=1, default=str)[:4000], flush=True)
        self.save()

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))

    # ---- the checks ----

    def env_info(self) -> dict:
        import torch

        info = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda}
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(name=p.name, total_memory_gib=round(p.total_memory / 1024**3, 1), sms=p.multi_processor_count)
        if shutil.which("nvidia-smi"):
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
        return info

    def sync_timing(self) -> dict:
        spec = self.spec_file("sync", measure={"warmup_seconds": 2.0, "windows": 5, "window_seconds": 0.5})
        resident = self.plain(spec, "resident")
        runs = 2 if self.quick else 3
        ours, plain = [], []
        for i in range(runs):
            r = self.measure(spec, f"sync-{i}")
            ours.append(r.get("samples_per_s"))
            p = self.plain(spec, "loader")
            plain.append(p.get("samples_per_s"))
        ok = [a for a in ours if a] and [b for b in plain if b]
        return {
            "resident_batch": resident,
            "unsynced_over_synced": (resident["unsynced_samples_per_s"] / resident["samples_per_s"]) if "samples_per_s" in resident else None,
            "trainopt_samples_per_s": ours,
            "plain_samples_per_s": plain,
            "fidelity_median_ratio": statistics.median([a for a in ours if a]) / statistics.median([b for b in plain if b]) if ok else None,
        }

    def fidelity(self) -> dict:
        """``trainopt measure`` against the plain loop, each reading the loss as the other does.

        sync_every 1 (the default: the loss read on the host every step) against a plain loop
        that calls ``loss.item()`` every step; sync_every 0 against one that never does.
        Interleaved run by run.
        """
        spec = self.spec_file("fidelity", measure={"warmup_seconds": 1.0, "windows": 3, "window_seconds": 0.5})
        runs = 2
        out = {}
        for every, how in ((1, "item"), (0, "loader")):
            ours, plain = [], []
            for i in range(runs):
                r = self.measure(spec, f"fid-{every}-{i}", f"sync_every={every}")
                ours.append(r.get("samples_per_s"))
                plain.append(self.plain(spec, how).get("samples_per_s"))
            ok = all(ours) and all(plain)
            out[f"sync_every_{every}"] = {"trainopt": ours, "plain": plain,
                                          "ratio": statistics.median(ours) / statistics.median(plain) if ok else None}
        return out

    def amp(self) -> dict:
        spec = self.spec_file("amp")
        out = {}
        for amp in ("off", "bf16", "fp16"):
            r = self.measure(spec, f"amp-{amp}", f"amp={amp}")
            out[amp] = {k: r.get(k) for k in ("status", "samples_per_s", "iqr", "first_loss", "last_loss", "steps",
                                              "grad_scaler", "peak_memory_bytes", "error", "stderr")}
        return out

    def diagnosed(self, spec: Path, name: str, timeout: float = 300) -> dict:
        """One trial process with ``diagnose`` set: the timed windows, then the profiled window."""
        sys.path.insert(0, str(ROOT))
        from trainopt.contract.protocol import TrialRequest
        from trainopt.contract.spec import load_spec
        from trainopt.execute.runner import SubprocessRunner

        loaded = load_spec(spec)
        folder = self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        request = TrialRequest(spec=loaded.resolved(), source_dir=str(loaded.source_dir()), settings=dict(loaded.baseline),
                               mode="measure", result_path=str(folder / "result.json"), trial_id=name, diagnose=True)
        left = self.deadline - time.monotonic()
        return SubprocessRunner().run(request, folder / "trial.log", max(5.0, min(timeout, left + 30))).to_dict()

    def breakdown(self) -> dict:
        """Where a step's time goes: small batch without workers against a large one with workers."""
        from trainopt.decide.bottleneck import diagnose

        cuda = self.device.startswith("cuda")
        out = {}
        cases = (("batch32_workers0", 32, 0, ["input", "host"]), ("batch256_workers4", 256, 2 if self.quick else 4, ["compute"]))
        for name, batch, workers, expected in cases:
            spec = self.spec_file(f"breakdown-{name}", baseline={"batch_size": batch, "num_workers": workers,
                                                                  "pin_memory": cuda and workers > 0},
                                  measure={"breakdown_steps": 20})
            r = self.diagnosed(spec, f"breakdown-{name}")
            b = r.get("breakdown") or {}
            verdict = diagnose(b or None, r.get("data_wait_fraction"))
            out[name] = {
                "status": r.get("status"), "error": r.get("error"), "samples_per_s": r.get("samples_per_s"),
                "shares": {k: round(v, 3) for k, v in (b.get("shares") or {}).items()},
                "device_busy": b.get("device_busy"), "gpu_utilization": b.get("gpu_utilization"),
                "gpu_memory_used_bytes": b.get("gpu_memory_used_bytes"), "profiled_steps": b.get("steps"),
                "verdict": verdict["bottleneck"], "reason": verdict["reason"], "expected": expected,
                # Only a GPU makes the expectation meaningful: --quick runs a tiny MLP on a CPU.
                "as_expected": verdict["bottleneck"] in expected if cuda else None,
            }
        return out

    def _capped(self) -> tuple[float, int, dict]:
        """The memory cap, a batch far over it, and a data set large enough to hold that batch."""
        # On a CPU the cap is on address space, which torch's own libraries take a share of.
        cap = 3.0 if self.quick else 4.0
        huge = 2**21 if self.quick else 65536
        data = base_spec(self.device, self.quick)["data"]
        return cap, huge, {**data, "args": {**data["args"], "size": 2 * huge}}

    def oom(self) -> dict:
        cap, huge, data = self._capped()
        spec = self.spec_file("oom", limits={"memory_gb": cap, "effective_batch": None}, data=data)
        r = self.measure(spec, "oom-measure", f"batch_size={huge}")
        return {"memory_gb": cap, "batch_size": huge, "status": r.get("status"), "error": (r.get("error") or r.get("stderr") or "")[:300],
                "wall_s_trial": r.get("wall_s")}

    def oom_search(self) -> dict:
        cap, huge, data = self._capped()
        spec = self.spec_file("oom-search", limits={"memory_gb": cap, "effective_batch": None}, data=data,
                              search={"batch_size": {"max": huge}})
        doc = self.search(spec, "oom-search", 420)
        if "error" in doc:
            return doc
        info = doc.get("batch_size") or {}
        probes = [{k: p.get(k) for k in ("size", "status", "peak_memory_bytes")} for p in info.get("probes", [])]
        return {"memory_gb": cap, "probes": probes, "max_fitting": info.get("max_fitting"), "safe_max": info.get("safe_max"),
                "decisions": self._decisions(doc), "kept_batch": (doc.get("best") or {}).get("settings", {}).get("batch_size"),
                "sessions": doc.get("sessions"), "elapsed_s": doc.get("elapsed_s"), "rc": doc.get("rc"), "complete": doc.get("complete")}

    def small_search(self) -> dict:
        spec = self.spec_file("search", search={"amp": ["off", "bf16", "fp16"], "pin_memory": [False, True]})
        doc = self.search(spec, "small-search", 600)
        if "error" in doc:
            return doc
        final = doc.get("final") or {}
        return {"rc": doc.get("rc"), "complete": doc.get("complete"), "elapsed_s": doc.get("elapsed_s"), "sessions": doc.get("sessions"),
                "decisions": self._decisions(doc), "warnings": doc.get("warnings"),
                "best": {k: (doc.get("best") or {}).get("settings", {}).get(k) for k in ("amp", "num_workers", "pin_memory")},
                "source": (doc.get("best") or {}).get("source"), "error_rates": (doc.get("error_rates") or {}).get("text"),
                "final": {k: final.get(k) for k in ("verdict", "speedup", "ci", "n_pairs", "baseline_samples_per_s",
                                                    "contradicted", "claim_check")}}

    def training_check(self) -> dict:
        """The training check of bf16, fp16 and compile on the baseline: ``trainopt verify --set`` of each,
        on the small search's output (its spec and best.yaml), recording the training verdict and losses."""
        out: dict = {"small_search": (self.work / "small-search" / "best.yaml").exists()}
        if not out["small_search"]:
            return {"error": "the small search left no best.yaml to verify against"}
        for change in ("amp=bf16", "amp=fp16", "compile=default"):
            proc = self.run([sys.executable, "-m", "trainopt", "verify", str(self.work / "small-search"), "--set", change,
                             "--json", "--out", str(self.work / f"verify-{change.replace('=', '-')}")], 420)
            try:
                doc = json.loads(proc.stdout)
            except json.JSONDecodeError:
                out[change] = {"rc": proc.returncode, "error": proc.stderr[-1500:]}
                continue
            check = doc.get("training_check") or {}
            last = (check.get("rounds") or [{}])[-1]
            out[change] = {"rc": proc.returncode, "verdict": check.get("verdict"), "reason": check.get("reason"),
                           "tails": {k: last.get(k) for k in ("reference_tail", "twin_tail", "candidate_tail", "tolerance")},
                           "scaler_skipped": (last.get("recommended") or {}).get("scaler_skipped"),
                           "speedup": (doc.get("speed") or {}).get("speedup"), "speed_holds": doc.get("speed_holds")}
        return out

    def search(self, spec: Path, name: str, timeout: float) -> dict:
        out = self.work / name
        try:
            proc = self.run([sys.executable, "-m", "trainopt", "search", str(spec), "--out", str(out), "--quiet"], timeout)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            # The search checkpoints results.json after every knob: keep what it decided.
            rc, err = "timeout", (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        (self.work / f"{name}.stderr.txt").write_text(err)
        path = out / "results.json"
        if not path.exists():
            return {"error": f"rc {rc}: {err[-1500:]}"}
        doc = json.loads(path.read_text())
        doc["rc"] = rc
        return doc

    @staticmethod
    def _decisions(doc: dict) -> list:
        return [{"knob": d["knob"], "to": d.get("to"), "verdict": d["verdict"], "speedup": d.get("speedup"),
                 "ci": d.get("ci"), "n_pairs": d.get("n_pairs")} for d in doc.get("decisions", [])]

    def finish(self) -> None:
        self.save()
        lines = ["| check | wall s | result |", "|---|---|---|"]
        for name, r in self.summary["steps"].items():
            short = json.dumps({k: v for k, v in r.items() if k != "wall_s"}, default=str)
            lines.append(f"| {name} | {r.get('wall_s', '')} | {short[:600]} |")
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")
        with tarfile.open(self.out / "work.tar.gz", "w:gz") as tar:
            for path in self.work.rglob("*"):
                if path.is_file() and path.suffix in (".json", ".yaml", ".log", ".txt", ".csv") and path.stat().st_size < 2**20:
                    tar.add(path, arcname=str(path.relative_to(self.work)))
        shutil.rmtree(self.work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a tiny model (to check this script on a CPU)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no step after this many seconds")
    ap.add_argument("--only", nargs="*", help="run only these steps")
    args = ap.parse_args()
    checks = Checks(Path(args.out), args.device, args.quick, args.budget_s)
    steps = [("env", checks.env_info), ("sync_timing", checks.sync_timing), ("fidelity", checks.fidelity), ("amp", checks.amp),
             ("breakdown", checks.breakdown), ("oom_measure", checks.oom), ("small_search", checks.small_search), ("training_check", checks.training_check),
             ("oom_search", checks.oom_search)]
    t0 = time.monotonic()
    for name, fn in steps:
        if not args.only or name in args.only:
            checks.step(name, fn)
    checks.summary["total_s"] = round(time.monotonic() - t0, 1)
    checks.finish()
    print(f"total {checks.summary['total_s']} s; summary in {args.out}/summary.md", flush=True)


if __name__ == "__main__":
    main()
