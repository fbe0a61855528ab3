"""``KVStats``: the per-layer key/value statistics of one model over a set of tokens.

Holds a :class:`~headwidget.moments.Moments` for every captured (layer, kind) — kinds ``"key"``
(pre-RoPE), ``"key_post"`` (post-RoPE), ``"value"``, ``"input"`` (the attention input) and ``"latent"``
(MLA) — plus optional cross-layer moments over a set of layers, token samples, the token sums of every
rotary pair's query/key norm (:class:`PlaneNorms`), and the metadata needed to interpret them.
Everything derived (correlations, head similarities) is computed on demand in float64: the examples
are :class:`KVStats`'s.
"""

from headwidget.stats._kvstats import KVStats
from headwidget.stats._meta import FORMAT, FORMAT_VERSION, StatsMeta, config_fingerprint, config_matches
from headwidget.stats._plane_norms import PlaneNorms
from headwidget.stats._samples import SAMPLE_SEED, NoSamplesError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "SAMPLE_SEED",
    "KVStats",
    "NoSamplesError",
    "PlaneNorms",
    "StatsMeta",
    "config_fingerprint",
    "config_matches",
]
