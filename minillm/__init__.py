"""minillm: a small, hackable LLM inference engine."""

from minillm.llm import LLM, CompletionOutput
from minillm.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "CompletionOutput", "SamplingParams"]
