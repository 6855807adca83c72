"""EngineArgs: the one dataclass behind every engine flag.

`LLM(**kwargs)` takes its fields by name and every CLI (`serve`, `generate`, `chat`, `bench`)
builds its flags from it with `add_engine_args`, so the two can never drift apart.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, fields

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
SCHEDULING_POLICIES = ("fcfs", "priority")

# What building an engine from user input raises for the user's or the machine's reasons (bad flags,
# a model path or file, sizing, no GPU, no memory): the CLIs print one "error:" line and exit 2
STARTUP_ERRORS = (ValueError, OSError, NotImplementedError, ImportError, RuntimeError, MemoryError)


class CliParser(argparse.ArgumentParser):
    """Every minillm command line's parser: a flag is taken by its whole name only (argparse would read
    --max-num-seq as --max-num-seqs), and a bad one is one "error:" line and exit 2, as the
    engine's own refusals are, not the ~40 lines of usage before argparse's message."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)
        self.model_spellings: list[tuple[str, str]] = []  # (how, value) of each model given (_ModelGiven)

    def parse_known_args(self, args=None, namespace=None):
        self.model_spellings = []
        out = super().parse_known_args(args, namespace)
        given = dict(self.model_spellings)
        if len(set(given.values())) > 1:  # otherwise the last spelling would silently win
            self.error(f"the model is given twice: {given['MODEL']!r} as MODEL and {given['--model']!r} as --model; "
                       "give it once")
        return out

    def error(self, message: str):
        self.exit(2, f"error: {message} ({self.prog} --help lists the flags)\n")


class _ModelGiven(argparse.Action):
    """Stores the model and notes how it was given (the positional MODEL or --model) on a CliParser."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        if isinstance(parser, CliParser):
            parser.model_spellings.append(("--model" if option_string else "MODEL", values))


@dataclass
class EngineArgs:
    model: str | None = None
    # vLLM's --tokenizer: an HF directory whose tokenizer (and chat template) replaces the model's
    tokenizer: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 16
    max_model_len: int | None = None  # default: min(model's context, 4096)
    max_num_batched_tokens: int | None = None  # default: max(256 on the CPU, 2048 on CUDA; max_num_seqs * (1 + k))
    block_size: int = 16
    num_blocks: int | None = None  # default: max_num_seqs full-length sequences
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    speculative_config: dict | str | None = None
    enforce_eager: bool = False
    seed: int = 0
    # schedule step n + 1 before step n's tokens are back; None: the driver's default (on in
    # LLM.generate and the benchmarks, off in the server)
    async_scheduling: bool | None = None
    # vLLM's --chat-template: a Jinja file, or the template itself, used instead of the model's own
    chat_template: str | None = None
    # vLLM's --generation-config: "auto" (the model's generation_config.json sets the sampling
    # defaults), "vllm" (none: temperature 1, top_p 1, ...), or a folder holding a generation_config.json
    generation_config: str = "auto"
    # vLLM's --override-generation-config: sampling defaults (temperature, top_p, top_k, min_p) set on
    # top of what --generation-config gives (merged with the model's under auto, alone under vllm)
    override_generation_config: dict | str | None = None
    # vLLM's parallelism flags, so its usual command lines and LLM(...) calls run here: one GPU, so
    # only 1 (the default) is taken; anything else is refused rather than silently run on one
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # vLLM's trust_remote_code: taken and without effect, since no model's own code ever runs here
    # (the architectures are built in; a checkpoint's auto_map is never imported)
    trust_remote_code: bool = False
    # vLLM's flags for what minillm has one way of doing, so their usual command lines run here: prompts
    # are always chunked (by max_num_batched_tokens), the KV cache is kept in the compute dtype, and
    # weights are the checkpoint's floats (a GGUF file's dequantized at load). Other values are refused.
    enable_chunked_prefill: bool | None = None
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    # vLLM's --scheduling-policy: "fcfs" (first come, first served), or "priority": each request's
    # priority (an integer, lower first, default 0) orders admission and picks preemption's victim
    scheduling_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if isinstance(self.speculative_config, str):
            try:
                self.speculative_config = json.loads(self.speculative_config)
            except json.JSONDecodeError as e:
                raise ValueError(f"--speculative-config is not valid JSON: {e}") from None
        if isinstance(self.override_generation_config, str):
            try:
                self.override_generation_config = json.loads(self.override_generation_config)
            except json.JSONDecodeError as e:
                raise ValueError(f"--override-generation-config is not valid JSON: {e}") from None
        self.validate()

    def validate(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        def count(name: str, v, allow_none: bool = False) -> None:  # an int, never a bool, float or str
            need((allow_none and v is None) or (isinstance(v, int) and not isinstance(v, bool)),
                 f"--{name.replace('_', '-')} must be an integer, got {v!r}")

        # "" would load the current directory and report its missing config.json, naming no path
        path = os.fspath(self.model) if isinstance(self.model, (str, os.PathLike)) else None
        need(self.model is None or (isinstance(path, str) and path != ""),
             f"the model must be a non-empty path (an HF model directory or a .gguf file) or an alias, got "
             f"{self.model!r}; leave it out for the embedded default")
        for name in ("max_num_seqs", "block_size", "seed"):
            count(name, getattr(self, name))
        for name in ("max_model_len", "max_num_batched_tokens", "num_blocks"):
            count(name, getattr(self, name), allow_none=True)
        # the device holds positions, token counts, sequence rows and block ids as int32: larger values
        # would otherwise fail deep in numpy ("Maximum allowed dimension exceeded"), naming no flag
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "num_blocks"):
            v = getattr(self, name)
            need(v is None or v < 2**31, f"--{name.replace('_', '-')} must be below 2**31, got {v}")
        # a truthy string such as "false" would otherwise turn the feature on
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            v = getattr(self, name)
            count(name, v)
            need(v == 1, f"--{name.replace('_', '-')} {v}: minillm runs a model on one GPU, so only 1 is "
                         "supported; leave the flag out (the model must fit one GPU's memory)")
        for name in ("enable_prefix_caching", "enforce_eager", "async_scheduling", "trust_remote_code"):
            v = getattr(self, name)
            need(isinstance(v, bool) or (name == "async_scheduling" and v is None),
                 f"{name} must be True or False{' or None' if name == 'async_scheduling' else ''}, got {v!r}")
        gmu = self.gpu_memory_utilization
        need(isinstance(gmu, (int, float)) and not isinstance(gmu, bool),
             f"--gpu-memory-utilization must be a number, got {gmu!r}")
        need(self.device in DEVICES, f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        need(self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        need(self.max_num_seqs >= 1, f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        need(self.enable_chunked_prefill is not False,
             "--no-enable-chunked-prefill: minillm always splits a long prompt into chunks of the step's token "
             "budget; set that budget with --max-num-batched-tokens instead (a prompt fits one step when it is "
             "at least the prompt's length)")
        need(self.kv_cache_dtype == "auto",
             f"--kv-cache-dtype {self.kv_cache_dtype}: the KV cache is kept in the compute dtype (--dtype); only "
             "auto is supported")
        from minillm.models.loader import DEFAULT_MODEL_ALIAS

        gguf = self.model in (None, DEFAULT_MODEL_ALIAS) or str(self.model).endswith(".gguf")  # the default is one
        need(self.quantization is None or (self.quantization == "gguf" and gguf),
             f"--quantization {self.quantization}: minillm runs a checkpoint's float weights (a GGUF file's are "
             "dequantized at load, --quantization gguf); leave the flag out")
        if isinstance(self.tokenizer, os.PathLike):  # a Path, as the model may be
            self.tokenizer = os.fspath(self.tokenizer)
        need(self.tokenizer is None or (isinstance(self.tokenizer, str) and self.tokenizer != ""),
             f"--tokenizer must be an HF directory's path, got {self.tokenizer!r}")
        need(self.scheduling_policy in SCHEDULING_POLICIES,
             f"--scheduling-policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.scheduling_policy!r}")
        need(self.max_model_len is None or self.max_model_len >= 1,
             f"--max-model-len must be >= 1, got {self.max_model_len}")
        need(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
             f"--max-num-batched-tokens must be >= 1, got {self.max_num_batched_tokens}")
        bs = self.block_size
        need(8 <= bs <= 256 and bs & (bs - 1) == 0,
             f"--block-size must be a power of two from 8 to 256, got {bs}")
        need(self.num_blocks is None or self.num_blocks >= 1, f"--num-blocks must be >= 1, got {self.num_blocks}")
        need(0 < self.gpu_memory_utilization <= 1,
             f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        need(self.chat_template is None or (isinstance(self.chat_template, str) and self.chat_template != ""),
             f"--chat-template must be a template file's path or the template itself, got {self.chat_template!r}")
        need(isinstance(self.generation_config, str) and self.generation_config != "",
             f"--generation-config must be auto, vllm or a folder with a generation_config.json, got "
             f"{self.generation_config!r}")
        need(self.override_generation_config is None or isinstance(self.override_generation_config, dict),
             "--override-generation-config must be a JSON object, e.g. '{\"temperature\": 0.5}'")
        from minillm.models.hf_loader import override_defaults

        override_defaults(self.override_generation_config)  # its keys and values, before any model loads
        need(self.speculative_config is None or isinstance(self.speculative_config, dict),
             "--speculative-config must be a JSON object, e.g. "
             '\'{"method": "ngram", "num_speculative_tokens": 3}\'')

    @classmethod
    def from_cli(cls, ns: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})


def add_engine_args(p: argparse.ArgumentParser, model_positional: bool = True) -> argparse.ArgumentParser:
    """Add every EngineArgs field as a vLLM-named flag."""
    d = EngineArgs.__dataclass_fields__
    if model_positional:
        # the positional or vLLM's --model (its older entry point's spelling); the positional's default is
        # SUPPRESS so that, when it is left out, argparse does not overwrite what --model set
        p.add_argument("model", nargs="?", default=argparse.SUPPRESS, action=_ModelGiven,
                       help="HF model directory, .gguf file, or alias (default: the embedded SmolLM2-135M)")
        p.add_argument("--model", dest="model", default=None, metavar="MODEL", action=_ModelGiven,
                       help="the model, as a flag")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="an HF directory whose tokenizer.json (and tokenizer_config.json's chat template and special "
                        "tokens) to use instead of the model's (vLLM's flag): a checkpoint saved without one, or a "
                        "GGUF file with its base model's tokenizer")
    p.add_argument("--device", choices=DEVICES, default=d["device"].default)
    p.add_argument("--dtype", choices=DTYPES, default=d["dtype"].default,
                   help="compute dtype (auto: float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--max-num-seqs", type=int, default=d["max_num_seqs"].default)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default=d["scheduling_policy"].default,
                   help="fcfs: first come, first served; priority: requests' priority field (lower first, "
                        "default 0) orders admission and preemption (vLLM's)")
    p.add_argument("--block-size", type=int, default=d["block_size"].default)
    p.add_argument("--num-blocks", type=int, default=None,
                   help="KV pool size in blocks (default: max-num-seqs full-length sequences)")
    p.add_argument("--gpu-memory-utilization", type=float, default=d["gpu_memory_utilization"].default)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--speculative-config", type=str, default=None,
                   help='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\'; keys: method '
                        '(ngram, draft_model, dflash), num_speculative_tokens, model, prompt_lookup_min, '
                        'prompt_lookup_max, draft_vocab_size, disable_by_batch_size, backoff_after, '
                        'backoff_max_steps')
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template file, or the template itself, instead of the model's own (for a "
                        "model without one, or to change it); checked at startup")
    p.add_argument("--generation-config", default=d["generation_config"].default,
                   help="where requests' sampling defaults (temperature, top_p, top_k, min_p) come from: auto, the "
                        "model's generation_config; vllm, none (temperature 1, top_p 1, ...); or a folder holding a "
                        "generation_config.json")
    p.add_argument("--override-generation-config", default=None,
                   help='JSON sampling defaults on top of --generation-config\'s, e.g. \'{"temperature": 0.5}\' '
                        "(keys: temperature, top_p, top_k, min_p)")
    p.add_argument("--seed", type=int, default=d["seed"].default)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=d["tensor_parallel_size"].default,
                   help="vLLM's flag: only 1 (minillm runs a model on one GPU)")
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=d["pipeline_parallel_size"].default,
                   help="vLLM's flag: only 1")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's flag: prompts are always chunked by --max-num-batched-tokens (--no-... is refused)")
    p.add_argument("--kv-cache-dtype", default=d["kv_cache_dtype"].default,
                   help="vLLM's flag: only auto (the KV cache is kept in the compute dtype)")
    p.add_argument("--quantization", "-q", default=None,
                   help="vLLM's flag: only gguf, with a .gguf model (dequantized at load)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="vLLM's flag, accepted: no model's own code ever runs here (the architectures are built in)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="schedule and launch step n+1 before step n's sampled tokens reach the host, so the "
                        "device never waits for the host between plain decode steps (speculative rounds "
                        "and steps that may preempt run synchronously). Default: on for the server, the offline "
                        "API (LLM.generate) and the benchmarks; off for a bare LLMEngine and the chat REPL")
    return p
