"""The SFT recipe: ``load_config`` then ``run``."""

from .config import DEFAULTS, ConfigError, load_config
from .recipe import run

__all__ = ["DEFAULTS", "ConfigError", "load_config", "run"]
