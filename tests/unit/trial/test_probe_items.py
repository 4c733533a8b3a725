"""Batch-size probes made of the largest items of a bounded sample."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.knobs.catalog import default_settings
from trainopt.trial.probe_items import item_size, largest_items
from trainopt.trial.worker import execute

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


class Lengths:
    """Items of the given lengths: ``{"input_ids": tensor [n], "label": int}``."""

    def __init__(self, lengths):
        self.lengths = list(lengths)
        self.reads = 0

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        self.reads += 1
        return {"input_ids": torch.ones(self.lengths[i], dtype=torch.long), "label": 1}


@dataclass
class Pair:
    image: torch.Tensor
    boxes: list


def test_an_items_size_counts_every_element_it_holds():
    assert item_size({"input_ids": torch.ones(7), "mask": np.ones((2, 3)), "label": 1}) == 7 + 6 + 1
    assert item_size((torch.ones(3, 4), [1, 2, 3])) == 12 + 3
    assert item_size(Pair(torch.ones(2, 2), [torch.ones(5)])) == 9


def test_a_probe_batch_is_the_largest_items_of_a_set_small_enough_to_read_whole():
    lengths = [8] * 300
    lengths[123], lengths[7] = 5000, 900
    data = Lengths(lengths)
    probe, info = largest_items(data, batch_items=4)
    assert len(probe) == 4
    assert sorted(len(probe[i]["input_ids"]) for i in range(4)) == [8, 8, 900, 5000]
    assert info["sampled"] == 300 and info["largest"] == 5001 and info["median"] == 9 and info["in_batch"] == 9


def test_a_data_parallel_probe_gives_every_rank_a_whole_batch_of_the_largest_items():
    lengths = [8] * 300
    lengths[5], lengths[250] = 700, 600
    probe, _ = largest_items(Lengths(lengths), batch_items=2, copies=3)
    # Three ranks' sampler shards of this set hold two items each, all of them the two largest.
    assert len(probe) == 6
    shards = [list(torch.utils.data.DistributedSampler(probe, num_replicas=3, rank=r, shuffle=True, seed=1))
              for r in range(3)]
    for shard in shards:
        assert len(shard) == 2 and {len(probe[i]["input_ids"]) for i in shard} <= {700, 600}


def test_a_large_set_is_sampled_within_the_bound_spread_over_the_whole_set():
    lengths = list(range(1, 10_001))  # the longest items sit at the end
    data = Lengths(lengths)
    probe, info = largest_items(data, batch_items=2, limit=100)
    assert data.reads == 100 and info["sampled"] == 100 and info["dataset_len"] == 10_000
    # An even spread reaches the last hundred items; the first hundred alone would top out at 101.
    assert info["largest"] > 9_900
    assert len(probe) == 2


def test_a_slow_data_set_stops_sampling_at_the_time_bound():
    ticks = itertools.count()
    data = Lengths([4] * 1000)
    _, info = largest_items(data, batch_items=2, seconds=10, clock=lambda: float(next(ticks)))
    assert info["sampled"] == 11


def test_a_probe_trial_trains_on_the_longest_item_and_says_so(tmp_path):
    settings = default_settings()
    settings.update(batch_size=4, threads=1)
    spec = {
        "device": "cpu",
        "model": {"name": f"{EXAMPLES / 'your_code_lightning.py'}:classifier", "args": {"size": 64, "long_item": 3000}},
        "seed": 0,
        "measure": {},
    }
    request = TrialRequest(spec=spec, source_dir=str(tmp_path), settings=settings, mode="probe",
                           result_path=str(tmp_path / "r.json"))
    result = TrialResult.from_dict(execute(request).to_dict())
    assert result.status == "ok", result.error
    assert result.dataset_len == 64 and result.probe_items["sampled"] == 64
    assert result.probe_items["largest"] == 3001  # 3000 token ids and the label
