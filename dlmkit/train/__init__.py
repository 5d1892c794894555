"""The SFT recipe: ``load_config`` then ``run``."""

from .config import DEFAULTS, ConfigError, RunConfig, load_config
from .recipe import run

__all__ = ["DEFAULTS", "ConfigError", "RunConfig", "load_config", "run"]
