"""LLM: the offline API, shaped like vLLM's and nano-vllm's."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields

import jinja2
import numpy as np

from minillm.args import EngineArgs
from minillm.engine.engine import LLMEngine
from minillm.engine.logprobs import TokenLogprob
from minillm.models.tokenizer import content_text
from minillm.sampling_params import SamplingParams

# what Tokenizer.apply_chat_template renders with already (and the template's globals): not
# chat_template_kwargs keys (the server's protocol.py refuses the same)
TEMPLATE_RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                     "strftime_now")


@dataclass
class CompletionOutput:
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None  # the stop string or stop_token_ids id that ended it (vLLM's)
    logprobs: list[TokenLogprob] | None = None  # one per token id, with SamplingParams.logprobs
    # with SamplingParams.prompt_logprobs: one per prompt token id, None for the first
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # finish_reason "error": the structured output's matcher failed mid-output (a limit of
    # llguidance's, or a refused token); text and token_ids hold what it accepted before. The other
    # prompts of the batch run on unaffected.
    error: str | None = None
    index: int = 0  # which of the prompt's SamplingParams.n samples this is (vLLM's CompletionOutput.index)
    prompt: str | None = None  # the prompt's text (chat: as the template rendered it); None for token ids
    # with SamplingParams.logprobs: the sum of the output tokens' logprobs (vLLM's); else None
    cumulative_logprob: float | None = None
    num_cached_tokens: int | None = None  # prompt tokens the prefix cache held (vLLM's RequestOutput field)

    @property
    def outputs(self) -> list[CompletionOutput]:
        """The prompt's SamplingParams.n samples in order (vLLM's RequestOutput.outputs, so out.outputs[0].text
        reads as there): this one, then the others generate() keeps on the prompt's result (its sample 0).
        Not a field, and the result does not hold itself: asdict, repr and json.dumps(default=vars) would
        recurse."""
        return [self, *self.__dict__.get("_others", ())]

    def __eq__(self, other) -> bool:  # every sample's fields, not only this one's (outputs is not a field)
        if other.__class__ is not self.__class__:
            return NotImplemented
        return [_values(c) for c in self.outputs] == [_values(c) for c in other.outputs]

    __hash__ = None  # (mutable, as the dataclass's own eq makes it)


def _values(out: CompletionOutput) -> tuple:
    return tuple(getattr(out, f.name) for f in fields(out))


class LLM:
    """`LLM(model=None, **engine_args)`: keyword names are the CLI flags in snake_case."""

    def __init__(self, model: str | None = None, **engine_args):
        args = EngineArgs(model=model, **engine_args)
        self.engine = LLMEngine(args)
        if args.async_scheduling is None:  # offline, nobody waits on a step: run the device ahead
            self.engine.async_scheduling = True
        self.tokenizer = self.engine.tokenizer

    def get_tokenizer(self):
        """The model's tokenizer (vLLM's method; also `llm.tokenizer`): encode, decode, apply_chat_template."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() and chat() use when given none (vLLM's method): SamplingParams' defaults with
        the model's generation_config sampling defaults on top (--generation-config: auto, vllm or a folder)."""
        return SamplingParams(**self.engine.generation_defaults)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 priority: list[int] | None = None, *, use_tqdm: bool | Callable = False,
                 lora_request=None) -> list[CompletionOutput]:
        """Generate for a prompt or a list of prompts (strings, token-id lists, or vLLM's {"prompt": text}
        and {"prompt_token_ids": ids} dicts), batched; without sampling_params,
        get_default_sampling_params(). priority (vLLM's): one integer a prompt, lower first, with
        scheduling_policy="priority". use_tqdm (vLLM's; off here by default): a progress bar over the
        prompts on stderr (tqdm's where it is installed, or a callable that makes one as tqdm does).
        lora_request: refused unless None (no LoRA adapters). One CompletionOutput a prompt: its first sample,
        whose outputs list all SamplingParams.n of them."""
        progress = _progress_factory(use_tqdm)
        _refuse_lora(lora_request)
        if isinstance(prompts, np.ndarray):
            prompts = prompts.tolist()
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                and isinstance(prompts[0], (int, np.integer))):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError("prompts must be a string, a list of token ids, or a list of either; got "
                             f"{type(prompts).__name__}")
        params = self.get_default_sampling_params() if sampling_params is None else sampling_params
        if isinstance(params, tuple):  # a sequence of them, as vLLM takes
            params = list(params)
        if not isinstance(params, list):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        if not all(isinstance(p, SamplingParams) for p in params):
            raise ValueError("sampling_params must be a SamplingParams or a list of them, one per prompt")
        engine = self.engine
        if priority is None:
            priority = [0] * len(prompts)
        if not isinstance(priority, (list, tuple)) or len(priority) != len(prompts):
            raise ValueError(f"priority must be a list of one integer a prompt ({len(prompts)}), got {priority!r}")
        for p in priority:
            engine.check_priority(p)
        def refused(i: int, e: ValueError) -> ValueError:  # prompt i's error, named when there are several
            return ValueError(f"prompt {i}: {e}" if len(prompts) > 1 else str(e))

        ids = []  # every sample's request id, prompt by prompt
        prompt_ids = []
        texts = []  # each prompt's text as given (None for token ids): the results' prompt
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            try:
                p.validate()  # fields set by hand after construction (n is read here, not by the engine)
                given = _unwrap(prompt)
                texts.append(given if isinstance(given, str) else None)
                toks = engine.encode_prompt(given, p)  # truncated as p.truncate_prompt_tokens asks
                engine.validate_prompt(toks, p)  # all-or-nothing: check every prompt before adding any
            except ValueError as e:
                raise refused(i, e) from None
            prompt_ids.append(toks)
        done: dict[str, CompletionOutput] = {}
        cached: dict[str, int] = {}
        owner: dict[str, int] = {}  # each request id's prompt
        left = [p.n for p in params]  # a prompt is processed once all its samples are
        logprobs: dict[str, list[TokenLogprob]] = {}
        prompt_logprobs: dict[str, list] = {}
        # offline, nobody reads a step's text at once: render it while the next step runs
        engine.overlap_outputs = True
        bar = None
        try:
            # inside the try: a request refused when added (a structured-output constraint that does not
            # compile is found only there) takes the ones added before it out again
            for i, (toks, p, prio) in enumerate(zip(prompt_ids, params, priority)):
                for k in range(p.n):  # each sample its own request (sample_params seeds them apart)
                    # the id is ours before the request is added: a Ctrl-C as add_request returns aborts it too
                    rid = uuid.uuid4().hex
                    ids.append(rid)
                    owner[rid] = i
                    try:
                        engine.add_request(toks, p.sample_params(k), request_id=rid, priority=prio)
                    except ValueError as e:
                        raise refused(i, e) from None
            bar = progress(total=len(prompts), desc="Processed prompts") if progress is not None else None
            while engine.has_unfinished():
                for out in engine.step():
                    if out.request_id not in owner:  # one added to the engine by another caller: not ours
                        continue
                    if out.new_logprobs is not None:
                        logprobs.setdefault(out.request_id, []).extend(out.new_logprobs)
                    if out.prompt_logprobs is not None:
                        prompt_logprobs[out.request_id] = out.prompt_logprobs
                    if out.num_cached_tokens is not None:
                        cached[out.request_id] = out.num_cached_tokens
                    if out.finished:
                        lps = logprobs.pop(out.request_id, None)
                        done[out.request_id] = CompletionOutput(
                            [], out.text, out.token_ids, out.finish_reason, out.stop_reason, lps,
                            prompt_logprobs.pop(out.request_id, None), out.error,
                            cumulative_logprob=None if lps is None else float(sum(lp.logprob for lp in lps)),
                            num_cached_tokens=cached.pop(out.request_id, None))
                        left[owner[out.request_id]] -= 1
                        if bar is not None and not left[owner[out.request_id]]:
                            bar.update(1)
        except BaseException as e:  # Ctrl-C or a failure: leave none of ours for the next call to run first
            for rid in ids:
                engine.abort_request(rid)
            if isinstance(e, KeyboardInterrupt):  # the step in flight finishes on the device (a failed step is
                engine.settle()                   # the failure's to report, not waited on again)
            # what is left launched and unread (all of it after a failure; after Ctrl-C inside a step,
            # a readback or drafting step it stopped) is dropped: the next call starts clean
            engine.discard_in_flight()
            raise
        finally:
            engine.overlap_outputs = False
            if bar is not None:
                bar.close()
        results = []
        samples = iter(ids)
        for text, toks, p in zip(texts, prompt_ids, params):
            outs = [done[next(samples)] for _ in range(p.n)]
            for k, c in enumerate(outs):
                c.prompt_token_ids, c.index, c.prompt = toks, k, text
            outs[0]._others = outs[1:]
            results.append(outs[0])
        return results

    def chat(self, messages, sampling_params: SamplingParams | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None, continue_final_message: bool = False,
             tools: list[dict] | None = None, *, use_tqdm: bool | Callable = False,
             lora_request=None) -> list[CompletionOutput]:
        """Chat through the model's template: one conversation (a list of dicts) or a list of them;
        chat_template_kwargs are extra template variables (Qwen3's {"enable_thinking": False}),
        continue_final_message leaves the last message open for the model to continue (no generation
        prompt), and tools (OpenAI's {"type": "function", "function": {...}} list, checked as the
        server checks it) go to the template as its `tools`, as in vLLM's LLM.chat. The output is
        the model's text: reading calls from it is the caller's (minillm.server.tools has parsers).
        use_tqdm and lora_request as generate's."""
        _progress_factory(use_tqdm)  # checked before the conversations are rendered
        _refuse_lora(lora_request)
        if not isinstance(messages, list):
            raise ValueError("messages must be a list of {'role', 'content'} dicts (one conversation) or a list "
                             f"of such lists; got {type(messages).__name__}")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        convs = [_conversation(conv, i) for i, conv in enumerate(convs)]
        # a truthy string such as "false" would otherwise switch them on
        for name, v in (("add_generation_prompt", add_generation_prompt),
                        ("continue_final_message", continue_final_message)):
            if not isinstance(v, bool):
                raise ValueError(f"{name} must be True or False, got {v!r}")
        if not isinstance(chat_template_kwargs, (dict, type(None))):
            raise ValueError(f"chat_template_kwargs must be a dict, got {type(chat_template_kwargs).__name__}")
        for k in chat_template_kwargs or ():  # (the template's own inputs were a TypeError from the render call)
            if not (isinstance(k, str) and k.isidentifier()) or k in TEMPLATE_RESERVED:
                raise ValueError(f"chat_template_kwargs key {k!r} is not allowed: keys are template variable names "
                                 f"other than {', '.join(TEMPLATE_RESERVED)} (the template gets those already)")
        if tools is not None:
            from minillm.server.tools import ToolError, parse_tools  # (the server package imports Quart)

            try:
                checked = parse_tools({"tools": tools})
            except ToolError as e:
                raise ValueError(e.message) from None
            if checked:
                chat_template_kwargs = {**(chat_template_kwargs or {}), "tools": checked}
        prompts = []
        for i, m in enumerate(convs):
            which = f"conversation {i}: " if len(convs) > 1 else ""
            try:
                prompts.append(self.tokenizer.encode_chat(m, add_generation_prompt,
                                                          template_kwargs=chat_template_kwargs,
                                                          continue_final_message=continue_final_message))
            except ValueError as e:  # no chat template, nothing to continue
                raise ValueError(f"{which}{e}") from None
            except (jinja2.TemplateError, TypeError) as e:  # its raise_exception, a field it lacks, ...
                raise ValueError(f"{which}the chat template refused the messages ({type(e).__name__}: {e})") from None
        outs = self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
        for out, ids in zip(outs, prompts):  # the template's text (before truncate_prompt_tokens), as vLLM's
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            for c in out.outputs:
                c.prompt = text
        return outs


def _progress_factory(use_tqdm) -> Callable | None:
    """What makes generate()'s progress bar: None for no bar; True: tqdm's, or minillm's own line on
    stderr where tqdm is not installed (it is not a dependency); a callable: that (vLLM takes a tqdm-like
    class too). It is called as tqdm is: (total=N, desc=...), then .update(1) a prompt and .close()."""
    if use_tqdm is False or use_tqdm is None:
        return None
    if use_tqdm is True:
        try:
            from tqdm import tqdm
        except ImportError:
            return _StderrProgress
        return tqdm
    if callable(use_tqdm):
        return use_tqdm
    raise ValueError(f"use_tqdm must be True, False or a callable that makes a progress bar; got {use_tqdm!r}")


class _StderrProgress:
    """use_tqdm=True without tqdm installed: 'Processed prompts: i/N' rewritten on one stderr line."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n = total, desc, 0
        self._show()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._show()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()

    def _show(self) -> None:
        sys.stderr.write(f"\r{self.desc}: {self.n}/{self.total}")
        sys.stderr.flush()


def _refuse_lora(lora_request) -> None:
    if lora_request is not None:
        raise ValueError("lora_request: minillm serves no LoRA adapters; merge the adapter into the model's "
                         "weights (peft's merge_and_unload) and load that folder")


def _unwrap(prompt):
    """vLLM's prompt dicts, TextPrompt {"prompt": text} and TokensPrompt {"prompt_token_ids": ids}, as
    the text or ids (they were refused as "got dict"); their other keys (multi_modal_data, ...) are
    refused, not dropped. Anything else as it is."""
    if not isinstance(prompt, dict):
        return prompt
    given = [k for k in ("prompt", "prompt_token_ids") if k in prompt]
    other = sorted(str(k) for k in prompt if k not in ("prompt", "prompt_token_ids"))
    if len(given) != 1 or other:
        raise ValueError("a prompt dict holds exactly one of 'prompt' (text) and 'prompt_token_ids' (vLLM's "
                         f"TextPrompt and TokensPrompt) and nothing else; got keys {sorted(map(str, prompt))}")
    value = prompt[given[0]]
    if (given[0] == "prompt") != isinstance(value, str):  # ids given as text would be tokenized
        want = "a string" if given[0] == "prompt" else "a list of token ids"
        raise ValueError(f"a prompt dict's {given[0]!r} must be {want}; got {type(value).__name__}")
    return value


def _conversation(conv, i: int) -> list[dict]:
    """Conversation i as the chat template renders it: each message's content a string (text parts
    joined as the server joins them, tokenizer.content_text; an assistant's null as ""). A ValueError
    names what is wrong, where the template would fail with a bare TypeError or UndefinedError."""
    if not isinstance(conv, list) or not conv:
        raise ValueError(f"conversation {i} must be a non-empty list of message dicts")
    out = []
    for j, m in enumerate(conv):
        where = f"conversation {i}, message {j}"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{where}: a message is a dict with a string 'role' and its 'content'")
        c = m.get("content")
        text = "" if c is None and m["role"] == "assistant" else content_text(c)
        if text is None:
            raise ValueError(f"{where}: 'content' must be a string or a list of text parts "
                             "({'type': 'text', 'text': ...}); got " + type(c).__name__)
        out.append({**m, "content": text})
    return out
