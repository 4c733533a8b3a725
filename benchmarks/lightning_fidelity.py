"""Does trainopt measure a LightningModule and a Hugging Face model as their own loops train them?

1. **Lightning**: ``examples/your_code_lightning.py``'s module (``training_step`` with
   ``self.log``, a dict return, AdamW and a per-step scheduler from ``configure_optimizers``,
   its own ``train_dataloader``). trainopt's timed loop (``Trainer`` + ``measure_throughput``,
   the code a trial runs) against Lightning's own ``Trainer.fit`` over the same module and
   settings (batch size, loader workers, one thread; no logger, no checkpointing, no progress
   bar, no model summary), timed by a callback from the end of the warm-up batches to the
   end of the last batch.
2. **Hugging Face**: ``examples/your_code_hf.py``'s tiny BERT on a ``datasets.Dataset`` with
   ``DataCollatorWithPadding`` (``loss: model``) against a plain loop of
   ``model(**batch).loss``, ``backward()``, ``step()``, ``zero_grad()`` over a DataLoader
   with the same collate function and batch size.

Both sides run in this process, alternating round by round (the order flips each round),
each round on fresh modules built from the same seed. A round's ratio is trainopt's
samples/s over the other loop's; the median ratio and its spread (min, max, IQR) are printed.

Usage:
    python benchmarks/lightning_fidelity.py [--rounds 6] [--seconds 2] [--batch-size 16] [--threads 1] [--dim 256]
                                            [--only lightning|hf] [--barebones]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from trainopt.knobs.catalog import default_settings  # noqa: E402
from trainopt.trial.measure import Trainer, measure_throughput  # noqa: E402
from trainopt.trial.workloads import build_workload  # noqa: E402

LIT_ARGS = {"dim": 256, "size": 4096, "max_len": 64, "warmup_steps": 50}
HF_MODEL = {"hidden": 64, "layers": 2, "heads": 2}
HF_DATA = {"size": 2048, "max_words": 48}


def trainopt_rate(spec: dict, batch_size: int, seconds: float) -> float:
    """samples/s of trainopt's timed loop: warm-up, then four windows of ``seconds / 4``."""
    settings = default_settings()
    settings.update(batch_size=batch_size, threads=torch.get_num_threads())
    trainer = Trainer(build_workload(spec, ROOT), settings, torch.device("cpu"))
    m = measure_throughput(trainer, warmup_steps=5, warmup_seconds=0.5, window_seconds=seconds / 4, windows=4)
    return m.samples_per_s


def lightning_rate(batch_size: int, seconds: float, warmup: int = 5, barebones: bool = False) -> float:
    """samples/s of Lightning's ``Trainer.fit`` over the example module, after ``warmup`` batches."""
    import lightning.pytorch as pl
    import your_code_lightning as code

    class Timed(pl.Callback):
        def __init__(self):
            self.marks: list[float] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.marks.append(time.perf_counter())

    class Module(code.LitClassifier):
        def train_dataloader(self):
            data = code.Tokens(self.hparams.size, self.hparams.vocab_size, self.hparams.max_len)
            return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True, collate_fn=code.pad,
                                               drop_last=True)

    # As many steps as trainopt's side runs in about the same time: a first fit sizes it.
    torch.manual_seed(0)
    steps = max(warmup + 10, int(seconds * 1.25 * _probe_steps_per_s(Module, pl, Timed)))
    torch.manual_seed(0)
    timer = Timed()
    # barebones: Lightning's own least-overhead mode (no logging, no metric collection).
    extra = {"barebones": True} if barebones else {"logger": False, "enable_checkpointing": False,
                                                    "enable_progress_bar": False, "enable_model_summary": False}
    fit = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[timer], **extra)
    fit.fit(Module(**LIT_ARGS))
    marks = timer.marks[warmup - 1:]
    return (len(marks) - 1) * batch_size / (marks[-1] - marks[0])


_STEPS_PER_S: dict[str, float] = {}


def _probe_steps_per_s(module_cls, pl, timed_cls) -> float:
    if "lit" not in _STEPS_PER_S:
        timer = timed_cls()
        fit = pl.Trainer(max_steps=30, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, callbacks=[timer])
        fit.fit(module_cls(**LIT_ARGS))
        _STEPS_PER_S["lit"] = (len(timer.marks) - 10) / (timer.marks[-1] - timer.marks[9])
    return _STEPS_PER_S["lit"]


def plain_hf_rate(batch_size: int, seconds: float, warmup: int = 5) -> float:
    """samples/s of a plain loop of ``model(**batch).loss`` over the example's data and collate function."""
    import your_code_hf as code

    torch.manual_seed(0)
    data = code.reviews(**HF_DATA)
    torch.manual_seed(0)
    model = code.tiny_bert(**HF_MODEL)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.001)
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True, collate_fn=code.collate,
                                         drop_last=True, generator=torch.Generator().manual_seed(0))
    steps = 0
    start = None
    while True:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            if steps == warmup:
                start = time.perf_counter()
            elif start is not None and time.perf_counter() - start >= seconds:
                return (steps - warmup) * batch_size / (time.perf_counter() - start)


def _spread(ratios: list[float]) -> str:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return (f"median {statistics.median(ratios):.3f}, IQR [{q[0]:.3f}, {q[2]:.3f}], "
            f"min {min(ratios):.3f}, max {max(ratios):.3f} ({len(ratios)} rounds)")


def compare(name: str, ours, theirs, rounds: int) -> None:
    ratios, a_rates, b_rates = [], [], []
    for r in range(rounds):
        first, second = (ours, theirs) if r % 2 == 0 else (theirs, ours)
        x, y = first(), second()
        a, b = (x, y) if r % 2 == 0 else (y, x)
        a_rates.append(a)
        b_rates.append(b)
        ratios.append(a / b)
        print(f"  {name} round {r + 1}: trainopt {a:,.0f} samples/s, own loop {b:,.0f} samples/s, ratio {a / b:.3f}",
              flush=True)
    print(f"{name}: trainopt {statistics.median(a_rates):,.0f} vs own loop {statistics.median(b_rates):,.0f} samples/s "
          f"(medians); ratio {_spread(ratios)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per side per round")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=["lightning", "hf"], default=None)
    parser.add_argument("--barebones", action="store_true", help="Lightning's side with Trainer(barebones=True)")
    parser.add_argument("--dim", type=int, default=LIT_ARGS["dim"], help="the Lightning module's width")
    args = parser.parse_args()
    LIT_ARGS["dim"] = args.dim
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch size {args.batch_size}, Lightning dim {args.dim}, "
          f"{args.seconds:g} s per side per round", flush=True)
    lit_spec = {"model": {"name": "your_code_lightning:classifier", "args": LIT_ARGS}, "seed": 0}
    hf_spec = {
        "model": {"name": "your_code_hf:tiny_bert", "args": HF_MODEL},
        "data": {"name": "your_code_hf:reviews", "args": HF_DATA, "collate": "your_code_hf:collate"},
        "loss": "model",
        "optimizer": {"name": "adamw", "args": {"lr": 0.001}},
        "seed": 0,
    }
    if args.only in (None, "lightning"):
        compare("lightning", lambda: trainopt_rate(lit_spec, args.batch_size, args.seconds),
                lambda: lightning_rate(args.batch_size, args.seconds, barebones=args.barebones), args.rounds)
    if args.only in (None, "hf"):
        compare("hf", lambda: trainopt_rate(hf_spec, args.batch_size, args.seconds),
                lambda: plain_hf_rate(args.batch_size, args.seconds), args.rounds)


if __name__ == "__main__":
    main()
