"""The dtype table: element sizes, training dtypes, and the tables derived from them."""

from __future__ import annotations

import pytest

from hwmodel.dtypes import ELEMENT_BYTES, MATH_DTYPES, TRAINING_DTYPES, training_dtype
from hwmodel.specs import get_gpu


def test_element_bytes_are_the_storage_formats() -> None:
    # IEEE 754 binary64/32/16, bfloat16, OCP FP8 (E4M3 and E5M2); tf32 is stored as fp32
    assert dict(ELEMENT_BYTES) == {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
    assert MATH_DTYPES["fp8"].torch_names == ("float8_e4m3fn", "float8_e5m2")


def test_training_dtypes() -> None:
    assert tuple(TRAINING_DTYPES) == ("bf16", "fp16", "fp32", "fp8")
    fp8, fp32 = training_dtype("fp8"), training_dtype("fp32")
    assert (fp8.traced_as, fp8.torch_name, fp8.element_bytes, fp8.mfu_peak_key) == ("bf16", "bfloat16", 2, "bf16")
    assert fp8.needs_fp8_tensor_cores and not any(d.needs_fp8_tensor_cores for d in TRAINING_DTYPES.values()
                                                  if d.name != "fp8")
    assert (fp32.mfu_peak_key, fp32.report_peak_key) == ("tf32", "fp32")
    # Megatron-LM: bf16 gradients reduced in fp32, fp16 in fp16
    assert {n: d.grad_reduce_bytes for n, d in TRAINING_DTYPES.items()} == {"bf16": 4, "fp16": 2, "fp32": 4,
                                                                            "fp8": 4}


def test_peak_keys_exist_on_an_fp8_gpu() -> None:
    h100 = get_gpu("h100-sxm")
    for d in TRAINING_DTYPES.values():
        assert h100.peak_flops(d.mfu_peak_key) > 0 and h100.peak_flops(d.report_peak_key) > 0


def test_unknown_training_dtype_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"^\[training\] dtype: unknown 'int8'; allowed: bf16, fp16, fp32, fp8$"):
        training_dtype("int8", "[training] dtype")
    with pytest.raises(ValueError, match=r"^dtype: unknown \['bf16'\]; allowed"):
        training_dtype(["bf16"])
