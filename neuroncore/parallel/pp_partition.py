"""A model's exported loss graph cut into pipeline stages by its layer names, as NxD's pipeline
partitions a model (``NxDPPModel(..., pipeline_cuts=["model.layers.4", ...])``: the model traced
once, its graph split at named decoder layers, every tensor a later stage needs passed along).

    plan = partition(exported, layers=layer_path, edges=[0, 2, 4])   # 4 layers in 2 stages

Each node of the ``torch.export`` graph of the loss goes to one stage:

* a node inside layer ``i`` of the layer list (its ``nn_module_stack`` holds ``<layers>.<i>``) to the
  stage holding layer ``i``;
* any other node to the stage of the last layer node before it in graph order: what precedes the
  first layer (the token embedding, the causal mask, rotary cos/sin, position ids) to the first stage,
  what follows the last layer (the final norm, the LM head, the loss) to the last;
* never earlier than the stages of the values it reads; a ``getitem`` with the node it unpacks.

A value made on stage ``a`` and read on stage ``b > a`` is sent from ``a`` to ``a+1`` and passed on
by every stage in between (NxD's pass-through tensors), so stages only talk to their neighbours: the
hidden states, and also the attention mask and position embeddings a decoder's every layer reads.
Parameters, buffers and the step's own inputs are not sent: each stage holds the parameters and
buffers it reads (a weight two stages read, GPT-2's LM head tied to its token embedding, is held by
both, as Megatron's first and last stages both hold the word embeddings), and reads the step
inputs it needs from the host (every pipeline rank of NxD is handed the whole batch and uses what
it needs: the first stage the token ids, the last the labels).

A value needs its gradient sent back when it is floating point and depends on a parameter (the
hidden states yes; a mask or cos/sin computed from buffers and inputs no).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export.graph_signature import InputKind

from neuroncore.parallel.training import PlanError

LOSS_ROOT = "model"
"""The name :class:`neuroncore.training.torch_joint.LossModule` gives the user's model."""


@dataclass
class Stage:
    """One stage's part of the loss graph, as an FX graph to replay.

    Its placeholders are, in order: ``params`` (qualified names in the loss module), ``buffers``,
    then ``inputs`` (``("input", j)`` for the step's input ``j``, ``("recv", name)`` for a value the
    previous stage sends). Its output is the loss (last stage) or the tuple of ``sends``."""

    index: int
    module: torch.fx.GraphModule
    params: list[str] = field(default_factory=list)
    buffers: list[str] = field(default_factory=list)
    inputs: list[tuple[str, Any]] = field(default_factory=list)
    sends: list[str] = field(default_factory=list)  # names of the values sent to the next stage
    needs_grad: set[str] = field(default_factory=set)  # of received and sent values: the gradient flows

    @property
    def received(self) -> list[str]:
        return [name for kind, name in self.inputs if kind == "recv"]

    @property
    def user_inputs(self) -> list[int]:
        return [int(j) for kind, j in self.inputs if kind == "input"]


def layer_list(model: torch.nn.Module, layers: str | None) -> tuple[str, int]:
    """The qualified name of the module list whose children are the pipeline's layers, and their
    count: ``layers`` if given, else the model itself when it is a ``Sequential``, else the
    ``ModuleList`` with the most children (a decoder's ``model.layers``, GPT-2's ``transformer.h``)."""
    modules = dict(model.named_modules())
    if layers is not None:
        found = modules.get(layers)
        if not isinstance(found, (torch.nn.ModuleList, torch.nn.Sequential)):
            raise PlanError(f"layers={layers!r} is not a ModuleList or Sequential of "
                            f"{type(model).__name__}")
        return layers, len(found)
    if isinstance(model, torch.nn.Sequential):
        return "", len(model)
    lists = [(len(m), name) for name, m in modules.items() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise PlanError(f"{type(model).__name__} has no ModuleList of layers to cut into pipeline "
                        f"stages; pass layers= (the qualified name of one)")
    count, name = max(lists)
    return name, count


def _layer_of(node: torch.fx.Node, prefix: str) -> int | None:
    """The index of the layer a node belongs to, if its module stack passes through one."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in stack.values():
        path = str(path)
        if path.startswith(prefix):
            head = path[len(prefix):].split(".", 1)[0]
            if head.isdigit():
                return int(head)
    return None


def _stage_module(whole: torch.fx.GraphModule, held: list[torch.fx.Node], received: list[torch.fx.Node],
                  mine: list[torch.fx.Node], returned: list[torch.fx.Node], *,
                  single: bool) -> torch.fx.GraphModule:
    """The FX module of one stage: placeholders for what it holds and reads from the host (``held``)
    and what it receives, copies of its nodes (metadata and all), and what it returns: the loss
    alone (``single``) or the tuple of what it sends."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    attrs: dict[str, Any] = {}
    for n in held:
        env[n] = g.placeholder(n.name)
    for n in received:
        env[n] = g.placeholder(f"recv_{n.name}")

    def arg(a: torch.fx.Node) -> torch.fx.Node:
        if a not in env and a.op == "get_attr":  # a submodule a higher-order op runs
            attrs[str(a.target)] = getattr(whole, str(a.target))
            env[a] = g.get_attr(str(a.target))
        return env[a]

    for n in mine:
        env[n] = g.node_copy(n, arg)
    g.output((env[returned[0]],) if single else tuple(env[n] for n in returned))
    return torch.fx.GraphModule(attrs, g)


def partition(ep: torch.export.ExportedProgram, param_alias: dict[str, str], *, layers: str,
              edges: Sequence[int]) -> list[Stage]:
    """Cut the exported loss ``ep`` into ``len(edges) - 1`` stages, stage ``s`` holding layers
    ``edges[s]..edges[s+1]-1`` of the layer list ``layers`` (see module doc). ``param_alias`` maps
    every parameter name to its canonical one (a tied weight is one parameter)."""
    stages = len(edges) - 1
    prefix = f"{LOSS_ROOT}.{layers}." if layers else f"{LOSS_ROOT}."
    stage_of_layer = {i: s for s in range(stages) for i in range(edges[s], edges[s + 1])}
    graph = ep.graph
    sig = ep.graph_signature
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    kinds: dict[torch.fx.Node, tuple[str, Any]] = {}
    n_user = 0
    for node, spec in zip(placeholders, sig.input_specs):
        target = param_alias.get(spec.target or "", spec.target or "")
        if spec.kind is InputKind.PARAMETER:
            kinds[node] = ("param", target)
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            kinds[node] = ("buffer", target)
        elif spec.kind is InputKind.USER_INPUT:
            kinds[node] = ("input", n_user)
            n_user += 1
        else:
            raise PlanError(f"inputs of kind {spec.kind.name} are not supported in a pipeline step")
    stage: dict[torch.fx.Node, int] = {}
    grad: dict[torch.fx.Node, bool] = {n: k[0] == "param" for n, k in kinds.items()}
    current = 0
    seen_layer = False
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        layer = _layer_of(node, prefix)
        if layer is not None:
            if layer not in stage_of_layer:
                raise PlanError(f"layer {layer} of {layers or 'the model'} is outside the "
                                f"{edges[-1]} layers the stages hold")
            current = stage_of_layer[layer]
            seen_layer = True
        read = [a for a in node.all_input_nodes if a.op == "call_function"]
        if node.target is operator.getitem:
            source = node.args[0]
            assert isinstance(source, torch.fx.Node)
            where = stage[source]
        else:
            where = max([current, *(stage[a] for a in read)])
        stage[node] = where
        val = node.meta.get("val")
        floating = isinstance(val, torch.Tensor) and val.is_floating_point()
        grad[node] = bool(floating or not isinstance(val, torch.Tensor)) and any(
            grad.get(a, False) for a in node.all_input_nodes)
    if not seen_layer:
        raise PlanError(f"no operation of the loss graph is inside {layers or 'the model'}'s layers")
    output = next(n for n in graph.nodes if n.op == "output")
    (loss,) = output.args[0]
    if stage[loss] != stages - 1:
        raise PlanError("the loss is computed before the last stage's layers")
    # where each value is last read (a placeholder's readers read it from the host or their state)
    last_read: dict[torch.fx.Node, int] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        for a in node.all_input_nodes:
            if a.op == "call_function" and stage[node] > stage[a]:
                if not isinstance(a.meta.get("val"), torch.Tensor):
                    raise PlanError(f"{a.name} ({a.target}) is read across a stage boundary but is "
                                    f"not a tensor")
                last_read[a] = max(last_read.get(a, 0), stage[node])
    order = {n: i for i, n in enumerate(graph.nodes)}
    result: list[Stage] = []
    for s in range(stages):
        received = sorted((n for n, last in last_read.items() if stage[n] < s <= last), key=order.__getitem__)
        sends = sorted((n for n, last in last_read.items() if stage[n] <= s < last), key=order.__getitem__)
        mine = [n for n in graph.nodes if n.op == "call_function" and stage[n] == s]
        reads = {a for n in mine for a in n.all_input_nodes}
        params = [n for n in placeholders if n in reads and kinds[n][0] == "param"]
        buffers = [n for n in placeholders if n in reads and kinds[n][0] == "buffer"]
        users = [n for n in placeholders if n in reads and kinds[n][0] == "input"]
        inputs: list[tuple[str, Any]] = [("input", kinds[n][1]) for n in users]
        inputs += [("recv", n.name) for n in received]
        returned = [loss] if s == stages - 1 else sends
        module = _stage_module(ep.graph_module, [*params, *buffers, *users], received, mine, returned,
                               single=s == stages - 1)
        result.append(Stage(
            s, module, [kinds[n][1] for n in params], [kinds[n][1] for n in buffers], inputs,
            [n.name for n in sends], {n.name for n in [*received, *sends] if grad[n]}))
    return result


__all__ = ["LOSS_ROOT", "Stage", "layer_list", "partition"]
