"""What a statistics file says about its capture: the model, its attention layout, layers, kinds, tokens."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from headwidget.core.kinds import Kind
from headwidget.core.layout import AttentionLayout
from headwidget.core.stored import stored
from headwidget.stats._samples import SEED_LIMIT

__all__ = ["FORMAT", "FORMAT_VERSION", "StatsMeta", "config_fingerprint", "config_matches"]

FORMAT = "headwidget-stats"
FORMAT_VERSION = "1"


@dataclass
class StatsMeta:
    """What was captured, from which model, and how.

    >>> from headwidget.core import AttentionLayout
    >>> meta = StatsMeta("demo", "Demo", AttentionLayout("demo", "gqa", 2, 4, 2, 8, 8, 32), [0, 1], ["key"])
    >>> meta.num_kv_heads, meta.head_dim, meta.to_json()["layout"]["num_kv_heads"]
    (2, 8, 2)
    """

    model_name: str
    model_class: str
    layout: AttentionLayout
    layers: list[int] = stored(minimum=0, unique="layer", expects="must be a list of layer indices")
    kinds: list[Kind] = stored(unique=True, expects="must be a non-empty list of kinds")
    tokens: int = stored(default=0, minimum=0)
    dtype: str = "float32"
    skip_first_token: bool = False
    cross_layers: list[int] | None = stored(
        default=None, minimum=0, unique="layer", expects="must be a list of layer indices"
    )
    config_fingerprint: str = ""
    #: 16 hexadecimal digits identifying the captured layers' weights
    #: (:func:`~headwidget.adapters.fingerprint.weight_fingerprint`), so that statistics of a base model
    #: are not taken for its fine-tune's; None: unknown (a file saved before headwidget recorded it,
    #: weights it could not read, or a merge with such statistics).
    weights_fingerprint: str | None = stored(
        default=None, expects="must be a string of 16 hexadecimal digits or null"
    )
    versions: dict[str, str] = stored(
        default_factory=dict, expects="must map package names to version strings"
    )
    #: The reservoir size ``R`` of ``capture(..., samples=R)`` (0: no token samples were kept).
    sample_size: int = stored(default=0, minimum=0)
    #: The seed the token samples were drawn with (after a merge, the seed derived for the merge).
    sample_seed: int = stored(default=0, minimum=0, maximum=SEED_LIMIT - 1)

    # Convenience views of the layout -------------------------------------------------
    @property
    def family(self) -> str:
        return self.layout.family

    @property
    def mechanism(self) -> str:
        return self.layout.mechanism

    @property
    def num_heads(self) -> int:
        return self.layout.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.layout.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.layout.head_dim

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["layout"] = self.layout.to_json()
        return data


#: Config fields that say how a model was stored or loaded, not what it computes: ``save_pretrained``
#: writes ``architectures`` and ``dtype`` into the config of the model it saves, and a dtype cast is the
#: same model.
NOT_ARCHITECTURE = ("transformers_version", "architectures", "dtype", "torch_dtype")


def _fingerprint(config: Any, ignored: tuple[str, ...]) -> str:
    try:
        raw = config.to_dict()
    except AttributeError:
        raw = dict(vars(config))
    keep = {k: v for k, v in raw.items() if not k.startswith("_") and k not in ignored}
    text = json.dumps(keep, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_fingerprint(config: Any) -> str:
    """A short hash of a model config's architecture fields (what must agree for a merge).

    Fields in :data:`NOT_ARCHITECTURE` do not count, so saving a model or casting it keeps its
    fingerprint.

    >>> from transformers import GPT2Config
    >>> config = GPT2Config(n_layer=1)
    >>> before = config_fingerprint(config)
    >>> config.architectures, config.dtype = ["GPT2LMHeadModel"], "float32"  # what save_pretrained writes
    >>> config_fingerprint(config) == before, config_fingerprint(GPT2Config(n_layer=2)) == before
    (True, False)
    """
    return _fingerprint(config, NOT_ARCHITECTURE)


def config_matches(fingerprint: str, config: Any) -> bool:
    """Whether statistics with ``fingerprint`` come from a model with ``config``: today's fingerprint, or
    the one files written before :data:`NOT_ARCHITECTURE` existed hold (which counted every field but
    ``transformers_version``)."""
    return fingerprint in (config_fingerprint(config), _fingerprint(config, ("transformers_version",)))
