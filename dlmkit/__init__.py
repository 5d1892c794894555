"""dlmkit: train and sample diffusion language models, with structured attention masks."""

__version__ = "0.1.0"
