"""A user's own nn.Module: FLOPs, saved activations and memory against closed forms, block discovery,
data-parallel programs, and the one-line errors of what a plain module cannot do."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl.engine import NcclEngine
from hwmodel.nccl.tuner import PROTOCOL_EFFICIENCY
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system
from scenarios.runner import memory_for, prepare, run_scenario
from scenarios.scenario import parse_scenario
from scenarios.user_code import FactoryError, load_factory
from workload.custom import CustomModel, find_blocks, sum_loss
from workload.parallel.builder import build_programs
from workload.parallel.config import ParallelConfig
from workload.trace import trace_model

MODELS = Path(__file__).parent / "custom_models.py"
EXAMPLE = Path(__file__).parents[2] / "examples" / "vit.py"
spec = importlib.util.spec_from_file_location("custom_models", MODELS)
cm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cm)


def scenario(fn: str, model: dict | None = None, parallel: dict | None = None, training: dict | None = None,
             simulation: dict | None = None, nodes: int = 1):
    return parse_scenario({"system": {"name": "dgx-a100", "nodes": nodes},
                           "model": {"factory": f"{MODELS}:{fn}", **(model or {})},
                           "parallel": parallel or {}, "training": training or {}, "simulation": simulation or {}})


def token_mlp(d: int, layers: int, vocab: int, classes: int, seq: int) -> dict:
    return {"factory_args": {"d": d, "layers": layers, "vocab": vocab, "classes": classes},
            "input_shape": [seq], "input_dtype": "int64"}


# -- tracing ----------------------------------------------------------------------------------------


def test_mlp_flops_are_6_x_linear_weights_x_tokens():
    """Every Linear's input needs a gradient (the embedding before them is trained): forward 2, backward 4
    FLOPs per weight and token; the embedding lookup and the added output.sum() count none."""
    d, L, V, C, B, T = 48, 3, 100, 20, 2, 24
    with torch.device("meta"):
        model = cm.TokenMLP(vocab=V, d=d, layers=L, classes=C)
    custom = CustomModel.from_factory(model, "custom_models:token_mlp", {"input_shape": [T], "input_dtype": "int64"})
    g = custom.graph(B, "bf16")
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert weights == L * 8 * d * d + d * C
    tokens = B * T
    assert g.total_flops("fwd") == 2 * weights * tokens
    assert g.total_flops("bwd") == 4 * weights * tokens
    assert g.total_flops("fwd") + g.total_flops("bwd") == 6 * weights * tokens
    assert custom.blocks == "blocks" and custom.repeated and g.num_blocks == L and g.info["layer_dedup"]
    assert custom.loss == "output.sum()"


def test_vit_example_flops_and_parameters():
    """examples/vit.py: ViT-B/16 has 86,567,656 parameters (1000 classes); FLOPs per image: patch conv
    2·P·3k²·d, per block 2·N·(4d² + 2dm) + 4·N²·d (QK^T and AV), head 2·d·C (class token); backward twice
    the forward except the patch conv, whose input (the images) needs no gradient."""
    spec = importlib.util.spec_from_file_location("vit_example", EXAMPLE)
    vit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vit)
    with torch.device("meta"):
        assert sum(p.numel() for p in vit.build().parameters()) == 86_567_656
        model = vit.build(image_size=32, patch_size=8, dim=64, depth=2, heads=4, mlp_dim=256, num_classes=10)
    custom = CustomModel.from_factory(model, "vit:build", {"input_shape": [3, 32, 32]})
    B, P, N, d, m, L, C, k = 2, 16, 17, 64, 256, 2, 10, 8
    g = custom.graph(B, "bf16")
    patch, blocks, head = 2 * P * 3 * k * k * d, L * (2 * N * (4 * d * d + 2 * d * m) + 4 * N * N * d), 2 * d * C
    assert g.total_flops("fwd") == B * (patch + blocks + head)
    assert g.total_flops("bwd") == B * (patch + 2 * (blocks + head))
    assert any(o.kind == "attention" for o in g.ops)  # SDPA traced as one flash-attention kernel


def test_saved_activations_closed_form():
    """bf16, tokens n = B·T: the embedding keeps its int64 ids (8n); each block its input, the GeLU input
    and the fc2 input (2n·(d + 4d + 4d) = 18nd); the head its input (2nd). Full recomputation keeps a
    block's input (2nd)."""
    d, L, B, T = 32, 3, 4, 16
    with torch.device("meta"):
        model = cm.TokenMLP(vocab=64, d=d, layers=L, classes=16)
    g = CustomModel.from_factory(model, "f", {"input_shape": [T], "input_dtype": "int64"}).graph(B, "bf16")
    n = B * T
    assert g.info["saved_bytes"] == {"pre": 8 * n, "post": 2 * n * d, "blocks": [18 * n * d] * L,
                                     "block_inputs": [2 * n * d] * L}
    # the same without layer dedup (every block traced)
    g2 = trace_model(model, (torch.zeros(B, T, dtype=torch.int64, device="meta"),), block_attr="blocks",
                     layer_dedup=False, loss_fn=sum_loss, saved_activations=True)
    assert not g2.info["layer_dedup"] and g2.info["saved_bytes"] == g.info["saved_bytes"]
    assert [(o.part, o.block) for o in g2.ops] == [(o.part, o.block) for o in g.ops]


@pytest.mark.parametrize("mha", [True, False], ids=["nn.MultiheadAttention", "sdpa"])
def test_saved_activations_of_attention_blocks_closed_form(mha):
    """bf16, n = B·T tokens, h heads. Each pre-LN block saves, as ``2n·d``-byte tensors: its input (LayerNorm
    1), the in-projection's input, the flash kernel's output, the out-projection's input, LayerNorm 2's
    input and fc1's input; q, k, v in one ``3·2n·d`` storage; GeLU's and fc2's inputs, ``2·4n·d`` each; in
    fp32 two LayerNorms' mean and rstd (``4·4n``) and the kernel's log-sum-exp (``4n·h``); its philox seed
    and offset (uint64, 16 + 8 bytes). ``nn.MultiheadAttention`` reads a (T, B, d) transpose into its
    in-projection (``matmul`` copies it to fold it) and a ``permute(2, 0, 1, 3).contiguous()`` copy of the
    kernel's output into its out-projection (``F.multi_head_attention_forward``): 17 tensors of ``2n·d``.
    With SDPA the in-projection reads LayerNorm 1's output and the out-projection a view of the kernel's
    output: one ``2n·d`` tensor fewer. Eight blocks: a storage freed inside a block must not hide a later
    one (storages are told apart by address), whatever the heap's state."""
    d, h, L, B, T, V = 32, 4, 8, 2, 16, 64
    with torch.device("meta"):
        model = cm.TokenGPT(vocab=V, d=d, heads=h, layers=L, mha=mha)
    g = CustomModel.from_factory(model, "f", {"input_shape": [T], "input_dtype": "int64"}).graph(B, "bf16")
    n = B * T
    copies = 17 if mha else 16
    block = copies * 2 * n * d + 4 * 4 * n + 4 * n * h + 16 + 8
    # the embedding keeps its int64 ids; the final LayerNorm its input, mean and rstd; the head its input
    assert g.info["saved_bytes"] == {"pre": 8 * n, "post": 2 * n * d + 2 * 4 * n + 2 * n * d,
                                     "blocks": [block] * L, "block_inputs": [2 * n * d] * L}


def test_blocks_found_by_structure():
    with torch.device("meta"):
        assert find_blocks(cm.TokenMLP()) == "blocks"
        assert find_blocks(cm.plain_mlp()) == ""  # no repeated blocks: the top-level children
        nested = nn.Sequential(nn.Linear(4, 8), nn.Sequential(*[nn.Linear(8, 8) for _ in range(3)]))
        assert find_blocks(nested) == "1"
        root = nn.Sequential(*[cm.MLPBlock(8) for _ in range(4)])
        assert find_blocks(root) == ""
    custom = CustomModel.from_factory(root, "f", {"input_shape": [5, 8]})
    assert custom.repeated
    g = custom.graph(2, "fp32")
    assert g.info["layer_dedup"] and g.num_blocks == 4
    assert {o.layer for o in g.block_ops(3, "fwd")} == {"3.fc1", "3.act", "3.fc2", "3"}


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(cm.MLPBlock(16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _Net(nn.Module):
    """Short module paths ("Net.fc" is shorter than the tracker's "Global") around a nested container."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.enc = _Encoder()
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(self.fc(x)))


def test_nested_container_is_deduplicated_exactly():
    with torch.device("meta"):
        model = _Net()
    custom = CustomModel.from_factory(model, "f", {"input_shape": [8]})
    assert custom.blocks == "enc.layers" and custom.repeated
    g = custom.graph(2, "fp32")
    assert g.info["layer_dedup"] and g.num_blocks == 3
    assert {o.layer for o in g.pre_ops("fwd")} == {"fc"} and {o.layer for o in g.post_ops("fwd")} == {"out", ""}
    assert {o.layer for o in g.block_ops(2, "fwd")} == {"enc.layers.2", "enc.layers.2.fc1", "enc.layers.2.act",
                                                        "enc.layers.2.fc2"}
    full = trace_model(model, (torch.empty(2, 8, device="meta"),), dtype=torch.float32, block_attr="enc.layers",
                       layer_dedup=False, loss_fn=sum_loss, saved_activations=True)
    assert [(o.name, o.layer, o.part, o.block, o.deps) for o in full.ops] == \
        [(o.name, o.layer, o.part, o.block, o.deps) for o in g.ops]
    assert full.info["saved_bytes"] == g.info["saved_bytes"]
    t = custom.trace(ParallelConfig(micro_batch_size=2).resolve(1), "fp32")
    assert (t.params_pre, t.params_block, t.params_post) == (8 * 16 + 16, 8 * 16 * 16, 16 * 4 + 4)


def test_top_level_children_are_the_blocks_of_a_plain_sequential():
    sc = scenario("plain_mlp", {"input_shape": [64]}, training={"micro_batch_size": 4})
    t = prepare(sc).model_cfg.trace(prepare(sc).config)
    assert t.graph.info["block_names"] == ["0", "1", "2", "3", "4"]
    assert t.params_per_block == (64 * 256 + 256, 0, 256 * 256 + 256, 0, 256 * 10 + 10)
    assert t.params_pre == t.params_post == 0
    assert [o.name for o in t.graph.block_ops(2, "bwd")] == ["aten.mm", "aten.mm", "aten.sum"]
    # the first Linear's input is data: its backward computes the weight gradient only
    assert [o.name for o in t.graph.block_ops(0, "bwd")] == ["aten.mm", "aten.sum"]


# -- memory -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy,shard", [({}, (1, 1, 1)), ({"zero_stage": 1}, (1, 1, 8)),
                                            ({"zero_stage": 2}, (1, 8, 8)), ({"zero_stage": 3}, (8, 8, 8)),
                                            ({"fsdp": True}, (8, 8, 8))])
def test_memory_by_zero_stage_is_the_closed_form(strategy, shard):
    """bf16 mixed precision on 8 GPUs: 2 bytes per parameter, 4 per fp32 gradient, 12 of optimizer
    states, divided by the data-parallel size as the ZeRO stage shards them; activations as traced."""
    d, L, V, C, B, T = 64, 3, 128, 32, 4, 16
    mem = memory_for(prepare(scenario("token_mlp", token_mlp(d, L, V, C, T), strategy, {"micro_batch_size": B})))
    P = V * d + L * 8 * d * d + d * C
    n = B * T
    assert (mem.parameters, mem.gradients, mem.optimizer_states) == (2 * P / shard[0], 4 * P / shard[1],
                                                                    12 * P / shard[2])
    assert mem.activations == 8 * n + L * 18 * n * d + 2 * n * d and mem.workspace == 0


def test_memory_with_full_recompute_and_pipeline():
    """Full recompute: blocks keep their inputs, one block's saved tensors are rematerialised. Pipeline
    (PP 2, 1F1B, 4 micro-batches): stage 0 holds 2 micro-batches of its 2 blocks and the embedding."""
    d, L, V, C, B, T = 64, 4, 128, 32, 4, 16
    n = B * T
    mem = memory_for(prepare(scenario("token_mlp", token_mlp(d, L, V, C, T), {"recompute_granularity": "full"},
                                      {"micro_batch_size": B})))
    assert mem.activations == 8 * n + L * 2 * n * d + 2 * n * d
    assert mem.workspace == 18 * n * d - 2 * n * d
    mem = memory_for(prepare(scenario("token_mlp", token_mlp(d, L, V, C, T), {"pipeline_model_parallel_size": 2},
                                      {"micro_batch_size": B, "global_batch_size": 4 * B * 4})))
    assert mem.stage == 0
    assert mem.activations == 2 * (8 * n + 2 * 18 * n * d)
    assert mem.params_per_gpu == V * d + 2 * 8 * d * d


def test_oom_verdict_for_a_large_custom_model():
    """Two MLP blocks of width 16384: 4.3 G parameters at 18 bytes each (77.6 GB) plus activations > 80 GB."""
    mem = memory_for(prepare(scenario("token_mlp", token_mlp(16384, 2, 1024, 16, 2048), {},
                                      {"micro_batch_size": 8})))
    gpu = build_system("dgx-a100", 1).gpu_spec
    assert not mem.fits(gpu) and mem.verdict(gpu).startswith("OOM: needs")


# -- data parallelism ------------------------------------------------------------------------------


def test_data_parallel_gradient_all_reduce():
    """DDP on 8 GPUs: the gradient buckets add up to every parameter in fp32 (4 bytes, Megatron's bf16
    rule); a ring all-reduce puts 2·(n-1)/n of them on each GPU's NVLink (the link counter also carries
    NCCL's NVLink efficiency); the iteration is longer than one GPU's compute alone."""
    d, L, V, C, B, T = 1024, 4, 1024, 1024, 4, 512
    sc = scenario("token_mlp", token_mlp(d, L, V, C, T), {"overlap_grad_reduce": True}, {"micro_batch_size": B},
                  {"nccl_algo": "ring", "nccl_proto": "simple"})
    rep = run_scenario(sc)
    P = V * d + L * 8 * d * d + d * C
    prog = rep.build.programs[0]
    ar = [t.op for t in prog.tasks if t.stream == "dp" and isinstance(t.op, Collective)]
    assert len(ar) > 1 and all(c.op == "all_reduce" and c.group == tuple(range(8)) for c in ar)
    assert sum(c.size_bytes for c in ar) == 4 * P
    n = 8
    link = {lk.name: lk for lk in rep.result.cluster.link_resources()}["n0.gpu0->n0.nvswitch"]
    eff = NcclEngine(Cluster(build_system("dgx-a100", 1))).nvlink_efficiency * PROTOCOL_EFFICIENCY["simple"]
    assert link.carried * eff == pytest.approx(2 * (n - 1) / n * 4 * P, rel=1e-9)
    # one GPU alone, same micro-batch: compute only
    cfg1 = ParallelConfig(micro_batch_size=B).resolve(1)
    trace1 = rep.prepared.model_cfg.trace(cfg1)
    topo = build_system("dgx-a100", 1)
    one = Runtime(Cluster(topo), build_programs(trace1, cfg1).programs, placement={0: topo.gpus()[0]}).run()
    assert rep.metrics["iteration_time_s"] > one.end_time_s > 0
    assert rep.metrics["model_flops_per_iteration"] == 8 * 6 * (L * 8 * d * d + d * C) * B * T


def test_fsdp_gathers_each_block_and_zero1_reduce_scatters():
    d, L, V, C, B, T = 256, 2, 256, 256, 2, 64
    rep = run_scenario(scenario("token_mlp", token_mlp(d, L, V, C, T), {"fsdp": True}, {"micro_batch_size": B}))
    tasks = rep.build.programs[0].tasks
    ag = [t.op for t in tasks if t.stream == "fsdp_ag" and isinstance(t.op, Collective)]
    rs = [t.op for t in tasks if t.stream == "fsdp_rs" and isinstance(t.op, Collective)]
    # (FSDP2's copy kernels on these streams: tests/workload/test_fsdp2.py)
    # nccl-tests' S for all-gather / reduce-scatter is the whole buffer: one unit's parameters -- each
    # block, and the root unit ("pre": the embedding before the blocks, V*d, and the classifier after
    # them, d*C), gathered once before the forward; the last block is not gathered again for its backward
    units = {f"L{i}": 8 * d * d for i in range(L)} | {"pre": V * d + d * C}
    assert sorted(c.name for c in ag) == sorted([f"fsdp_ag_fwd_{u}" for u in units]
                                                + [f"fsdp_ag_bwd_L{i}" for i in range(L - 1)])
    assert all(c.size_bytes == 2 * units[c.name.split("_")[-1]] for c in ag)  # bf16
    assert sorted(c.name for c in rs) == sorted(f"fsdp_rs_{u}" for u in units)
    assert all(c.size_bytes == 4 * units[c.name.split("_")[-1]] for c in rs)  # fp32 gradients
    rep = run_scenario(scenario("token_mlp", token_mlp(d, L, V, C, T), {"zero_stage": 1}, {"micro_batch_size": B}))
    dp = [t.op for t in rep.build.programs[0].tasks if t.stream == "dp"]
    P = V * d + L * 8 * d * d + d * C
    assert sum(c.size_bytes for c in dp if c.op == "reduce_scatter") == 4 * P
    assert sum(c.size_bytes for c in dp if c.op == "all_gather") == 2 * P


def test_full_recompute_reruns_each_block_forward():
    d, L, V, C, B, T = 128, 3, 128, 64, 2, 32
    base = run_scenario(scenario("token_mlp", token_mlp(d, L, V, C, T), {}, {"micro_batch_size": B}))
    rec = run_scenario(scenario("token_mlp", token_mlp(d, L, V, C, T), {"recompute_granularity": "full"},
                                {"micro_batch_size": B}))
    extra = 8 * 2 * L * 8 * d * d * B * T  # every block's forward again, on 8 GPUs
    assert rec.metrics["hardware_flops_per_iteration"] == base.metrics["hardware_flops_per_iteration"] + extra
    assert rec.metrics["model_flops_per_iteration"] == base.metrics["model_flops_per_iteration"]
    assert rec.metrics["iteration_time_s"] > base.metrics["iteration_time_s"]


def test_pipeline_splits_repeated_blocks():
    d, L, V, C, B, T = 128, 4, 128, 64, 2, 32
    rep = run_scenario(scenario("token_mlp", token_mlp(d, L, V, C, T), {"pipeline_model_parallel_size": 2},
                                {"micro_batch_size": B, "global_batch_size": 4 * B * 4}))
    assert rep.build.stage_layers == [2, 2]
    assert rep.build.info["activation_p2p_bytes"] == 2 * B * T * d  # one block input, bf16
    assert rep.metrics["breakdown"]["bubble_s"] > 0


# -- what a plain module cannot do ----------------------------------------------------------------


@pytest.mark.parametrize("parallel,field", [({"tensor_model_parallel_size": 2}, "tensor_model_parallel_size = 2"),
                                            ({"context_parallel_size": 2}, "context_parallel_size = 2"),
                                            ({"expert_model_parallel_size": 2}, "expert_model_parallel_size = 2"),
                                            ({"recompute_granularity": "selective"}, "recompute_granularity")])
def test_megatron_only_strategies_are_refused_by_name(parallel, field):
    with pytest.raises(ValueError) as exc:
        prepare(scenario("token_mlp", token_mlp(32, 2, 64, 16, 8), parallel))
    msg = str(exc.value)
    assert msg.startswith(f"[parallel] {field}") and "\n" not in msg and "TokenMLP" in msg


def test_pipeline_without_repeated_blocks_is_refused():
    with pytest.raises(ValueError, match=r"^\[parallel\] pipeline_model_parallel_size = 2 splits a model by its "
                                         r"repeated blocks; Sequential has no"):
        prepare(scenario("plain_mlp", {"input_shape": [64]}, {"pipeline_model_parallel_size": 2}))


def test_factory_inputs_and_errors():
    # (module, example_inputs): their leading dimension is the micro-batch
    rep = run_scenario(scenario("mlp_with_inputs", training={"micro_batch_size": 4}))
    assert rep.metrics["model_flops_per_iteration"] == 8 * 4 * (6 * (256 * 256 + 256 * 10) + 4 * 64 * 256)
    with pytest.raises(ValueError, match=r"micro_batch_size = 2, but factory .* returned example inputs of shape "
                                         r"\(4, 64\)"):
        memory_for(prepare(scenario("mlp_with_inputs", training={"micro_batch_size": 2})))
    with pytest.raises(ValueError, match=r"\[model\] input_shape is required"):
        memory_for(prepare(scenario("plain_mlp")))
    with pytest.raises(ValueError, match=r"\[model\] unknown key\(s\) num_layers .* allowed: factory, factory_args"):
        prepare(scenario("plain_mlp", {"input_shape": [64], "num_layers": 2}))
    with pytest.raises(ValueError, match=r"\[model\] blocks: Sequential has no submodule 'body'"):
        prepare(scenario("plain_mlp", {"input_shape": [64], "blocks": "body"}))
    with pytest.raises(ValueError, match=r"\[model\] input_dtype: unknown 'int8'; allowed: float, int64"):
        prepare(scenario("plain_mlp", {"input_shape": [64], "input_dtype": "int8"}))
    with pytest.raises(ValueError, match=r"returned a str; it must return a torch.nn.Module"):
        prepare(scenario("not_a_model"))
    with pytest.raises(ValueError, match=r"\[training\] seq_length applies to zoo transformers"):
        prepare(scenario("plain_mlp", {"input_shape": [64]}, training={"seq_length": 128}))


def test_forward_failing_on_meta_names_the_factory():
    with pytest.raises(ValueError) as exc:
        memory_for(prepare(scenario("data_dependent", {"input_shape": [8]})))
    msg = str(exc.value)
    assert msg.startswith(f"[model] factory '{MODELS}:data_dependent': DataDependent could not be traced on the "
                          f"meta device") and "\n" not in msg


def test_factory_returning_a_configuration_still_works():
    sc = parse_scenario({"system": {"name": "dgx-a100"},
                         "model": {"factory": "workload.zoo:get_model_config", "factory_args": {"name": "gpt-1.7b"},
                                   "num_layers": 4},
                         "parallel": {"tensor_model_parallel_size": 8}})
    cfg = prepare(sc).model_cfg
    assert (cfg.name, cfg.num_layers, cfg.hidden_size) == ("gpt-1.7b", 4, 2304)


def test_factory_from_a_file(tmp_path):
    """``"file.py:fn"`` relative to a folder; the file may define dataclasses under postponed annotations."""
    (tmp_path / "mine.py").write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n"
                                      "from torch import nn\n\n@dataclass\nclass Cfg:\n    d: int = 8\n\n"
                                      "def build():\n    return nn.Linear(Cfg().d, 4)\n")
    assert isinstance(load_factory("mine.py:build", tmp_path)(), nn.Linear)
    with pytest.raises(FactoryError, match=r"factory spec 'other.py:build': file not found"):
        load_factory("other.py:build", tmp_path)
    (tmp_path / "bad.py").write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(FactoryError, match=r"executing .*bad.py raised RuntimeError: no GPU here"):
        load_factory("bad.py:build", tmp_path)


class _TiedLM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def test_tied_output_layer_counts_once_and_is_gathered_for_post():
    """A user's module whose output layer reuses the embedding: the weight (V*d) is "pre", counted
    once; "post" (LayerNorm, 2d) names it as tied, so ZeRO-3/FSDP gathers V*d + 2d for "post"."""
    V, d, L = 64, 32, 2
    with torch.device("meta"):
        model = _TiedLM(V, d, L)
    custom = CustomModel.from_factory(model, "tied", {"input_shape": [8], "input_dtype": "int64"})
    t = custom.trace(ParallelConfig(micro_batch_size=1).resolve(1))
    assert (t.params_pre, t.params_post, t.params_post_tied) == (V * d, 2 * d, V * d)
