"""python -m minillm.chat [MODEL] [engine flags]: a multi-turn chat in the terminal.

Each turn goes through the model's chat template and is streamed token by token straight from
the LLMEngine (no server). Commands: /reset (forget the conversation), /system TEXT (set the
system prompt and reset), /exit or Ctrl-D; //TEXT sends /TEXT, a message that begins with a slash. Ctrl-C
stops an answer mid-way (at the prompt it drops the line, not the conversation). With no MODEL it loads
the embedded SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from minillm.args import STARTUP_ERRORS, CliParser, EngineArgs, add_engine_args
from minillm.sampling_params import SamplingParams

HELP = "commands: /reset  /system TEXT  /help  /exit (or Ctrl-D); Ctrl-C stops an answer"
SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = CliParser(prog="python -m minillm.chat", description=__doc__.split("\n")[0])
    add_engine_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--max-tokens", type=int, default=512, help="longest answer, in tokens")
    p.add_argument("--temperature", type=float, default=None, help="default: the model's, else 0.7")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None, help="vLLM's min_p (default: the model's, else 0: off)")
    return p.parse_args(argv)


class Chat:
    """The conversation and one engine; answer() streams a reply to `out`."""

    def __init__(self, engine, ns: argparse.Namespace, out=sys.stdout):
        self.engine, self.out = engine, out
        self.system: str | None = ns.system
        self.history: list[dict] = []
        d = engine.generation_defaults

        def pick(flag, key: str, fallback):  # the flag, else the model's default, else ours
            return flag if flag is not None else fallback if d.get(key) is None else d[key]

        # taken as they are (no float()/int() that could raise here): main() checks them with SamplingParams
        self.sampling = dict(
            temperature=pick(ns.temperature, "temperature", 0.7), top_p=pick(ns.top_p, "top_p", 1.0),
            top_k=pick(ns.top_k, "top_k", -1), min_p=pick(ns.min_p, "min_p", 0.0),
        )
        self.max_tokens = ns.max_tokens

    def system_refused(self, system: str) -> str | None:
        """Why the chat template refuses this system prompt (some, Gemma's, take no system role), else None:
        checked when it is set, or every turn would be refused after /system had reset the conversation."""
        enc, user = self.engine.tokenizer.encode_chat, {"role": "user", "content": "hi"}
        try:
            enc([user])
        except Exception:  # the template fails without a system prompt too: not the system prompt's fault
            return None
        try:
            enc([{"role": "system", "content": system}, user])
        except Exception as e:
            return f"{e}" or type(e).__name__
        return None

    def messages(self, history: list[dict] | None = None) -> list[dict]:
        sys_msg = [{"role": "system", "content": self.system}] if self.system else []
        return sys_msg + (self.history if history is None else history)

    def prompt_ids(self) -> list[int] | None:
        """The templated conversation, the oldest turns dropped while it leaves no room to answer; None,
        with the history as it was, when the last message leaves none even alone."""
        enc, limit = self.engine.tokenizer.encode_chat, self.engine.max_model_len
        history = self.history
        ids = enc(self.messages(history))
        while len(ids) >= limit and len(history) > 1:
            history = history[2:] if len(history) > 2 else history[-1:]
            ids = enc(self.messages(history))
        if len(ids) >= limit:
            return None
        if len(history) < len(self.history):
            dropped = (len(self.history) - len(history) + 1) // 2
            print(f"(context full: dropped the oldest {'turn' if dropped == 1 else f'{dropped} turns'})", file=self.out)
            self.history = history
        return ids

    def answer(self, text: str) -> None:
        # Ctrl-C only raises a flag, for the whole turn: interrupting step() half-way would leave the
        # engine inconsistent, and a KeyboardInterrupt between add_request and the end of the turn would
        # leave a request in the engine and an unanswered message in the history
        interrupted: list[bool] = []
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
        try:
            self._answer(text, interrupted)
        finally:
            signal.signal(signal.SIGINT, previous)

    def _answer(self, text: str, interrupted: list[bool]) -> None:
        eng, out = self.engine, self.out
        self.history.append({"role": "user", "content": text})
        try:
            ids = self.prompt_ids()
        except Exception as e:  # the template's own raise_exception, e.g. roles that must alternate
            self.history.pop()
            print(f"(the chat template refused the conversation: {e})", file=out)
            return
        if ids is None:
            self.history.pop()
            with_system = " with the system prompt (/system to change it)" if self.system else ""
            print(f"(message{with_system} too long for max_model_len {eng.max_model_len}; not sent)", file=out)
            return
        params = SamplingParams(max_tokens=min(self.max_tokens, eng.max_model_len - len(ids)), **self.sampling)
        rid = eng.add_request(ids, params)
        last, reason, t_first = None, None, None
        t0 = time.perf_counter()
        while eng.has_unfinished() and not interrupted:
            for o in eng.step():
                out.write(o.new_text)
                out.flush()
                last, reason = o, o.finish_reason
                if t_first is None and o.new_token_ids:
                    t_first = time.perf_counter()
        reply, n = (last.text, last.output_len) if last is not None else ("", 0)  # (the text joined once)
        if interrupted and reason is None:  # a Ctrl-C that came after the last token changes nothing
            eng.abort_request(rid)
            reason = "interrupted"
        t_end = time.perf_counter()
        self.history.append({"role": "assistant", "content": reply})
        note = f", {reason}" if reason in ("length", "interrupted") else ""
        # the rate of the tokens after the first (the prompt's prefill is the first token's wait)
        count, span = (n - 1, t_end - t_first) if t_first is not None and n > 1 else (n, t_end - t0)
        rate = count / span if span > 0 else 0.0
        first = f"; first token after {t_first - t0:.2f} s" if t_first is not None else ""
        print(f"\n[{n} tokens, {rate:.1f} tok/s, prompt {len(ids)} tokens{note}{first}]", file=out)

    def command(self, line: str) -> bool:
        """Handle a /command; False means exit."""
        cmd, _, arg = line.replace("\t", " ").partition(" ")  # (a tab after the command too)
        if cmd in ("/exit", "/quit"):
            return False
        if cmd == "/reset":
            self.history = []
            print("(conversation reset)", file=self.out)
        elif cmd in ("/help", "/?"):
            print(f"({HELP})", file=self.out)
        elif cmd == "/system":
            system = arg.strip() or None
            if system is not None and (why := self.system_refused(system)) is not None:
                print(f"(the chat template refuses a system prompt: {why}; the previous one and the conversation "
                      "are kept)", file=self.out)
                return True
            self.system = system
            self.history = []
            print(f"(system prompt {'set' if self.system else 'cleared'}; conversation reset)", file=self.out)
        else:
            print(f"(unknown command {cmd}; {HELP}; to send a message that begins with /, type it as //...)",
                  file=self.out)
        return True


def utf8(text: str) -> tuple[str, bool]:
    """text with each byte that was not UTF-8 (a lone surrogate, from surrogateescape) as U+FFFD,
    and whether there was one: the tokenizer refuses lone surrogates."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), True


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if sys.stdin is None:  # started with stdin closed (<&-): input() would raise RuntimeError
        print("error: stdin is closed; the chat reads your messages from it (python -m minillm.generate "
              "--prompt TEXT needs none)", file=sys.stderr)
        return 2
    if ns.max_tokens < 1:  # before the model loads: a flag error should not wait for it
        print(f"error: --max-tokens must be >= 1, got {ns.max_tokens}", file=sys.stderr)
        return 2
    try:  # the sampling flags given, as well (the model's defaults for the others are checked once it loads)
        SamplingParams(**{k: getattr(ns, k) for k in SAMPLING_FLAGS if getattr(ns, k) is not None})
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if ns.system is not None:  # argv's undecodable bytes arrive as surrogates, as stdin's do
        ns.system, replaced = utf8(ns.system)
        if replaced:
            print("(--system had bytes that are not UTF-8: each is sent as U+FFFD)")
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    from minillm.engine.engine import LLMEngine

    try:
        engine = LLMEngine(EngineArgs.from_cli(ns))
    # user and environment errors (flags, model path, sizing, no GPU, no memory): one line, no traceback
    except STARTUP_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if not engine.tokenizer.chat_template:
        print(f"error: {engine.model_name} has no chat template; give one with --chat-template FILE, or use "
              "python -m minillm.generate for plain completions", file=sys.stderr)
        return 2
    try:
        chat = Chat(engine, ns)
        SamplingParams(**chat.sampling)
        if chat.system is not None and (why := chat.system_refused(chat.system)) is not None:
            raise ValueError(f"--system: the chat template refuses a system prompt ({why}); leave --system out")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if hasattr(sys.stdin, "reconfigure"):  # undecodable bytes arrive as surrogates, not a UnicodeDecodeError
        sys.stdin.reconfigure(errors="surrogateescape")
    if hasattr(sys.stdout, "reconfigure"):  # a terminal that cannot show a character gets '?', not a traceback
        sys.stdout.reconfigure(errors="replace")
    print(f"minillm chat: {engine.model_name} on {engine.backend.name}, max_model_len {engine.max_model_len}")
    print(HELP)
    while True:
        try:
            line = input(">>> ").strip()
            if not line:
                continue
            line, replaced = utf8(line)  # stdin's undecodable bytes arrive as lone surrogates
            if replaced:
                print("(the line had bytes that are not UTF-8: each is sent as U+FFFD)")
            if line.startswith("//"):  # an escaped slash: a message that begins with one
                line = line[1:]
            elif line.startswith("/"):
                if not chat.command(line):
                    return 0
                continue
            chat.answer(line)
        except EOFError:
            print()
            return 0
        # Ctrl-C outside an answer, often one meant for an answer that had just ended: the session
        # stays (answer() keeps its own turn consistent); Ctrl-D and /exit are the ways out
        except KeyboardInterrupt:
            print("\n(Ctrl-D or /exit to quit)")


if __name__ == "__main__":
    try:
        rc = main()
        sys.stdout.flush()  # a closed pipe raises here, not in the exit's own flush
        sys.exit(rc)
    except KeyboardInterrupt:  # Ctrl-C while importing, before the REPL: stop quietly
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # or the exit's flush raises again
        sys.exit(141)  # 128 + SIGPIPE, what a shell reports for cat
