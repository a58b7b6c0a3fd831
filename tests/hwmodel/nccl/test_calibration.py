"""NCCL's fitted constants come from calibration.toml's [nccl] table (hwmodel.nccl.calibration)."""

import pytest

from hwmodel.nccl import calibration as C
from hwmodel.nccl import engine as E
from hwmodel.nccl import tuner as T


def test_fitted_constants_are_read_from_the_calibration_file():
    # The figures the fits were made with (see the comments in calibration.toml), bit for bit.
    assert C.host_launch_per_gpu_s() == E.HOST_LAUNCH_PER_GPU_S == 41.3e-6 / 8
    assert C.host_per_channel_per_gpu_s() == E.HOST_PER_CHANNEL_PER_GPU_S == 2.5e-6 / 8
    assert E.NVLINK_EFFICIENCY_FIT == {"ampere": 234.9e9 / 300e9}
    assert T.IB_APP_EFFICIENCY == T.NET_APP_EFFICIENCY == C.ib_app_efficiency() == 0.94
    # 8x A100 -g 8 host floor at 24 channels (the 1 MiB row's regime): 41.3 + 2.5 * 24 = 101.3 us.
    host_floor_s = 8 * (E.HOST_LAUNCH_PER_GPU_S + 24 * E.HOST_PER_CHANNEL_PER_GPU_S)
    assert host_floor_s == pytest.approx(101.3e-6, rel=1e-12)


def test_missing_key_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(C, "nccl_calibration", lambda: {})
    with pytest.raises(ValueError, match=r"calibration \[nccl\]: missing key 'ib_app_efficiency'"):
        C.ib_app_efficiency()
