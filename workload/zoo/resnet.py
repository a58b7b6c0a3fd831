"""ResNet-50 (He et al. 2016, arXiv:1512.03385, Table 1), bottleneck v1.5 (stride on the 3x3 conv,
as torchvision). Written in plain torch: torchvision is not a dependency.

Shapes: B batch, image (B, 3, 224, 224) -> stem (B, 64, 56, 56) -> stages of width 256, 512, 1024,
2048 at 56, 28, 14, 7 px -> (B, 2048) -> (B, classes). About 4.1 GMAC per 224 px image forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workload.parallel.config import ParallelConfig
from workload.zoo.config import ResNetConfig
from workload.zoo.family import ModelFamily, saved_tensor_memory


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand (x4), each with BatchNorm; projection shortcut if needed."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))  # (B, w, H, W)
        y = F.relu(self.bn2(self.conv2(y)))  # (B, w, H/s, W/s)
        y = self.bn3(self.conv3(y))  # (B, 4w, H/s, W/s)
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """Image classifier; ``forward(images, targets)`` returns the mean cross-entropy loss."""

    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        self.config = cfg
        w = cfg.base_width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(w),
                                  nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        stages, in_ch = [], w
        for i, n in enumerate(cfg.blocks_per_stage):
            width = w * 2**i
            blocks = [Bottleneck(in_ch if j == 0 else width * 4, width, 2 if (j == 0 and i > 0) else 1)
                      for j in range(n)]
            stages.append(nn.Sequential(*blocks))
            in_ch = width * 4
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_ch, cfg.num_classes)

    def forward(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(images))  # (B, 2048, 7, 7)
        logits = self.fc(x.mean(dim=(2, 3)))  # (B, classes)
        return F.cross_entropy(logits.float(), targets)

    def example_inputs(self, micro_batch_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(images (B, 3, S, S) in the parameter dtype, targets (B,) int64)."""
        p = self.fc.weight
        s = self.config.image_size
        return (torch.empty(micro_batch_size, 3, s, s, device=p.device, dtype=p.dtype),
                torch.randint(0, self.config.num_classes, (micro_batch_size,), device=p.device))


_DP_ONLY = "trainsim runs ResNet data parallel only (its convolutions have no Megatron-style sharding here)"


class ResNetFamily(ModelFamily):
    """ResNet: data parallel only (ZeRO/FSDP too); FLOPs traced; memory from the saved tensors."""

    name = "resnet"
    config_type = ResNetConfig
    block_attr = "layers"  # ResNet has no such container: traced whole, without blocks (no pipeline stages)
    transformer = False

    def unsupported(self, cfg: ResNetConfig) -> dict[str, str]:
        return {"tp": _DP_ONLY, "sp": _DP_ONLY, "cp": _DP_ONLY, "pp": _DP_ONLY,
                "ep": "expert parallelism needs a mixture-of-experts model"}

    def build(self, cfg: ResNetConfig, *, tp=None, ep: int = 1) -> nn.Module:
        self.check_sizes(cfg, tp=tp.size if tp is not None else 1, ep=ep)
        return ResNet(cfg)

    def memory(self, cfg: ResNetConfig, parallel: ParallelConfig, dtype: str, *, compiled: bool = False):
        """Model states by ZeRO stage and the tensors autograd saves in the traced forward (images and
        integer targets from :meth:`ResNet.example_inputs`); ``compiled`` changes nothing here."""
        with torch.device("meta"):
            module = self.build(cfg)
        return saved_tensor_memory(module, cfg.name, parallel, dtype)


FAMILIES = (ResNetFamily(),)
CONFIGS = (ResNetConfig(name="resnet-50", published_params=0.0256, source="He et al. 2016 (arXiv:1512.03385)"),)
