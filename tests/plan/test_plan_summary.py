"""Summary rows for the preview table."""

from __future__ import annotations

from plan_factories import config, entry, gpu, inventory

from nvdp.plan import plan
from nvdp.plan.summary import plan_summary_rows, render_table

H100 = "NVIDIA H100 80GB HBM3"


def test_rows_collapse_gpu_index_runs_per_model() -> None:
    inv = inventory(gpu(0), gpu(1), gpu(2, "Tesla V100", (7, 0)), gpu(4), gpu(5))
    rows = plan_summary_rows(plan(config(time_slicing=(entry(replicas=3),)), inv), inv)
    assert rows == [
        {
            "resource": "nvidia.com/gpu",
            "count": 15,
            "devices": 5,
            "gpus": "0-1 Tesla T4, 2 Tesla V100, 4-5 Tesla T4",
            "sharing": "time-slicing x3",
        }
    ]


def test_rows_without_inventory_list_indices_only() -> None:
    inv = inventory(gpu(0, H100, (9, 0), ("1g.10gb", "1g.10gb")), gpu(2, H100, (9, 0), ("1g.10gb",)))
    rows = plan_summary_rows(plan(config("single", mps=()), inv))
    assert rows == [
        {"resource": "nvidia.com/gpu", "count": 3, "devices": 3, "gpus": "0, 2", "sharing": "none"}
    ]


def test_render_table_pads_columns() -> None:
    rows = plan_summary_rows(plan(config(mps=(entry(replicas=2),)), inventory(gpu(0))))
    assert render_table(rows) == [
        "RESOURCE        COUNT  DEVICES  GPUS  SHARING",
        "nvidia.com/gpu  2      1        0     mps x2",
    ]
