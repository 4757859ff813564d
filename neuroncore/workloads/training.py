"""Training workloads: a model, its parallel layout and batch sizes, timed as a whole training step.

    from neuroncore.workloads.training import TRAIN_WORKLOADS
    w = TRAIN_WORKLOADS["llama-train"]
    model, plan = w.configure("llama2-7b", nodes=16, tp=8, dp=64, zero1=True, seq=4096,
                              micro_batch=1, global_batch=1024)
    step = time_training_step(model, plan)             # neuroncore.parallel.training

Each workload has presets of published model dimensions (Hugging Face configs; GPT-3 6.7B from the
GPT-3 paper's table 2.1) and the options every trainer exposes: ``tp``, ``pp``, ``dp`` (0: the rest
of the cores), ``zero1``, ``seq``, ``micro_batch``, ``global_batch``, ``nodes``, ``instance``,
``precision``, ``activation_checkpointing`` and ``sequence_parallel`` (on by default for Llama: the
NxD pre-training scripts pass ``--sequence_parallel_enabled``). Without a preset a workload is a
small model of the same family (what tests and quick runs use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neuroncore.hardware import INSTANCE_TYPES
from neuroncore.parallel.training import ParallelPlan, PlanError
from neuroncore.workloads.train_graphs import Transformer

LLAMA_TRAIN = {
    "llama2-7b": Transformer("llama2-7b", 32, 4096, 32, 32, 11008, 32000, fused_qkv=True),
    "llama2-13b": Transformer("llama2-13b", 40, 5120, 40, 40, 13824, 32000, fused_qkv=True),
    "llama2-70b": Transformer("llama2-70b", 80, 8192, 64, 8, 28672, 32000, fused_qkv=True),
    "llama3.1-8b": Transformer("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, fused_qkv=True),
    "llama3.1-70b": Transformer("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, fused_qkv=True),
}  # fused_qkv: NxD Training's Llama configs set fuse_qkv (one qkv_proj, as gate_up_proj)


def _encoder(name: str, layers: int, hidden: int, heads: int, intermediate: int, vocab: int, *,
             tied_head: bool = False, classes: int = 0) -> Transformer:
    """BERT / ViT layers: post-LN LayerNorm, GELU MLP, biases, bidirectional, no rotary."""
    return Transformer(name, layers, hidden, heads, heads, intermediate, vocab, norm="layer", mlp="gelu",
                       bias=True, causal=False, rope=False, tied_head=tied_head, classes=classes)


BERT_TRAIN = {"bert-large": _encoder("bert-large", 24, 1024, 16, 4096, 30522, tied_head=True)}
GPT_TRAIN = {"gpt3-6.7b": Transformer("gpt3-6.7b", 32, 4096, 32, 32, 16384, 50257, norm="layer",
                                      mlp="gelu", bias=True, rope=False, fused_qkv=True)}
# (Megatron's ParallelAttention: one query_key_value ColumnParallelLinear of 3 x hidden)
# ViT's "vocabulary" is the patch vector (3 x 16 x 16 = 768 values) its embedding projects
VIT_TRAIN = {"vit-base": _encoder("vit-base", 12, 768, 12, 3072, 768, classes=1000)}

SMALL = {
    "llama-train": Transformer("llama-small", 2, 256, 4, 2, 688, 1024, fused_qkv=True),
    "bert-pretrain": _encoder("bert-small", 2, 256, 4, 1024, 1024, tied_head=True),
    "gpt-train": Transformer("gpt-small", 2, 256, 4, 4, 1024, 1024, norm="layer", mlp="gelu",
                             bias=True, rope=False, fused_qkv=True),
    "vit-finetune": _encoder("vit-small", 2, 256, 4, 1024, 768, classes=10),
}

PLAN_DEFAULTS: dict[str, Any] = dict(tp=1, pp=1, dp=0, zero1=False, seq=128, micro_batch=1,
                                     global_batch=0, nodes=1, instance="trn1.32xlarge",
                                     precision="bf16-autocast", activation_checkpointing=False,
                                     sequence_parallel=False)


@dataclass(frozen=True)
class TrainWorkload:
    """A model family, its presets and the default layout of its published runs."""

    name: str
    description: str
    models: dict[str, Transformer]
    small: Transformer
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def presets(self) -> dict[str, Transformer]:
        return self.models

    def options(self, **overrides: Any) -> dict[str, Any]:
        opts = dict(PLAN_DEFAULTS, **self.defaults)
        unknown = [k for k in overrides if k not in opts]
        if unknown:
            raise PlanError(f"workload {self.name} has no option {', '.join(unknown)}; "
                            f"options: {', '.join(sorted(opts))}")
        for key, value in overrides.items():
            if value is None:
                continue
            wrong_flag = isinstance(value, bool) != isinstance(opts[key], bool)
            if not isinstance(value, type(opts[key])) or wrong_flag:
                raise PlanError(f"workload {self.name} option {key} expects "
                                f"{type(opts[key]).__name__}, got {value!r}")
            opts[key] = value
        return opts

    def configure(self, preset: str | None = None, **overrides: Any) -> tuple[Transformer, ParallelPlan]:
        """The model and its plan; ``dp=0`` takes every remaining core, ``global_batch=0`` one
        micro-batch per DP rank."""
        if preset is not None and preset not in self.models:
            raise PlanError(f"workload {self.name} has no preset {preset!r}; presets: "
                            f"{', '.join(sorted(self.models))}")
        model = self.models[preset] if preset else self.small
        opts = self.options(**overrides)
        if opts["instance"] not in INSTANCE_TYPES:
            raise PlanError(f"unknown instance {opts['instance']!r}")
        spec = INSTANCE_TYPES[opts["instance"]]
        cores = spec.cores // spec.default_lnc * opts["nodes"]
        if opts["dp"] == 0:
            opts["dp"] = max(1, cores // (opts["tp"] * opts["pp"]))
        if opts["global_batch"] == 0:
            opts["global_batch"] = opts["dp"] * opts["micro_batch"]
        return model, ParallelPlan(**opts)


TRAIN_WORKLOADS: dict[str, TrainWorkload] = {
    w.name: w for w in [
        TrainWorkload("llama-train", "Llama pre-training step (NxD layout: TP, PP, DP, ZeRO-1)",
                      LLAMA_TRAIN, SMALL["llama-train"], dict(seq=4096, sequence_parallel=True)),
        TrainWorkload("bert-pretrain", "BERT pre-training step, phase 1 (seq 128), data parallel",
                      BERT_TRAIN, SMALL["bert-pretrain"], dict(micro_batch=16, precision="bf16-sr")),
        TrainWorkload("gpt-train", "GPT-3 pre-training step (NeMo-Megatron layout)", GPT_TRAIN,
                      SMALL["gpt-train"], dict(seq=2048)),
        TrainWorkload("vit-finetune", "ViT image-classification fine-tuning step (224x224: 197 tokens)",
                      VIT_TRAIN, SMALL["vit-finetune"], dict(seq=197, micro_batch=64,
                                                            precision="bf16-sr")),
    ]
}


def get_train(name: str) -> TrainWorkload:
    if name not in TRAIN_WORKLOADS:
        raise PlanError(f"unknown training workload {name!r}; known: {', '.join(sorted(TRAIN_WORKLOADS))}")
    return TRAIN_WORKLOADS[name]


__all__ = ["BERT_TRAIN", "GPT_TRAIN", "LLAMA_TRAIN", "PLAN_DEFAULTS", "TRAIN_WORKLOADS", "VIT_TRAIN",
           "TrainWorkload", "get_train"]
