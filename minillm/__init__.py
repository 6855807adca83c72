"""minillm: a small, hackable LLM inference engine."""

__version__ = "0.1.0"
