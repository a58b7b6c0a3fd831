"""Every dtype table of the workload and scenario layers derives from :mod:`hwmodel.dtypes`."""

from __future__ import annotations

from hwmodel.dtypes import ELEMENT_BYTES


def test_derived_tables_agree() -> None:
    import torch

    from hwmodel.costmodel import DTYPE_BYTES
    from scenarios.analysis import mfu_peak_dtype
    from scenarios.scenario import DTYPES
    from workload.custom import _TORCH_DTYPES
    from workload.parallel.builder import ELEM_BYTES, GRAD_REDUCE_BYTES
    from workload.parallel.rank_trace import TORCH_DTYPES
    from workload.parallel.rank_trace import TRAINING_DTYPES as RANK_DTYPES
    from workload.trace import dtype_name

    assert DTYPES == RANK_DTYPES == ("bf16", "fp16", "fp32", "fp8")
    assert TORCH_DTYPES == _TORCH_DTYPES == {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    assert ELEM_BYTES == dict(DTYPE_BYTES) == dict(ELEMENT_BYTES) and GRAD_REDUCE_BYTES["fp16"] == 2
    assert [mfu_peak_dtype(d) for d in ("bf16", "fp16", "fp32", "fp8", "tf32")] == ["bf16", "fp16", "tf32", "bf16",
                                                                                    "tf32"]
    assert [dtype_name(t) for t in (torch.float8_e5m2, torch.float64, torch.int64)] == ["fp8", "fp64", "int64"]
