"""python -m minillm.generate [MODEL] --prompt TEXT [--chat] ...: one completion from the command line."""

from __future__ import annotations

import json
import os
import sys
import time

from minillm.args import STARTUP_ERRORS, CliParser, EngineArgs, add_engine_args


def main(argv: list[str] | None = None) -> int:
    p = CliParser(prog="python -m minillm.generate", description=__doc__)
    add_engine_args(p)
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text; repeat the flag for several prompts, run batched")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--min-p", type=float, default=0.0, help="vLLM's min_p: keep tokens with p >= MIN_P x the top p")
    p.add_argument("--min-tokens", type=int, default=0)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--n", type=int, default=1, metavar="N",
                   help="samples a prompt (vLLM's n; with --request-seed S, sample i is seeded S + i); printed "
                        "prompt by prompt, with --json each line's index says which sample")
    p.add_argument("--request-seed", type=int, default=None, dest="request_seed",
                   help="per-request sampling seed (default: drawn from --seed)")
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="with --json: each token's logprob and its N most likely alternatives")
    p.add_argument("--prompt-logprobs", type=int, default=None, metavar="N",
                   help="with --json: each prompt token's logprob, rank and N most likely alternatives "
                        "(null for the first), and the prompt's token ids")
    p.add_argument("--json", action="store_true",
                   help='print {"text", "token_ids", "finish_reason"} per prompt (and sample)')
    ns = p.parse_args(argv)

    from minillm import LLM, SamplingParams
    from minillm.chat import utf8

    # argv's bytes that are not UTF-8 arrive as lone surrogates, which the tokenizer refuses naming a
    # "lone surrogate" at a position in the templated text; the chat sends each as U+FFFD, and so does this
    cleaned = [utf8(t) for t in ns.prompt]
    ns.prompt, replaced = [t for t, _ in cleaned], any(r for _, r in cleaned)

    try:
        params = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p,
                                top_k=ns.top_k, min_p=ns.min_p, min_tokens=ns.min_tokens, stop=ns.stop,
                                ignore_eos=ns.ignore_eos, seed=ns.request_seed,
                                presence_penalty=ns.presence_penalty, frequency_penalty=ns.frequency_penalty,
                                repetition_penalty=ns.repetition_penalty, logprobs=ns.logprobs,
                                prompt_logprobs=ns.prompt_logprobs, n=ns.n)
        if (ns.logprobs is not None or ns.prompt_logprobs is not None) and not ns.json:
            raise ValueError("--logprobs and --prompt-logprobs print with --json only: add --json")
        args = EngineArgs.from_cli(ns)
        fields = {k: v for k, v in vars(args).items() if k != "model"}
        try:
            llm = LLM(args.model, **fields)
        except STARTUP_ERRORS as e:
            raise ValueError(str(e)) from None
        if ns.chat:
            if not llm.tokenizer.chat_template:
                tok = f"--tokenizer {args.tokenizer}" if args.tokenizer else llm.engine.model_name
                raise ValueError(f"--chat: {tok} has no chat template; give one with --chat-template FILE, or drop "
                                 "--chat for a plain completion")
            prompts = []
            for i, t in enumerate(ns.prompt):
                which = f"prompt {i}: " if len(ns.prompt) > 1 else ""  # named as LLM.generate names them
                try:
                    prompts.append(llm.tokenizer.encode_chat([{"role": "user", "content": t}]))
                except ValueError as e:  # no template, text that is not valid Unicode
                    raise ValueError(f"{which}{e}") from None
                except Exception as e:  # the template's own raise_exception or a TypeError inside it
                    raise ValueError(f"{which}the model's chat template refused the prompt ({type(e).__name__}: "
                                     f"{e}); drop --chat for a plain completion") from None
        else:
            prompts = ns.prompt
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        dt = time.perf_counter() - t0
        if replaced:  # said once the run has gone ahead: a refusal stays one "error:" line
            print("(--prompt had bytes that are not UTF-8: each is sent as U+FFFD)", file=sys.stderr)
        if ns.n > 1 and ns.temperature == 0:  # (the default here; vLLM's is 1)
            print(f"(--n {ns.n} at --temperature 0: greedy samples are all the same; set --temperature)",
                  file=sys.stderr)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if hasattr(sys.stdout, "reconfigure"):  # a terminal that cannot show a character gets '?', not a traceback
        sys.stdout.reconfigure(errors="replace")
    outs = [sample for out in outs for sample in out.outputs]
    for out in outs:
        if ns.json:
            rec = {"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason}
            if ns.n > 1:
                rec["index"] = out.index
            if out.logprobs is not None:
                rec["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob, "top": lp.top}
                                   for lp in out.logprobs]
            if out.prompt_logprobs is not None:
                rec["prompt_token_ids"] = out.prompt_token_ids
                rec["prompt_logprobs"] = [None if lp is None else {"token_id": lp.token_id, "logprob": lp.logprob,
                                                                   "rank": lp.rank, "top": lp.top}
                                          for lp in out.prompt_logprobs]
            print(json.dumps(rec))
        else:
            print(out.text)
    if not ns.json:
        n = sum(len(o.token_ids) for o in outs)
        print(f"[{n} tokens in {dt:.2f} s, {n / dt:.1f} tok/s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        rc = main()
        sys.stdout.flush()  # a closed pipe raises here, not in the exit's own flush
        sys.exit(rc)
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, as the chat does while loading
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # or the exit's flush raises again
        sys.exit(141)  # 128 + SIGPIPE, what a shell reports for cat
