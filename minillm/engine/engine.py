"""LLMEngine: requests in, token and text deltas out, one scheduler step at a time.

Startup does all the sizing (the arena rule): the KV pool, the step buffers and the workspace
are made once from max_num_seqs, max_model_len and max_num_batched_tokens, and a configuration
that cannot hold one max_model_len sequence is refused with the numbers.

A step is schedule -> runner.launch (prepare, upload, graph replay or eager kernels) ->
runner.collect (the sampled ids) -> accept (stop tokens, limits) -> render (text, stop strings).
With async_scheduling (LLM.generate's default) step n + 1 is scheduled and launched before step
n is collected (see _step_async), so the device does not wait for the host between steps.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from minillm.args import EngineArgs
from minillm.backends.compile import env_flag
from minillm.engine.block_manager import BlockManager
from minillm.engine.host_memory import plan_host_pool
from minillm.engine.logprobs import TokenLogprob, prompt_logprobs, token_logprob
from minillm.engine.runner import BEHIND_NEXT, ModelRunner
from minillm.engine.scheduler import ScheduledSeq, Scheduler
from minillm.engine.sequence import Sequence
from minillm.engine.structured import GrammarCompiler, ThinkState, matcher_error, token_mask
from minillm.envvars import warn_unknown_settings
from minillm.models.hf_loader import override_defaults, sampling_defaults
from minillm.models.loader import LoadedModel, load_model, resolve_model_path, tokenizer_dir
from minillm.models.tokenizer import IncrementalDecoder, compile_chat_template, read_chat_template
from minillm.models.transformer import Transformer, Workspace
from minillm.sampling_params import SamplingParams
from minillm.spec.config import SpeculativeConfig
from minillm.spec.proposers import SpecStats, build_proposer, drafter_errors, lookahead

log = logging.getLogger("minillm")

GiB = 1 << 30
MAX_SLOTS = 1 << 31  # KV token slots an int32 slot index reaches (slot_mapping, block tables x block_size)


@dataclass
class RequestOutput:
    """What one step produced for one request.

    token_ids (every output token so far) is copied out of the sequence's list when first read:
    most consumers read it only once a request finishes, and copying it for every request on every
    step made a step's cost grow with the output length. The sequence's list only ever grows, so
    its first output_len entries are this step's tokens whenever they are read.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    output_ids: list[int] = field(repr=False)  # the sequence's own list: read token_ids instead
    output_len: int
    # the output's text so far is text_head + text_end (Sequence.text_head): read text instead
    text_head: str = field(repr=False)
    text_end: str = field(repr=False)
    num_prompt_tokens: int
    finished: bool = False
    finish_reason: str | None = None
    # finish_reason "stop" by a stop string or a stop_token_ids id: which (vLLM's stop_reason); else None
    stop_reason: int | str | None = None
    _token_ids: list[int] | None = field(default=None, repr=False)
    # with SamplingParams.logprobs: one TokenLogprob per entry of new_token_ids, else None
    new_logprobs: list[TokenLogprob] | None = None
    # with SamplingParams.prompt_logprobs, on the request's first output only: one entry per prompt
    # token, None for the first (nothing predicts it), else None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # finish_reason "error" (a structured output's matcher failed mid-output): what went wrong
    error: str | None = None
    # on the request's first output only: seconds from add_request to its first scheduled step
    queued_s: float | None = None
    # on the request's first output only: prompt tokens the prefix cache held when it was first scheduled
    num_cached_tokens: int | None = None

    @property
    def token_ids(self) -> list[int]:
        if self._token_ids is None:  # first read: a copy, as the sequence's list grows on
            self._token_ids = self.output_ids[: self.output_len]
        return self._token_ids

    @property
    def text(self) -> str:
        """The output's text so far (joined when read: most consumers read it once, at the end)."""
        return self.text_head + self.text_end if self.text_head else self.text_end


@dataclass
class EngineStats:
    running: int = 0
    waiting: int = 0
    blocks_total: int = 0
    blocks_used: int = 0
    blocks_free: int = 0
    blocks_cached: int = 0
    preemptions: int = 0
    prefix_cache_hit_rate: float = 0.0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache since start
    prefix_cache_hits: int = 0  # and found there
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec: dict = field(default_factory=dict)


@dataclass
class _Inflight:
    """A step launched by the async path and not collected yet: what it ran and its handle."""

    scheduled: list[ScheduledSeq]
    handle: tuple


TEXT_FOLD = 4096  # characters of a sequence's text kept apart from its head (_render)


def graph_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes decode steps are captured for: 1, 2, 4, 8, 16, 24, 32, ... up to max_num_seqs."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs, 8))
    return sizes + [max_num_seqs]


# The step's token budget when --max-num-batched-tokens is not given. On the CPU a prompt's chunk is
# computed in one NumPy step that holds every other stream: with a 1,500-token prompt beside a decoding
# stream (scripts/cpu_long_prompt.py, 2 cores, medians of 3) 256-token chunks gave the prompt's first token
# in 7.5 s and the stream a longest pause of 1.4 s, against 10.6 s and 10.6 s in one 2,048-token step
# (less of the causal score matrix is computed, in cache-sized pieces); 16 short requests took 4% longer
# (BENCHMARKS.md, session 51).
DEFAULT_TOKEN_BUDGET = {"numpy": 256, "cuda": 2048}


def select_backend(device: str, dtype: str):
    """The op table for a device: NumPy on the CPU, CUDA when CuPy finds a GPU."""
    if device == "auto":
        device = "cpu"
        if importlib.util.find_spec("cupy") is not None:
            from minillm.backends.cuda_ops import cuda_unavailable_reason

            reason = cuda_unavailable_reason()
            device = "cuda" if reason is None else "cpu"
            if reason is not None:
                log.info("--device auto: the CPU backend, since the CUDA backend cannot run here: %s", reason)
    if device == "cpu":
        if dtype not in ("auto", "float32"):
            raise ValueError(f"--dtype {dtype} is not supported on the CPU backend; it computes in float32")
        from minillm.backends.numpy_ops import NumpyBackend

        return NumpyBackend()
    from minillm.backends.cuda_ops import CudaBackend

    return CudaBackend(dtype=dtype)


def plan_kv_pool(args: EngineArgs, kv_bytes_per_token: int, max_model_len: int,
                 available_bytes: int | None, lookahead: int = 0) -> int:
    """Number of KV blocks: the arena rule, an explicit override, or what the device can hold.

    A sequence may hold max_model_len + lookahead positions (a drafter writes past its end).
    """
    bs = args.block_size
    per_seq = -(-(max_model_len + lookahead) // bs)
    block_bytes = kv_bytes_per_token * bs
    if args.num_blocks is not None:
        num_blocks = args.num_blocks
    else:
        num_blocks = args.max_num_seqs * per_seq
        if available_bytes is not None:
            num_blocks = min(num_blocks, available_bytes // block_bytes)
    if num_blocks < per_seq:
        fits = num_blocks * bs - lookahead
        ahead = f" and the {lookahead} positions its drafter writes past it" if lookahead else ""
        # a max_model_len of at most the lookahead leaves no room for the drafter's k (refused at startup)
        advice = (f"the largest max_model_len that fits is {fits} — lower --max-model-len or raise --num-blocks"
                  if fits > lookahead else f"raise --num-blocks to at least {per_seq}")
        raise ValueError(
            f"one sequence of max_model_len {max_model_len}{ahead} needs {per_seq} blocks "
            f"({per_seq * block_bytes / GiB:.2f} GiB); the pool has {num_blocks} blocks "
            f"({num_blocks * block_bytes / GiB:.2f} GiB); {advice}"
            + (" / --gpu-memory-utilization" if available_bytes is not None else "")
        )
    if available_bytes is not None and num_blocks * block_bytes > available_bytes:
        raise ValueError(
            f"--num-blocks {num_blocks} needs {num_blocks * block_bytes / GiB:.2f} GiB of KV cache but "
            f"only {available_bytes / GiB:.2f} GiB is left after weights and workspace — lower "
            f"--num-blocks or raise --gpu-memory-utilization"
        )
    if num_blocks * bs >= MAX_SLOTS:  # slot_mapping (block * block_size + offset) is int32
        raise ValueError(
            f"the KV pool would hold {num_blocks * bs} token slots ({num_blocks} blocks x --block-size {bs}), "
            f"but slot indices are int32: at most {MAX_SLOTS - 1}; "
            + (f"lower --num-blocks below {-(-MAX_SLOTS // bs)}" if args.num_blocks is not None else
               f"the pool defaults to --max-num-seqs {args.max_num_seqs} sequences of --max-model-len "
               f"{max_model_len} ({per_seq} blocks each): lower them, or set --num-blocks below "
               f"{-(-MAX_SLOTS // bs)}")
        )
    return num_blocks


class LLMEngine:
    def __init__(self, args: EngineArgs | None = None, loaded: LoadedModel | None = None, **kwargs):
        args = args or EngineArgs(**kwargs)
        self.args = args
        # what the flags alone decide is checked before the weights load (minutes for a large model)
        template = read_chat_template(args.chat_template) if args.chat_template is not None else None
        if template is not None:
            compile_chat_template(*template)
        overrides = override_defaults(args.override_generation_config)
        # a folder's generation_config.json (read once, here) replaces the model's defaults: it needs no model
        folder_defaults = (sampling_defaults(args.generation_config, {})
                           if args.generation_config not in ("auto", "vllm") else None)
        spec = args.speculative_config  # {} is a config without a method (refused), null is none
        self.spec = SpeculativeConfig.from_dict(spec) if spec is not None else None
        self.num_speculative_tokens = k = self.spec.num_speculative_tokens if self.spec else 0
        if self.spec is not None and self.spec.model:
            with drafter_errors():  # a missing drafter, before the target loads
                resolve_model_path(self.spec.model)
        if args.tokenizer is not None:
            tokenizer_dir(args.tokenizer)
        if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < args.max_num_seqs * (1 + k):
            raise ValueError(
                f"--max-num-batched-tokens {args.max_num_batched_tokens} is below max_num_seqs x (1 + k) = "
                f"{args.max_num_seqs * (1 + k)}: a full decode step would not fit"
            )
        warn_unknown_settings()  # a misspelt or removed MINILLM_* switch changes nothing: say so
        self.backend = select_backend(args.device, args.dtype)
        self.max_num_batched_tokens = args.max_num_batched_tokens or max(
            DEFAULT_TOKEN_BUDGET[self.backend.name], args.max_num_seqs * (1 + k))

        if loaded is None:
            t0 = time.perf_counter()
            loaded = load_model(args.model, tokenizer=args.tokenizer)
            log.info("loaded %s in %.1f s", loaded.name, time.perf_counter() - t0)
        self.loaded = loaded
        cfg = self.loaded.config
        self.config = cfg
        self.tokenizer = self.loaded.tokenizer
        if template is not None:
            self.tokenizer.set_chat_template(*template)
        if (error := self.tokenizer.chat_template_error()) is not None:
            log.warning("the chat template (%s) fails on a one-message user conversation: %s; chat requests will "
                        "fail with it (--chat-template gives another)",
                        self.tokenizer.chat_template_where or "the model's", error)
        # requests' sampling defaults (the server and the chat REPL fill what a request leaves out)
        if folder_defaults is None:
            folder_defaults = sampling_defaults(args.generation_config, self.loaded.generation_defaults)
        self.generation_defaults = {**folder_defaults, **overrides}
        if self.generation_defaults:
            log.info("sampling defaults from the generation config (--generation-config %s%s): %s",
                     args.generation_config, ", --override-generation-config" if args.override_generation_config
                     else "", self.generation_defaults)
        self.model_name = self.loaded.name

        self.max_model_len = args.max_model_len or min(cfg.max_position_embeddings, 4096)
        if self.max_model_len > cfg.max_position_embeddings:
            raise ValueError(
                f"--max-model-len {self.max_model_len} exceeds the model's context "
                f"(max_position_embeddings {cfg.max_position_embeddings}); lower it"
            )
        self.block_size = args.block_size
        if k >= self.max_model_len:  # a round's k + 1 positions could never fit a sequence
            raise ValueError(f"--speculative-config: num_speculative_tokens {k} must be below --max-model-len "
                             f"{self.max_model_len}")
        self.lookahead = lookahead(self.spec)  # KV positions a drafter may write past the last token
        if self.lookahead >= self.max_model_len:  # a DFlash block longer than any sequence (a config typo)
            raise ValueError(f"--speculative-config: the drafter's block_size {self.lookahead + 1} reaches past "
                             f"--max-model-len {self.max_model_len}; check the drafter's dflash_config.block_size")
        self.model = Transformer(cfg, self.loaded.weights, self.backend, self.max_model_len + self.lookahead + 1)
        self.loaded.weights = {}  # the backend holds its own copy now
        max_logits = args.max_num_seqs * (1 + k)
        self.runner_args = dict(max_tokens=self.max_num_batched_tokens, max_seqs=args.max_num_seqs,
                                max_logits=max_logits, max_model_len=self.max_model_len + self.lookahead)
        self.proposer = build_proposer(self) if self.spec else None
        dtype_bytes = np.dtype(self.backend.dtype).itemsize
        kv_bytes = cfg.kv_bytes_per_token(dtype_bytes)
        if self.proposer is not None:  # the drafter's pool shares the target's block ids
            kv_bytes += self.proposer.kv_bytes_per_token(dtype_bytes)
        available = None
        if self.backend.name == "cuda":  # what --gpu-memory-utilization leaves after weights and workspace
            free, total = self.backend.cp.cuda.runtime.memGetInfo()
            ws = Workspace.nbytes(cfg, self.max_num_batched_tokens, max_logits, dtype_bytes)
            available = int(total * args.gpu_memory_utilization) - (total - free) - 2 * ws - (1 << 30)
        self.num_blocks = plan_kv_pool(args, kv_bytes, self.max_model_len, available, self.lookahead)
        if self.backend.name != "cuda":  # host RAM: checked before anything that scales with the flags exists
            self.num_blocks = plan_host_pool(args, cfg, self.num_blocks, kv_bytes, self.max_num_batched_tokens,
                                             max_logits, self.max_model_len, self.lookahead, dtype_bytes)
        self.kv = self.model.allocate_kv_cache(self.num_blocks, self.block_size)
        self.block_manager = BlockManager(self.num_blocks, self.block_size, args.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, args.max_num_seqs, self.max_num_batched_tokens)
        self.scheduling_policy = args.scheduling_policy
        self.runner = ModelRunner(self.model, self.backend, self.kv, self.block_manager, **self.runner_args)
        if self.proposer is not None:
            self.proposer.attach(self.block_manager)
            if getattr(self.proposer, "uses_target_hidden", False):  # DFlash reads target hidden states
                self.runner.capture_layers = self.proposer.layer_ids
                self.runner.capture_out = self.proposer.capture
                # the context update runs in every target step, inside its CUDA graph when replayed
                self.runner.after_forward = self.proposer.update_context
            if getattr(self.proposer, "drafts_on_device", False):
                # verification steps take the drafts from the drafter's sampled ids on the device
                self.runner.draft_source = self.proposer.runner.buf.dev["out_tokens"]
            if getattr(self.proposer, "samples_drafts", False):
                # drafts drawn at temperature > 0 are verified against the drafter's q rows
                self.runner.draft_q = self.proposer
        # early drafting: the drafting step goes on the device right behind the verification step,
        # before the host reads its results (_draft_behind); MINILLM_EARLY_DRAFTS=0: after (A/B runs)
        self.early_drafts = (self.runner.draft_source is not None and hasattr(self.proposer, "propose_behind")
                             and env_flag("MINILLM_EARLY_DRAFTS", True, "0: drafting after the host reads a round"))
        self.drafted_behind = 0  # drafting steps launched by _draft_behind (tests read it)
        self._spec_paused = False  # this step drafts nothing (disable_by_batch_size)
        self._drafting_decided = False  # _propose has decided the next step's drafts (and counted it)
        self._ahead_paused = False  # _plain_ahead's decision: the step scheduled ahead is a paused one
        self.spec_stats = SpecStats(k)
        self.profiler = None  # a StepProfiler (minillm/engine/step_profile.py) times step()'s phases
        # overlap_outputs: step() renders a step's text and outputs while the next step runs on the
        # device, so it returns the previous step's outputs (LLM.generate turns it on; see step())
        self.overlap_outputs = False
        # async_scheduling: step n + 1 is scheduled and launched before step n's sampled ids come
        # back (see _step_async); None in EngineArgs means the driver decides (LLM turns it on)
        self.async_scheduling = bool(args.async_scheduling)
        self._inflight: _Inflight | None = None  # the launched step whose ids are not accepted yet
        # requests asking for logprobs: while any runs, steps are synchronous (a step's logits are
        # read after its ids arrive, before the next step overwrites them). Penalties and grammars,
        # which need every id sampled so far, pipeline: see _step_async's deferred sampling
        self._sync_requests: set[str] = set()
        self.num_pipelined_steps = 0  # steps launched while another was in flight (tests read it)
        self._unrendered: list[tuple[Sequence, list[int], str | None]] = []
        self.requests: dict[str, Sequence] = {}
        self.rng = random.Random(args.seed)
        self.stats_prompt_tokens = 0
        self.stats_generation_tokens = 0
        self.eos_ids = frozenset(cfg.eos_token_ids)
        self.grammars = GrammarCompiler(self.tokenizer, cfg.vocab_size, sorted(self.eos_ids))
        self.runner.grammars = self.grammars
        if hasattr(self.backend, "capture_graph") and not args.enforce_eager:
            self.runner._spec_k = k
            rows = [1] + ([1 + k] if k else [])
            self.runner.capture_graphs(graph_buckets(args.max_num_seqs), rows, forward_only=True)
            if hasattr(self.proposer, "capture_graphs"):  # a drafter's steps (DFlash's block, a draft model's)
                self.proposer.capture_graphs(graph_buckets(args.max_num_seqs))
        if hasattr(self.backend, "seal"):
            self.backend.seal()  # from here on any device allocation raises, with its call site
            log.info("%s", self.backend.memory_plan())
        log.info("engine ready: %s on %s, max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, "
                 "%d KV blocks of %d", self.model_name, self.backend.name, self.max_model_len, args.max_num_seqs,
                 self.max_num_batched_tokens, self.num_blocks, self.block_size)

    # ---- requests -------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int], params: SamplingParams | None = None) -> list[int]:
        """The prompt's token ids, as params.truncate_prompt_tokens leaves them (its last k tokens; -1:
        the last max_model_len - max_tokens), so every later check and count sees what runs."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            if isinstance(prompt, np.ndarray):
                prompt = prompt.tolist()
            if not isinstance(prompt, (list, tuple)):
                raise ValueError(f"a prompt is a string or a list of token ids; got {type(prompt).__name__}")
            ids = list(prompt)
            if not set(map(type, ids)) <= {int}:  # numpy integers as ints: prompt_token_ids stay JSON-able
                ids = [int(t) if isinstance(t, np.integer) else t for t in ids]
        return params.truncated_prompt(ids, self.max_model_len) if params is not None else ids

    def validate_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Reject at admission what could never run: the server maps ValueError to HTTP 400."""
        n = len(prompt_ids)
        if n == 0:
            raise ValueError("the prompt is empty: give at least one token")
        # plain ints in range, checked at C speed (a 32k-token prompt: 5 ms, against 21 ms a token at
        # a time); anything else is looked at token by token to name the bad ones
        if not (set(map(type, prompt_ids)) <= {int} and min(prompt_ids) >= 0
                and max(prompt_ids) < self.config.vocab_size):
            bad = [t for t in prompt_ids if isinstance(t, bool)
                   or not (isinstance(t, (int, np.integer)) and 0 <= t < self.config.vocab_size)]
        else:
            bad = []
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {self.config.vocab_size}); got {bad[:5]}")
        if n >= self.max_model_len:
            raise ValueError(f"the prompt has {n} tokens; max_model_len {self.max_model_len} leaves no room for "
                             "output: shorten the prompt or raise max_model_len")
        # (stop_token_ids past the vocabulary are no-ops offline, as in vLLM; the server refuses them)
        for name in ("logit_bias", "allowed_token_ids", "think_token_ids"):
            bad = [t for t in (getattr(params, name) or ()) if t is not None and t >= self.config.vocab_size]
            if bad:
                raise ValueError(f"{name} token ids must be below the vocabulary size {self.config.vocab_size}; "
                                 f"got {bad[:5]}")
        if params.min_tokens and params.allowed_token_ids is not None and \
                set(params.allowed_token_ids) <= set(self.eos_ids) | set(params.stop_token_ids):
            raise ValueError("allowed_token_ids holds only stop tokens, which min_tokens bans until then: "
                             "allow another token or drop min_tokens")
        if n + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) = {n + params.max_tokens} exceeds "
                f"max_model_len {self.max_model_len}; lower max_tokens to at most {self.max_model_len - n}"
            )

    def _bad_word_ids(self, words: list[str]) -> list[tuple[int, ...]]:
        """bad_words as token sequences: each word as it stands and after a space (how it reads inside
        a text), as vLLM tokenizes them; ids past the logits (an untrained tail) dropped."""
        out = set()
        for w in words:
            for text in (w.lstrip(), " " + w.lstrip()):
                ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
                if ids and all(t < self.config.vocab_size for t in ids):
                    out.add(ids)
        return sorted(out)

    def check_priority(self, priority) -> None:
        """ValueError unless priority is an integer the scheduling policy takes (any under priority,
        only 0 under fcfs, as vLLM refuses it)."""
        if not isinstance(priority, (int, np.integer)) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        if priority != 0 and self.scheduling_policy != "priority":
            raise ValueError(f"priority {priority} needs priority scheduling; start the engine with "
                             "--scheduling-policy priority (scheduling_policy=\"priority\"), or leave priority out")

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0) -> str:
        """Queue a request; its id. priority (--scheduling-policy priority only): lower runs first."""
        params = params or SamplingParams()
        # fields set by hand after construction are checked (and normalised) here: they were taken as
        # they were (a top_p set to 0 on the object divided by zero in the NumPy sampler)
        params.validate()
        if params.n != 1:  # one request is one sample: n would be dropped without a word
            raise ValueError(f"the engine runs one sample a request (n = {params.n} given): add each of "
                             "params.sample_params(i) for i in range(n), as LLM.generate and the server do")
        self.check_priority(priority)
        prompt_ids = self.encode_prompt(prompt, params)  # truncated as params.truncate_prompt_tokens asks
        self.validate_prompt(prompt_ids, params)
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        # the runner keeps seeds in a uint64 buffer: a negative seed would raise there, mid-step
        seed = params.seed % 2**64 if params.seed is not None else self.rng.getrandbits(63)
        seq = Sequence(request_id, prompt_ids, params, seed)
        seq.priority = priority
        if params.structured_outputs is not None:  # ValueError: the constraint does not compile
            seq.grammar = self.grammars.matcher(params.structured_outputs)
            seq.think_state = ThinkState.initial(params)
        if params.allowed_token_ids is not None:
            seq.allowed_mask = token_mask(params.allowed_token_ids, self.config.vocab_size)
        if params.bad_words:
            seq.bad_word_ids = self._bad_word_ids(params.bad_words)
        seq.max_output_len = min(params.max_tokens, self.max_model_len - len(prompt_ids))
        seq.decoder = IncrementalDecoder(self.tokenizer, params.skip_special_tokens)
        if params.logprobs is not None or params.prompt_logprobs is not None:
            if params.logprobs is not None:
                seq.output_logprobs = []
            if params.prompt_logprobs is not None:
                seq.prompt_logprobs = [None]
            self._sync_requests.add(request_id)
        self.requests[request_id] = seq
        self.stats_prompt_tokens += len(prompt_ids)
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str) -> None:
        """Drop a request (client gone): its blocks are freed at once."""
        seq = self.requests.pop(request_id, None)
        self._sync_requests.discard(request_id)
        if seq is not None and not seq.finished:
            self.scheduler.finish(seq, "abort")

    def settle(self) -> None:
        """After a driver loop stopped between steps (Ctrl-C in LLM.generate, which aborts its requests):
        take the step in flight's results and drop what is left to render of requests no longer here, so
        the engine holds no work of theirs and the next caller's first step is its own."""
        if self._inflight is not None:
            self._collect_inflight()
        self._unrendered = [u for u in self._unrendered if u[0].request_id in self.requests]

    def discard_in_flight(self) -> None:
        """After a step raised part-way (LLM.generate, which aborts its requests): forget what was
        launched and not yet read, without waiting on it (a failed step is not waited on again), so
        the next step starts clean. Left in place, the stale step in flight made every later call
        fail ("TokenReadback: a third step's ids before the first was read")."""
        self._inflight = None
        self._unrendered = [u for u in self._unrendered if u[0].request_id in self.requests]
        self._drafting_decided = False
        self.runner.readback.reset()
        if hasattr(self.proposer, "discard"):
            self.proposer.discard()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or bool(self._unrendered) or self._inflight is not None

    # ---- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run and account one step; returns its outputs (text deltas, finished requests).

        A step's results are taken in two parts. Accepting the sampled token ids (stop tokens,
        max_tokens and the length limit end a sequence here) must finish before the next step is
        scheduled; rendering them (detokenising, stop strings, the outputs) need not. With
        overlap_outputs the rendering of step n runs after step n + 1 is launched, while the device
        works, and step() returns step n's outputs. A stop string found then ends the sequence one
        step late: its row in the step in flight is dropped, and the tokens are cut exactly where
        a synchronous engine would have stopped.

        With async_scheduling the step runs ahead instead (see _step_async): always without
        speculative decoding, and with it while the next step drafts for nobody (every sequence
        backing off, or disable_by_batch_size pausing it; _plain_ahead).
        """
        if self.async_scheduling and not self._sync_requests and (self.proposer is None or self._plain_ahead()):
            return self._step_async()
        if self._inflight is not None:  # async scheduling was just turned off, or drafting resumes:
            if self.proposer is not None:  # finish its step first, deciding the next step's drafting
                self._spec_paused = self._pause_speculation()  # where a synchronous step does: before
            self._collect_inflight()                           # its results come in
            outputs = self._render_unrendered()
            if self.proposer is not None:
                self._propose()
            return outputs
        prof = self.profiler
        if prof is not None:
            prof.begin()
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return self._render_unrendered()
        self._drafting_decided = False  # the last _propose's decision is this step's
        if prof is not None:
            prof.scheduled(sched.scheduled)
        # with early drafting, the results are copied behind the step, so collect() does not wait
        # for the drafting step launched after it
        handle = self.runner.launch(sched.scheduled, readback=self.early_drafts and not self._sync_requests)
        behind = False
        if self.proposer is not None:  # one decision for this step's drafting, early or late
            self._spec_paused = self._pause_speculation()
        if self.runner.draft_source is not None:
            self.proposer.resolve()  # the drafts' ids, while the device verifies them
            behind = self.early_drafts and self._draft_behind(sched.scheduled)
        earlier = self._render_unrendered() if self.overlap_outputs else []  # overlaps the device
        tokens = self.runner.collect(handle)
        if prof is not None:
            prof.executed()
        uses_hidden = self._drafter_reads_hidden()
        # (a DFlash drafter's context K/V was stored inside runner.launch: its after_forward)
        token_list = tokens.tolist()  # one conversion instead of an int() per sequence
        prompt_rows = self._prompt_rows(sched.scheduled) if self._sync_requests else []
        num_sampled = 0
        r = 0
        for item in sched.scheduled:
            seq = item.seq
            m = item.num_logits if item.samples else 0
            if seq.finished:  # a stop string found while this step ran: its row is dropped
                r += m
                continue
            seq.num_computed += item.num_new
            if item.samples:
                new = self._verify(item, tokens[r : r + m], r) if item.num_draft else [token_list[r]]
                if seq.output_logprobs is not None:  # token i of an accepted run came from row r + i
                    seq.new_logprobs = [token_logprob(self._logits_row(r + i), t, seq.params.logprobs)
                                        for i, t in enumerate(new)]
                r += m
            if seq.draft_ids:
                seq.draft_ids = []
            if uses_hidden:
                seq.draft_computed = seq.num_computed  # context K/V was stored for every computed row
            self._commit_blocks(seq)
            if item.samples:
                accepted, reason = self._accept_tokens(seq, new)
                num_sampled += len(accepted)
                self._unrendered.append((seq, accepted, reason))
        if prompt_rows:  # after the loop: it overwrites the logits rows the loop reads
            self._fill_prompt_logprobs(prompt_rows)
        drafts_first = self.runner.draft_source is not None
        if not drafts_first:
            outputs = earlier if self.overlap_outputs else self._render_unrendered()
        if self.proposer is not None:
            if prof is not None:
                prof.proposing()
            if behind:  # the drafting step is already on the device: give its drafts out
                self.proposer.settle(*self._draft_budgets())
                self._drafting_decided = True
            else:
                self._propose()
        if drafts_first:
            # the drafting step is on the device before this step's outputs are rendered
            # (detokenising, stop strings), so the host renders while the device drafts; a stop
            # string found here ends its sequence with its drafts unused (the next step skips it,
            # and the drafter's writes into its freed blocks are ordered before any reuse)
            outputs = earlier if self.overlap_outputs else self._render_unrendered()
        if prof is not None:
            prof.end(num_sampled)
        return outputs

    # ---- async scheduling -------------------------------------------------------------------
    def _step_async(self) -> list[RequestOutput]:
        """One step of async scheduling: schedule and launch step n + 1 while step n is still on
        the device, then accept step n's ids and render them while step n + 1 runs. Returns step
        n's outputs (the outputs come one call late, as with overlap_outputs).

        Step n + 1 is planned as if every sequence that samples in step n had already appended
        one token (Sequence.num_pending): a decode needs one KV slot at position num_tokens, and
        block allocation depends only on positions, never on token ids. The id itself is filled in
        on the device from step n's sampler output (runner: src_rows, fill_input_ids), and seeds
        and sample positions depend only on positions, so every row computes what the synchronous
        engine computes. A sequence that step n finishes (a stop token or string) has its row in
        step n + 1 dropped when that is collected; one whose limit (max_tokens, max_model_len) is
        reached by its token in flight is not scheduled at all.

        Falls back to the synchronous order (collect step n, then schedule) when step n + 1 might
        need to preempt: its victims' state would depend on ids not yet known. A speculative round
        never comes here (step() runs it synchronously: the accepted length is unknown), but the
        plain steps between rounds do (_plain_ahead): those of sequences backing off, and those
        disable_by_batch_size pauses.
        """
        prof = self.profiler
        if prof is not None:
            prof.begin()
        prev = self._inflight
        if prev is not None and not self._can_schedule_ahead():
            self._collect_inflight()  # synchronous point: the schedule needs step n's outcome
            prev = None
        sched = self.scheduler.schedule()
        if not sched.scheduled:  # nothing to launch (the run's last step is in flight, or nothing)
            if prev is None:
                return self._render_unrendered()
            if prof is not None:
                prof.scheduled([])
                prof.collecting()
            num_sampled = self._collect_inflight()
            if prof is not None:
                prof.executed()
            outputs = self._render_unrendered()
            if prof is not None:
                prof.end(num_sampled)
            return outputs
        assert not sched.preempted or prev is None, "_can_schedule_ahead let a preemption through"
        if prof is not None:
            prof.scheduled(sched.scheduled)
        # a step whose logits depend on ids not on the host yet (penalties, a grammar) launches its
        # forward now and its changes and sampler once step n's ids are accepted, below
        defer = any(item.seq.params.needs_history for item in sched.scheduled)
        # the next step() launches step n + 2 (its upload copies these ids) before collecting this one
        handle = self.runner.launch(sched.scheduled, readback=BEHIND_NEXT, defer_sampling=defer)
        # what the step will have done once it completes, recorded now (the next schedule plans on it)
        uses_hidden = self._drafter_reads_hidden()
        r = 0
        for item in sched.scheduled:
            seq = item.seq
            seq.num_computed += item.num_new
            if uses_hidden:
                seq.draft_computed = seq.num_computed  # the launch stores context K/V for every row
            if item.samples:
                seq.num_pending += 1
                seq.pending_row = r  # where the next step's fill finds this token
                r += 1
        if self.proposer is not None:
            self._count_plain_step(sched.scheduled)
        if prev is not None:
            self.num_pipelined_steps += 1
            if prof is not None:
                prof.collecting()
        self._inflight = _Inflight(sched.scheduled, handle)
        num_sampled = self._collect(prev) if prev is not None else 0
        if defer:  # the matchers have consumed step n's ids and the penalties see them
            self._inflight.handle = self.runner.finish_sampling(handle)
        if prof is not None:
            prof.executed()
        outputs = self._render_unrendered()  # step n's text, while step n + 1 runs
        if prof is not None:
            prof.end(num_sampled)
        return outputs

    def _can_schedule_ahead(self) -> bool:
        """Whether the next schedule surely preempts nobody, with the step in flight unaccepted:
        the blocks every running sequence could need for all its remaining tokens fit the pool
        (admission of waiting sequences never preempts)."""
        bm = self.block_manager
        need = 0
        for seq in self.scheduler.running:
            if not (seq.num_pending and len(seq.output_ids) + seq.num_pending >= seq.max_output_len):
                need += bm.blocks_needed(seq, seq.num_tokens)
        return need <= bm.num_free

    def _collect_inflight(self) -> int:
        step, self._inflight = self._inflight, None
        return self._collect(step)

    def _collect(self, step: _Inflight) -> int:
        """Wait for a step launched by _step_async (only it: later steps keep running) and accept
        its ids; returns how many were appended. The rendering is left to the caller.

        Blocks freed here (a sequence that ends) may still be written by a step launched after
        this one (its dropped row) — harmless: the device runs steps in stream order, so any step
        that reuses the blocks is launched, and runs, after that write. Full blocks are committed
        to the prefix cache here, once their ids are known; the KV of the last of them may still
        be in the making on the device, but a sequence can only hit it in a later step.
        """
        tokens = self.runner.collect(step.handle).tolist()
        num_sampled = 0
        r = 0
        for item in step.scheduled:
            seq = item.seq
            if seq.finished:  # ended while this step ran (stop token/string, abort): row dropped
                r += item.samples
                continue
            if not item.samples:
                self._commit_blocks(seq)
                continue
            seq.num_pending -= 1
            tok = tokens[r]
            r += 1
            self._commit_blocks(seq)
            accepted, reason = self._accept_tokens(seq, [tok])
            num_sampled += len(accepted)
            self._unrendered.append((seq, accepted, reason))
        return num_sampled

    def _verify(self, item: ScheduledSeq, row_tokens: np.ndarray, r: int) -> list[int]:
        """Keep the accepted prefix of seq's drafts and the token of the first row past it (the
        correction, or the bonus token when all k are accepted); roll the KV back behind it.

        The accept/reject decisions were taken on the device by the sampler (greedy: draft ==
        argmax; sampling: rejection sampling against the draft's q, or one-hot), see sampler.sample.
        """
        seq, k = item.seq, item.num_draft
        flags = self.runner.last_accepted[r : r + k]
        accepted = 0
        while accepted < k and flags[accepted]:
            accepted += 1
        new = seq.draft_ids[:accepted] + [int(row_tokens[accepted])]
        self.spec_stats.record(k, accepted)
        self._track_backoff(seq, accepted)
        seq.num_computed = item.start + 1 + accepted  # the last token and the accepted drafts
        seq.draft_computed = min(seq.draft_computed, seq.num_computed)
        self.block_manager.truncate(seq, seq.num_computed)
        return new

    def _draft_behind(self, scheduled: list[ScheduledSeq]) -> bool:
        """Launch the next drafting step now, right behind the verification step just launched,
        for every sequence this step leaves decoding; each block's start (which depends on how
        many drafts are accepted) is worked out on the device (proposer.propose_behind). Each
        sequence's blocks are first made to cover its block wherever it starts. Returns False,
        launching nothing, where that cannot cover the next step (then _propose drafts after the
        step's results, as without early drafting): a decoding sequence outside this step, a
        request whose logits are adjusted or scored, or too few free blocks."""
        if self._sync_requests or self._spec_paused:
            return False
        if all(item.seq.spec_skip > 0 for item in scheduled):  # every sequence backs off next step
            return False
        seqs, bases, rows, drafts = [], [], [], []
        r = 0
        for item in scheduled:
            seq = item.seq
            if seq.params.adjusts_logits or item.all_logits:
                return False
            m = item.num_logits if item.samples else 0
            if m and not seq.finished:  # it decodes next step from position base + accepted drafts
                seqs.append(seq)
                bases.append(item.start + item.num_new - item.num_draft)
                rows.append(r if item.num_draft else r + m - 1)
                drafts.append(item.num_draft)
            r += m
        stepping = {id(s) for s in seqs}
        if not seqs or any(id(s) not in stepping and s.num_computed == s.num_tokens - 1 and not s.finished
                           for s in self.scheduler.running):
            return False
        # a block of block_size rows from base + accepted, at most base + drafts (capped where the
        # sequence's length limit ends it first: the device then clamps the start to its table)
        width = self.proposer.block
        need = [min(b + k + width, self.max_model_len + self.lookahead) for b, k in zip(bases, drafts)]
        if sum(self.block_manager.blocks_needed(s, n) for s, n in zip(seqs, need)) > self.block_manager.num_free:
            return False
        for s, n in zip(seqs, need):
            self.block_manager.allocate(s, n)
        d = self.runner.buf.dev
        self.proposer.propose_behind(seqs, bases, rows, drafts, d["out_tokens"], d["out_accepted"])
        self.drafted_behind += 1
        return True

    def _propose(self) -> None:
        """Draft for every running sequence that decodes next step, within its limits and the pool."""
        seqs, ks = self._draft_budgets()
        self._drafting_decided = True  # the next step's drafts and backoff counts are settled
        if not seqs:
            return
        if self.runner.draft_source is not None:
            # launched without waiting: the next verification step takes the drafts on the device,
            # unless a penalty needs their ids on the host while that step is prepared
            defer = not any(s.params.adjusts_logits for s in seqs)
            self.proposer.propose(seqs, ks, defer=defer)
        else:
            self.proposer.propose(seqs, ks)

    def _track_backoff(self, seq: Sequence, accepted: int) -> None:
        """backoff_after: count the rounds in a row that accepted nothing; from the backoff_after-th
        on, each such round (the probes) sends the sequence to plain steps for 1, 2, 4, ... up to
        backoff_max_steps steps; a round that accepts a draft ends the backoff."""
        after = self.spec.backoff_after
        if after is None:
            return
        if accepted:
            seq.spec_misses = seq.spec_skip = 0
            return
        seq.spec_misses += 1
        if seq.spec_misses >= after:
            seq.spec_skip = min(self.spec.backoff_max_steps, 2 ** (seq.spec_misses - after))

    def _drafter_reads_hidden(self) -> bool:
        """A DFlash drafter: each target step stores its context K/V (runner.after_forward), so a
        computed row is computed for the drafter too."""
        return self.proposer is not None and getattr(self.proposer, "uses_target_hidden", False)

    def _commit_blocks(self, seq: Sequence) -> None:
        """Register seq's completed full blocks in the prefix cache; with a drafter keeping KV in the
        same blocks, only those both models have computed."""
        drafter_kv = self.proposer is not None and self.proposer.needs_kv
        self.block_manager.commit_full_blocks(seq, seq.draft_computed if drafter_kv else None)

    def _plain_ahead(self) -> bool:
        """With a drafter: whether the next step drafts for nobody, so it may be scheduled and
        launched before the step in flight is accepted (_step_async). It does when speculation is
        paused by the batch's size, or when every running sequence is backing off with a plain
        step still to go and none waits; not when drafts were proposed for it. A sequence that
        would draft (a probe round, a new sequence) ends the run-ahead: step() collects the step
        in flight, drafts, and verifies synchronously."""
        running = self.scheduler.running
        if any(s.draft_ids for s in running):
            return False
        # decided on the sequences of the step in flight, as a synchronous engine decides right after
        # launching it (admitting more keeps it paused)
        self._ahead_paused = self._batch_pauses()
        if self._ahead_paused:
            return True
        # a waiting sequence would draft right after its prefill
        return bool(running) and not self.scheduler.waiting and all(s.spec_skip > 0 for s in running)

    def _count_plain_step(self, scheduled: list[ScheduledSeq]) -> None:
        """A plain step of a speculative engine scheduled ahead: one paused step, or one of each
        backing-off sequence's plain steps (as _draft_budgets counts them in a synchronous step),
        unless the last _propose already decided this step."""
        if self._drafting_decided:
            self._drafting_decided = False
            return
        if self._ahead_paused:
            self.spec_stats.paused_steps += 1
            return
        for item in scheduled:
            if item.decode and item.seq.spec_skip > 0:
                item.seq.spec_skip -= 1
                self.spec_stats.backoff_steps += 1

    def _pause_speculation(self) -> bool:
        """vLLM's disable_by_batch_size: no drafts for the next step while at least that many
        sequences run. Each sequence then decodes plainly; a drafter keeps its context current (DFlash
        through every target step, a draft model by catching up when drafting resumes)."""
        paused = self._batch_pauses()
        if paused:
            self.spec_stats.paused_steps += 1
        return paused

    def _batch_pauses(self) -> bool:
        """disable_by_batch_size's test on the running sequences (no count; _pause_speculation counts)."""
        limit = self.spec.disable_by_batch_size
        return limit is not None and len(self.scheduler.running) >= limit

    def _draft_budgets(self) -> tuple[list[Sequence], list[int]]:
        """Every running sequence that decodes next step and how many drafts it may verify there
        (within its length and max_tokens limits and the pool), with the blocks for them."""
        seqs, ks = [], []
        for seq in self.scheduler.running:
            if seq.num_computed != seq.num_tokens - 1:
                continue  # still prefilling
            # A step that ran this sequence without its drafts (too little budget left) or not at all
            # (a higher-priority prefill took the budget) never verified them, so _verify never rolled
            # the drafter back: its KV past num_computed holds drafts, not tokens. Left ahead, a draft
            # model skipped the catch-up that yields its first draft and crashed on the empty draft list.
            seq.draft_computed = min(seq.draft_computed, seq.num_computed)
            k = 0 if self._spec_paused else min(self.num_speculative_tokens, self.max_model_len - seq.num_tokens,
                                                seq.params.max_tokens - len(seq.output_ids))
            if k > 0 and seq.spec_skip > 0:  # backing off: a plain step
                seq.spec_skip -= 1
                self.spec_stats.backoff_steps += 1
                k = 0
            # the target writes KV up to position num_tokens + k - 1, a drafter up to its lookahead
            while k > 0 and not self.block_manager.can_allocate(seq, seq.num_tokens + max(k, self.lookahead)):
                k -= 1
            if k > 0:
                self.block_manager.allocate(seq, seq.num_tokens + max(k, self.lookahead))
            seqs.append(seq)
            ks.append(max(k, 0))
        return seqs, ks

    def _accept_tokens(self, seq: Sequence, new: list[int]) -> tuple[list[int], str | None]:
        """Append sampled token ids one by one, stopping exactly where plain decoding would on a stop
        token, max_tokens or max_model_len, even inside an accepted speculative run (stop strings
        are the renderer's: they need the text). A sequence that ends is retired at once, so the
        next step never schedules it. Returns (the appended ids, the finish reason or None).

        A structured output whose matcher failed (a limit of llguidance's hit while this step's mask
        was computed, or a token it refused) ends with reason "error" and seq.error: a step whose
        mask failed has all its ids dropped (the failed row allows EOS alone, and a speculative
        step's rows cannot be told apart once the matcher failed), a refused id is dropped, so the
        output keeps a prefix the constraint accepted."""
        p = seq.params
        out_ids = seq.output_ids
        accepted: list[int] = []
        reason = None
        eos_ids = () if p.ignore_eos else self.eos_ids
        max_tokens = min(p.max_tokens, self.max_model_len - len(seq.prompt_ids))  # either limit
        g = seq.grammar
        for tok in new:
            if g is not None and seq.think_state != ThinkState.THINKING and g.is_error():
                # this step's mask failed: tok was sampled from EOS alone
                reason = self._grammar_failed(seq, tok)
                break
            out_ids.append(tok)
            accepted.append(tok)
            n_out = len(out_ids)
            if n_out >= p.min_tokens and (tok in eos_ids or tok in p.stop_token_ids):
                reason = "stop"  # the stop token is returned in token_ids but is not text
                seq.stop_reason = None if tok in eos_ids else tok  # as vLLM: EOS names no stop
                break
            # a constraint completed by the last token max_tokens allows ends as "stop": the output is whole
            consume = g is not None
            if consume and seq.think_state is not None:  # a thinking model's own tokens, up to </think>
                seq.think_state, consume = ThinkState.after(seq.think_state, tok, p.think_token_ids)
            if consume:
                if not g.consume_token(tok) or g.is_error():  # refused: never expected, the mask allowed it
                    out_ids.pop()
                    accepted.pop()
                    reason = self._grammar_failed(seq, tok)
                    break
                if g.is_stopped():  # nothing but EOS could follow: the output ends here, as one EOS later
                    reason = "stop"
                    seq.ended_by_grammar = True
                    break
            if n_out >= max_tokens:
                reason = "length"
                break
        self.stats_generation_tokens += len(accepted)
        if seq.output_logprobs is not None:  # the step computed them for its ids (_logits_row)
            seq.output_logprobs.extend(seq.new_logprobs[: len(accepted)])
            seq.new_logprobs = []
        if reason is not None:
            self.scheduler.finish(seq, reason)
        return accepted, reason

    @staticmethod
    def _grammar_failed(seq: Sequence, tok: int) -> str:
        """Record why seq's structured output failed (its matcher's error) and return the reason."""
        seq.error = matcher_error(seq.grammar) or "structured output failed mid-output: the matcher stopped"
        log.error("request %s: %s (at output token %d, sampled id %d); ending it with finish reason 'error'",
                  seq.request_id, seq.error, len(seq.output_ids), tok)
        return "error"

    def _prompt_rows(self, scheduled: list[ScheduledSeq]) -> list[tuple[Sequence, int, int, int]]:
        """(seq, step row of position lo, lo, hi) for each sequence of the step whose prompt
        logprobs need the logits of its positions [lo, hi) computed by this step (position p
        predicts prompt token p + 1; positions done before, e.g. recomputed after a preemption,
        are skipped). Taken before the step's outputs are accepted: a request that ends in this
        step (max_tokens 1) still gets its prompt's."""
        rows = []
        t = 0
        for item in scheduled:
            seq = item.seq
            plp = seq.prompt_logprobs
            if plp is not None and not seq.finished:
                lo = max(item.start, len(plp) - 1)
                hi = min(item.start + item.num_new, seq.num_prompt_tokens - 1)
                if lo < hi:
                    rows.append((seq, t + lo - item.start, lo, hi))
            t += item.num_new
        return rows

    def _fill_prompt_logprobs(self, rows: list[tuple[Sequence, int, int, int]]) -> None:
        """Extend each sequence's prompt logprobs with those of its rows in the step just run
        (engine/logprobs.py: the LM head over those rows, in slices of the logits buffer). A request
        that needs synchronous steps only for them runs asynchronously again once they are complete."""
        for seq, row, lo, hi in rows:
            p = seq.params
            seq.prompt_logprobs.extend(prompt_logprobs(self.runner, row, seq.prompt_ids[lo + 1 : hi + 1],
                                                       p.prompt_logprobs))
            if len(seq.prompt_logprobs) == seq.num_prompt_tokens and p.logprobs is None:
                self._sync_requests.discard(seq.request_id)

    def _logits_row(self, r: int) -> np.ndarray:
        """Row r of the last step's logits on the host (float32 [vocab]): read after the step's ids
        arrived and before another step is launched (logprob requests keep steps synchronous)."""
        return self.backend.to_host(self.runner.ws.logits[r : r + 1])[0]

    def _render_unrendered(self) -> list[RequestOutput]:
        outputs = [self._render(seq, accepted, reason) for seq, accepted, reason in self._unrendered]
        self._unrendered = []
        return outputs

    def _render(self, seq: Sequence, accepted: list[int], reason: str | None) -> RequestOutput:
        """Detokenise the ids _accept_tokens appended, end the sequence on a stop string (cutting
        the text before it and the ids after the token that completed it, as plain decoding
        would have stopped there), and return the text delta to stream."""
        p = seq.params
        longest_stop = max(len(s) for s in p.stop) if p.stop else 0
        n0 = len(seq.output_ids) - len(accepted)  # output tokens before these
        # a stop token is not text (unless include_stop_str_in_output asks for it, as vLLM's detokenizer
        # does: EOS then still vanishes with skip_special_tokens); a structured output's last token is
        stop_token = reason == "stop" and not seq.ended_by_grammar and not p.include_stop_str_in_output
        text_ids = accepted[:-1] if stop_token else accepted
        # seq.text is the text's end, after seq.text_head (offsets below are into it; sent_text_len is whole)
        head = len(seq.text_head)
        # a finished sequence's last step lets out what the decoder still holds (an incomplete
        # character, as U+FFFD: the decode of all its ids ends so too), checked for stop strings as well
        steps = len(text_ids) + (reason is not None)
        for i in range(steps):
            before = len(seq.text)
            flushing = i == len(text_ids)
            seq.text += seq.decoder.flush() if flushing else seq.decoder.push([text_ids[i]])
            n = len(accepted) if flushing else i + 1  # these ids made the text so far
            # as vLLM's detokenizer: stop strings are looked for once more than min_tokens ids are out
            if p.stop and n0 + n > p.min_tokens and len(seq.text) > before:
                found = self._find_stop(seq.text, p.stop, before)
                if found is not None:  # the text ends before the stop string, or after it if asked
                    seq.stop_reason = seq.text[found[0] : found[1]]
                    seq.text = seq.text[: found[1] if p.include_stop_str_in_output else found[0]]
                    dropped = len(accepted) - n
                    if dropped:  # later ids of an accepted run: plain decoding never made them
                        del seq.output_ids[n0 + n :]
                        if seq.output_logprobs is not None:
                            del seq.output_logprobs[n0 + n :]
                        accepted = accepted[:n]
                        self.stats_generation_tokens -= dropped
                    if seq.finished:
                        seq.finish_reason = "stop"  # the string came first (e.g. at max_tokens)
                    else:
                        self.scheduler.finish(seq, "stop")
                    reason = "stop"
                    break
        if reason is not None:
            self.requests.pop(seq.request_id, None)
            self._sync_requests.discard(seq.request_id)
            hold = 0
        else:
            hold = longest_stop - 1 if longest_stop else 0  # may be the start of a stop string
        end = max(seq.sent_text_len, head + len(seq.text) - hold)
        delta = seq.text[seq.sent_text_len - head : end - head]
        seq.sent_text_len = end
        logprobs = None if seq.output_logprobs is None else seq.output_logprobs[n0 : n0 + len(accepted)]
        out = RequestOutput(seq.request_id, accepted, delta, seq.output_ids, len(seq.output_ids), seq.text_head,
                            seq.text, len(seq.prompt_ids), reason is not None, reason,
                            stop_reason=seq.stop_reason if reason == "stop" else None, new_logprobs=logprobs,
                            prompt_logprobs=seq.prompt_logprobs if n0 == 0 else None,
                            error=seq.error if reason == "error" else None,
                            queued_s=seq.first_scheduled_at - seq.added_at
                            if n0 == 0 and seq.first_scheduled_at is not None else None,
                            num_cached_tokens=seq.num_cached_tokens if n0 == 0 else None)
        if len(seq.text) > TEXT_FOLD and reason is None:
            # A str grown with += is copied whole on every append (CPython appends in place only to
            # a local variable): an output of n tokens cost O(n^2) here, ~28 us a token at 100k
            # tokens. So the text's end moves into its head once past TEXT_FOLD characters, keeping
            # what a stop string or the held-back delta can still reach; the head is copied once
            # every ~TEXT_FOLD characters, and the appends above copy only the end.
            cut = len(seq.text) - max(longest_stop, TEXT_FOLD // 4)
            if cut > 0:
                seq.text_head, seq.text = seq.text_head + seq.text[:cut], seq.text[cut:]
        return out

    @staticmethod
    def _find_stop(text: str, stops: list[str], before: int = 0) -> tuple[int, int] | None:
        """(start, end) of the stop string ending past text[:before] (the text new since) that ends first,
        as text arriving one character at a time would meet it, however it is split into tokens; of two
        ending together, the one that starts first (the longer). Each string is looked for only where it
        would end in the new text, as vLLM's check_stop_strings does: one lying wholly in text[:before] is
        not matched (under min_tokens that text was never searched, and a window as wide as the longest
        stop string matched shorter ones there, so an unrelated longer stop string changed the output)."""
        found = [(i, i + len(s)) for i, s in ((text.find(s, max(0, before - len(s) + 1)), s) for s in stops)
                 if i >= 0]
        return min(found, key=lambda f: (f[1], f[0])) if found else None

    def score(self, prompts: list[list[int]], last_only: bool = False) -> list[np.ndarray]:
        """Logits [len, vocab] at every position of each prompt, run as one batch (no sampling);
        last_only: [1, vocab], the last position's (the next token's), so longer prompts fit.

        Used to check the model against other implementations; the prompts must fit one step.
        """
        if self.scheduler.has_work():
            raise RuntimeError("score() runs on an idle engine")
        rows = len(prompts) if last_only else sum(len(p) for p in prompts)
        if sum(len(p) for p in prompts) > self.max_num_batched_tokens or rows > self.runner.max_logits:
            raise ValueError("the prompts do not fit in one step's token and logits budget")
        seqs = [Sequence(f"score-{i}", p, SamplingParams(), 0) for i, p in enumerate(prompts)]
        batch = []
        for seq in seqs:
            self.validate_prompt(seq.prompt_ids, SamplingParams(max_tokens=1))
            if not self.block_manager.can_allocate(seq, seq.num_tokens):
                raise ValueError("the prompts do not fit in the KV pool at once")
            self.block_manager.allocate(seq, seq.num_tokens)
            batch.append(ScheduledSeq(seq, seq.num_tokens, all_logits=not last_only))
        try:
            logits = self.runner.execute(batch, sample=False)
        finally:
            for seq in seqs:
                self.block_manager.free_sequence(seq)
        bounds = np.cumsum([0] + [1 if last_only else len(p) for p in prompts])
        return [logits[bounds[i] : bounds[i + 1]] for i in range(len(prompts))]

    # ---- observability --------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
            blocks_total=bm.num_blocks, blocks_used=bm.num_used, blocks_free=len(bm.free),
            blocks_cached=bm.num_cached, preemptions=self.scheduler.num_preemptions,
            prefix_cache_hit_rate=bm.hit_rate, prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits, prompt_tokens=self.stats_prompt_tokens,
            generation_tokens=self.stats_generation_tokens, spec=self.spec_stats.as_dict(),
        )
