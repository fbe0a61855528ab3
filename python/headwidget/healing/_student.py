"""The copy :func:`~headwidget.healing.heal` trains, what it shares with the teacher, and its loss as one
module.

- :func:`trained_copy`: the variant's modules copied, but every tensor the conversion did not change is
  the teacher's own tensor (a new ``nn.Parameter`` object over the same storage, so the copy's
  ``requires_grad`` flags are its own): one copy of the frozen weights in memory, the original never
  written to. Only the converted modules (each converted layer's attention and the modules holding its
  head projections) are the copy's own, in the training dtype. With every weight trained
  (``trainable="all"``) nothing can be shared: the copy is whole. :func:`handed_over` gives the healed
  copy the variant's frozen tensors at the end instead of the teacher's.
- :func:`checkpointed`: each decoder layer's forward run under ``torch.utils.checkpoint`` while gradients
  are recorded: only a layer's input is kept, its activations are computed again in the backward pass
  (one more forward of the layers, a fraction of the memory). Forwards without gradients (the evaluation
  points) run as they are.
- :class:`StepLoss`: the student's loss on one batch as one module, which ``DistributedDataParallel`` and
  FSDP wrap. For a language model whose head :class:`~headwidget.healing._chunked.OutputHead` reproduces,
  the student's body runs and the head and the loss run in chunks
  (:mod:`headwidget.healing._chunked`); otherwise the whole logits are formed
  (:mod:`headwidget.healing._loss`).

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> variant = headwidget.apply(model, "mqa", layers=[1])
    >>> student = trained_copy(variant, model, ["model.layers.1.self_attn"], torch.float32)
    >>> a, b = student.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight
    >>> a is b, a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    (False, True)
    >>> k = student.model.layers[1].self_attn.k_proj.weight
    >>> k.data_ptr() == variant.model.layers[1].self_attn.k_proj.weight.data_ptr()
    False
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from headwidget.capture.inputs import Batch
from headwidget.evaluation.running import forward_kwargs
from headwidget.healing._chunked import OutputHead, body, head_kd_loss, head_lm_loss, last_hidden
from headwidget.healing._loss import hidden_mse, kd_loss, lm_loss

__all__ = ["StepLoss", "checkpointed", "handed_over", "trained_copy"]


def trained_copy(
    variant: nn.Module, teacher: nn.Module, converted: Sequence[str], dtype: torch.dtype, share: bool = True
) -> nn.Module:
    """A copy of ``variant`` to train: the modules named in ``converted`` its own, in ``dtype``; every other
    tensor ``teacher``'s tensor of the same name (``share``; ``teacher`` holds the same values, in its own
    dtype), or, without ``share``, the whole copy its own in ``dtype``."""
    if not share:
        return copy.deepcopy(variant).to(dtype)
    own = {
        id(t)
        for name in converted
        for t in (*variant.get_submodule(name).parameters(), *variant.get_submodule(name).buffers())
    }
    params = dict(teacher.named_parameters(remove_duplicate=False))
    buffers = dict(teacher.named_buffers(remove_duplicate=False))
    memo: dict[int, Any] = {}
    for name, p in variant.named_parameters(remove_duplicate=False):
        if id(p) not in own and id(p) not in memo:
            memo[id(p)] = nn.Parameter(params[name].detach(), requires_grad=False)
    for name, b in variant.named_buffers(remove_duplicate=False):
        if id(b) not in own and id(b) not in memo and name in buffers:
            memo[id(b)] = buffers[name]
    student = copy.deepcopy(variant, memo)
    for name in converted:
        student.get_submodule(name).to(dtype)
    return student


def _checkpointed_forward(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpointed(blocks: Sequence[nn.Module]) -> Callable[[], None]:
    """Run each of ``blocks`` (the decoder layers) under activation checkpointing while gradients are
    recorded; the function that puts their own forwards back."""
    for block in blocks:
        block.forward = functools.partial(_checkpointed_forward, block.forward)

    def restore() -> None:
        for block in blocks:
            if "forward" in vars(block):
                del block.forward

    return restore


class StepLoss(nn.Module):
    """The student's loss on one batch (module docstring): ``forward(kwargs, target, input_ids,
    attention_mask)`` with ``kwargs`` from :meth:`kwargs` and ``target`` the teacher's last hidden
    states (``kd`` with ``heads``, or ``hidden_mse``: :meth:`hidden`), its logits (``kd`` without), or
    None (``lm``).

    ``heads`` are the teacher's and the student's :class:`OutputHead` when the chunked head applies. With
    ``whole`` (FSDP, whose root unit gathers the embeddings and the head only in the model's own forward)
    a model's last hidden states are read from its whole forward, asked for the logits of the last
    position alone, instead of from its body."""

    def __init__(
        self,
        student: nn.Module,
        loss_name: str,
        heads: tuple[OutputHead, OutputHead] | None,
        *,
        whole: bool = False,
    ):
        super().__init__()
        self.student = student
        self.loss_name = loss_name
        self.heads = heads
        self.whole = whole

    def _runs(self, model: nn.Module) -> nn.Module:
        return model if self.whole or self.heads is None else body(model)

    def kwargs(self, batch: Batch, device: torch.device) -> dict[str, Any]:
        """The keyword arguments of the student's forward on ``batch``."""
        runs = self._runs(self.student)
        kwargs = forward_kwargs(runs, batch, device)
        if self.whole and self.heads is not None:
            kwargs["logits_to_keep"] = 1
        return kwargs

    def hidden(self, model: nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
        """``model``'s last hidden states on ``batch`` (the teacher's, for the chunked head)."""
        kwargs = forward_kwargs(self._runs(model), batch, device)
        if self.whole:
            kwargs["logits_to_keep"] = 1
        return self._last_hidden(model, kwargs)

    def _last_hidden(self, model: nn.Module, kwargs: dict[str, Any]) -> torch.Tensor:
        if not self.whole:
            return last_hidden(body(model)(**kwargs))
        found: list[torch.Tensor] = []
        handle = body(model).register_forward_hook(lambda _m, _a, out: found.append(last_hidden(out)))
        try:
            model(**kwargs)
        finally:
            handle.remove()
        return found[0]

    def forward(
        self,
        kwargs: dict[str, Any],
        target: torch.Tensor | None,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        if self.loss_name == "hidden_mse":
            assert target is not None
            return hidden_mse(target, last_hidden(self.student(**kwargs)), attention_mask)
        if self.heads is None:
            logits = self.student(**kwargs).logits
            if self.loss_name == "kd":
                assert target is not None
                return kd_loss(target, logits, attention_mask)
            return lm_loss(logits, input_ids, attention_mask)
        teacher_head, student_head = self.heads
        hidden = self._last_hidden(self.student, kwargs)
        if self.loss_name == "kd":
            assert target is not None
            return head_kd_loss(teacher_head, student_head, target, hidden, attention_mask)
        return head_lm_loss(student_head, hidden, input_ids, attention_mask)


@torch.no_grad()
def handed_over(student: nn.Module, teacher: nn.Module, variant: nn.Module) -> nn.Module:
    """``student`` with each tensor it shares with ``teacher`` replaced by ``variant``'s tensor of the same
    name (the same values: the conversion did not change them), or by a copy where the variant holds it in
    another dtype. The healed model then shares its frozen weights with the variant it was made from,
    never with the original: no copy of them is made, and training it further cannot reach the model. Every
    parameter takes the variant's ``requires_grad`` flag."""
    theirs = {t.untyped_storage().data_ptr() for t in (*teacher.parameters(), *teacher.buffers())}
    params = dict(variant.named_parameters(remove_duplicate=False))
    buffers = dict(variant.named_buffers(remove_duplicate=False))
    for name, p in student.named_parameters(remove_duplicate=False):
        if p.untyped_storage().data_ptr() in theirs:
            given = params.get(name)
            same = given is not None and given.shape == p.shape and given.dtype == p.dtype
            p.data = given.data if same and given is not None else p.data.clone()
        if name in params:  # the variant's own flags: it trains further as the variant would
            p.requires_grad_(params[name].requires_grad)
    for prefix, module in student.named_modules():
        for name, b in list(module._buffers.items()):
            if b is not None and b.untyped_storage().data_ptr() in theirs:
                kept = buffers.get(f"{prefix}.{name}" if prefix else name)
                same = kept is not None and kept.shape == b.shape and kept.dtype == b.dtype
                module._buffers[name] = kept if same and kept is not None else b.clone()
    return student
