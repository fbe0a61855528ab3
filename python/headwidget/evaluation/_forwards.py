"""The ``forward`` a variant of :func:`~headwidget.evaluation.apply` runs its K/V parts in: K/V
quantizers (:mod:`~headwidget.evaluation._quantize`), shared K/V (:mod:`~headwidget.evaluation._sharing`)
and prefill cache transforms (:mod:`~headwidget.evaluation._cache_transforms`).

Kept in the instance's ``__dict__`` (the class is untouched); it holds the model it belongs to, so
``copy.deepcopy`` and pickling give a copy whose parts act on the copy's attention. A forward the
instance already had of its own (accelerate's device hooks, another part's forward) is the one it calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

__all__ = ["PartsForward"]


class PartsForward:
    """A model's forward with :attr:`parts` acting in every call (each subclass's ``__call__`` says how,
    around :meth:`wrapped_forward`)."""

    #: What the parts do to the forward, for its repr.
    doing = ""

    def __init__(self, model: nn.Module, parts: Sequence[Any]) -> None:
        self.model = model
        self.parts = list(parts)
        self.inner = model.__dict__.get("forward")

    @property
    def __wrapped__(self) -> object:  # inspect.signature / help() show the transformers method
        return type(self.model).forward.__get__(self.model)

    def __repr__(self) -> str:
        return f"<forward of {type(self.model).__name__} {self.doing}: {self.described()}>"

    def described(self) -> str:
        return ", ".join(f"{p.spec} on layers {p.layers}" for p in self.parts)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped_forward(*args, **kwargs)

    def wrapped_forward(self, *args: Any, **kwargs: Any) -> Any:
        """The forward this one wraps: the instance's own from before, else the class's."""
        if self.inner is not None:
            return self.inner(*args, **kwargs)
        return type(self.model).forward(self.model, *args, **kwargs)

    @classmethod
    def install(cls, model: nn.Module, parts: Sequence[Any]) -> None:
        """Make every forward of ``model`` (a copy it owns, never a user's model) run ``parts``."""
        if parts:
            model.forward = cls(model, parts)

    @classmethod
    def installed(cls, model: nn.Module) -> list[Any]:
        """The parts of this kind that every forward of ``model`` runs (none: ``[]``), found under any
        forward installed after them."""
        forward = model.__dict__.get("forward")
        while forward is not None and not isinstance(forward, cls):
            forward = getattr(forward, "inner", None)
        return list(forward.parts) if isinstance(forward, cls) else []
