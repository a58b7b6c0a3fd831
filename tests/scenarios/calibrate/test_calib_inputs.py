"""Reading Kineto traces and nccl-tests logs: real inputs, and every bad input as a one-line error."""

import gzip
import json
from pathlib import Path

import pytest

from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.kinds import kernel_name_kind, op_kind
from scenarios.calibrate.kineto import read_kineto
from scenarios.calibrate.nccl_log import read_nccl_log

DATA = Path(__file__).resolve().parents[2] / "data"
RESNET = DATA / "kineto_resnet50_v100_2steps.json.gz"


def test_resnet_trace_steady_step():
    tr = read_kineto(RESNET)
    assert tr.gpu_name == "Tesla V100-SXM2-32GB"
    assert set(tr.steps) == {"ProfilerStep#104", "ProfilerStep#105"}
    # HTA's trace: ProfilerStep CPU spans of 95.55 and 95.70 ms; the GPU steps are as long
    assert all(0.094 < t < 0.097 for t in tr.steps.values())
    assert tr.busy_s < tr.step_time_s
    convs = [o for o in tr.ops if o.op == "aten::cudnn_convolution"]
    bwd = [o for o in tr.ops if o.op == "aten::convolution_backward"]
    assert len(convs) == 53 and {o.phase for o in convs} == {"fwd"}  # ResNet-50: 49 + 4 downsample
    assert len(bwd) == 53 and {o.phase for o in bwd} == {"bwd"}
    assert {o.phase for o in tr.ops if o.op.startswith("aten::_foreach")} == {"opt"}


@pytest.mark.parametrize(("name", "kind"), [
    ("volta_sgemm_64x64_nt", "gemm"), ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(Params)", "gemm"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(args)", "norm"),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor>", "optimizer"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
])
def test_kernel_name_kinds(name, kind):
    assert kernel_name_kind(name) == kind


def test_op_kind_takes_the_launching_op():
    # cuDNN's helper kernels count with their convolution
    assert op_kind("aten::cudnn_convolution", "fwd", "cask_cudnn_infer::computeOffsetsKernel") == "gemm"
    assert op_kind("aten::cudnn_batch_norm", "fwd", "x") == "norm"
    assert op_kind("aten::add_", "opt", "x") == "optimizer"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(("content", "message"), [
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "du', "truncated JSON"),
    ('{"schemaVersion": 1}', "no traceEvents list"),
    ('not json at all', "not valid JSON"),
    ('{"schema": "1.0.3-chakra.0.0.4", "nodes": []}', "Chakra execution trace"),
])
def test_bad_traces_are_one_line_errors(tmp_path, content, message):
    with pytest.raises(CalibrationInputError, match=message) as exc:
        read_kineto(_write(tmp_path / "t.json", content))
    assert "\n" not in str(exc.value)


def test_cpu_only_trace():
    with pytest.raises(CalibrationInputError, match="CPU-only trace"):
        read_kineto(DATA / "kineto_cpu_only.json.gz")


def test_corrupt_gzip(tmp_path):
    raw = gzip.compress(json.dumps({"traceEvents": []}).encode())
    p = tmp_path / "t.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CalibrationInputError, match="truncated or corrupt gzip"):
        read_kineto(p)


def test_nccl_log_of_the_a100_table():
    log = read_nccl_log(DATA / "nccl_tests_a100_8gpu.log")
    assert (log.collective, log.ranks, log.nodes, log.gpus_per_thread) == ("all_reduce", 8, 1, 8)
    assert len(log.rows) == 20
    assert log.rows[-1].busbw_Bps == pytest.approx(234.89e9)
    assert log.rows[0].time_s == pytest.approx(43.83e-6)


def test_nccl_log_debug_lines(tmp_path):
    text = ("# nccl-tests version 2.18.3 nccl-headers=22903 nccl-library=22903\n"
            "# Collective test starting: all_gather_perf\n# nThread 1 nGpus 1 minBytes 8 maxBytes 8\n"
            "#  Rank  0 Group  0 Pid 1 on nodeA device  0 [0x1] NVIDIA H100 80GB HBM3\n"
            "#  Rank  1 Group  0 Pid 2 on nodeB device  0 [0x1] NVIDIA H100 80GB HBM3\n"
            "nodeA:1:1 [0] NCCL INFO 24 coll channels, 0 collnet channels\n"
            "nodeA:1:1 [0] NCCL INFO 1048576 Bytes -> Algo 1 proto 2 time 30.1\n"
            "1048576  131072  float  none  -1  30.00  34.95  17.48  0  29.0  36.16  18.08  0\n")
    log = read_nccl_log(_write(tmp_path / "x.log", text))
    assert log.nccl_version == "2.29.3" and log.nodes == 2 and log.ranks == 2 and log.channels == 24
    assert log.choices == {1048576: ("ring", "simple")}
    assert log.collective == "all_gather" and log.gpu_name == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(("text", "message"), [
    ("# Collective test starting: all_reduce_perf\n"
     "1048576  262144  float  sum  -1  101.9  10.29  18.00  3  101.9  10.29  18.00  0\n",
     "3 wrong results"),
    ("# nThread 1 nGpus 8\n", "no nccl-tests result rows"),
    ("1048576  262144  float  sum  -1  101.9  10.29  18.00  0  101.9  10.29  18.00  0\n",
     "cannot tell the collective"),
])
def test_bad_nccl_logs(tmp_path, text, message):
    with pytest.raises(CalibrationInputError, match=message):
        read_nccl_log(_write(tmp_path / "run.log", text))


@pytest.mark.parametrize(("argv", "message"), [
    ([], "give --kineto"),
    (["--kineto", str(RESNET)], "need --scenario"),
    (["--nccl-log", "x.log"], "needs --system"),
    (["--measured", "iteration=3", "--scenario", "s"], "expected iteration_time_s=SECONDS"),
    (["--measured", "iteration_time_s=-1", "--scenario", "s"], "must be > 0"),
    (["--kineto", str(RESNET), "--scenario", "s", "--output", "{missing}/dir/p.toml"], "does not exist"),
])
def test_calibrate_command_line_errors(capsys, tmp_path, argv, message):
    from scenarios.cli import main

    argv = [a.replace("{missing}", str(tmp_path / "missing")) for a in argv]  # a folder that does not exist
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
