"""vsup: the vLLM node supervisor."""

__version__ = "0.2.0"
