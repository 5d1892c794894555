"""The shared decoding runtime, below the families: :mod:`.runner` (model calls for any
attention backend, KV caches, forward counts, left-padded ragged batches), :mod:`.commit` (the
commit rules of a denoising step, the masked canvas), :mod:`.primitives` (Gumbel sampling,
confidences, schedules), :mod:`.stream` (the KV-cached causal stream, autoregressive decoding),
:mod:`.options` (the options every sampler takes, which each family's options extend) and
:mod:`.likelihood` (scorers). Each family's decoder (``dlmkit/families/<name>/decode.py``) is
built from these; the entry points (load, generate, infill, evaluate) are :mod:`dlmkit.generate`.
"""
