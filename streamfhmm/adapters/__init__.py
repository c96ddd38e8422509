"""Adapters to other streaming libraries.

* :mod:`streamfhmm.adapters.river` (the ``river`` extra,
  ``pip install "streamfhmm[river]"``): :class:`~streamfhmm.adapters.river.FHMMTransformer`
  and :class:`~streamfhmm.adapters.river.FHMMAnomalyScorer`.

Nothing is imported here, so that ``import streamfhmm.adapters`` works without the
optional dependencies.
"""
