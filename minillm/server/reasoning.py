"""Reasoning output on the chat endpoint (`--reasoning-parser`, vLLM's flag): a thinking model's
`<think>...</think>` text returned apart from its answer, as `reasoning_content`.

The split is made on the output's text, not its token ids, so it works whether the tags are one
added token each (Qwen3) or several (a byte-level tokenizer):

- `qwen3`: an output that opens with `<think>` (after optional whitespace) thinks; any other is
  all content, as it comes (thinking off: Qwen3's template with enable_thinking false puts an
  empty think block in the prompt). Deciding at the start keeps a stream live: an output that
  does not open with the tag is never held back. Models whose template puts `<think>` in the
  prompt (Qwen3 Thinking-2507) want `deepseek_r1`, as in vLLM.
- `deepseek_r1`: every output thinks (its template puts `<think>` in the prompt, so the output
  may not repeat the tag).
- A thinking output: the text before its first `</think>` is the reasoning (one leading `<think>`
  removed, newlines around it stripped), the text after it the content (its leading newlines
  stripped; null when nothing is left). Without `</think>` it is all reasoning, thinking cut
  short (max_tokens).

`split_reasoning` splits a whole output; `ReasoningSplitter` splits it as it streams, holding back
only what is still undecided (a possible tag, newlines that may turn out to be trailing), so its
deltas always add up to `split_reasoning`'s answer, however the text is cut.
"""

from __future__ import annotations

from dataclasses import dataclass

PARSERS = ("deepseek_r1", "qwen3")
START, END = "<think>", "</think>"


def check_parser(parser: str) -> str:
    if parser not in PARSERS:
        raise ValueError(f"unknown reasoning parser {parser!r}; choose one of {', '.join(PARSERS)}")
    return parser


def think_token_ids(tokenizer, parser: str) -> tuple[int | None, int] | None:
    """SamplingParams.think_token_ids for a parser's constrained requests: (<think>'s id, or None for
    deepseek_r1, whose outputs all think; </think>'s id), so a constraint holds only after the
    thinking. None when a tag the parser needs is not one token of the vocabulary: the constraint
    then holds from the output's first token, as without a parser."""
    def one_token(tag: str) -> int | None:
        ids = tokenizer.encode(tag, add_special_tokens=False)
        return ids[0] if len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=False) == tag else None

    end = one_token(END)
    start = one_token(START) if check_parser(parser) == "qwen3" else None
    if end is None or (parser == "qwen3" and start is None):
        return None
    return start, end


def split_reasoning(text: str, parser: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole output. reasoning is None when the output has no thinking
    part (qwen3, thinking off); content is None when the output is all thinking."""
    check_parser(parser)
    body = text.lstrip()
    opened = body.startswith(START)
    if not opened and parser == "qwen3":  # thinking off
        return None, text
    thought = body[len(START):] if opened else text
    end = thought.find(END)
    if end < 0:  # thinking that never ended: cut short by max_tokens
        return thought.strip("\n"), None
    return thought[:end].strip("\n"), thought[end + len(END):].lstrip("\n") or None


@dataclass
class Delta:
    """What some output adds to the reply: reasoning text and content text (either may be empty)."""

    reasoning: str = ""
    content: str = ""

    def __add__(self, other: Delta) -> Delta:
        return Delta(self.reasoning + other.reasoning, self.content + other.content)


def _tag_prefix(text: str, tag: str) -> int:
    """Length of the longest end of text that could be the start of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningSplitter:
    """One choice's output text in as it arrives (`feed`, then `finish`), reasoning and content
    deltas out. States: "head" (whether the output opens with <think> is not known yet),
    "reasoning" (inside the thinking: text goes out but for a possible </think> prefix), "answer"
    (qwen3 that did not open with <think>: all content, as it comes) and "content" (after
    </think>: text goes out as it comes, less its leading newlines)."""

    def __init__(self, parser: str):
        self.parser = check_parser(parser)
        self.state = "head"
        self.buf = ""  # text not yet given out
        self.reasoning_shown = False  # leading newlines of the reasoning are dropped
        # the reasoning's newlines so far at its end: they go out if more reasoning follows. Held text is
        # kept in pieces (lists): one str grown a piece at a time is quadratic in a long run of newlines
        self.newlines: list[str] = []
        self.blank: list[str] = []  # "head": whitespace after buf (buf is all whitespace then)
        self.content_shown = False  # leading newlines of the content are dropped

    def _reasoning(self, text: str) -> str:
        if not self.reasoning_shown:
            text = text.lstrip("\n")
        body = text.rstrip("\n")
        if not body:
            self.newlines.append(text)
            return ""
        out, self.newlines, self.reasoning_shown = "".join(self.newlines) + body, [text[len(body):]], True
        return out

    def _content(self, text: str) -> str:
        if not self.content_shown:
            text = text.lstrip("\n")
            self.content_shown = bool(text)
        return text

    def feed(self, text: str) -> Delta:
        if self.state == "head" and text.isspace() and (self.blank or self.buf.isspace()):
            self.blank.append(text)  # (buf is short here: at most a blank run before this one's first piece)
            return Delta()
        self.buf += "".join(self.blank) + text
        self.blank = []
        out = Delta()
        while True:
            if self.state == "head":
                body = self.buf.lstrip()
                if len(body) < len(START) and START.startswith(body):  # may still be <think> (or blank so far)
                    return out
                if body.startswith(START):
                    self.buf, self.state = body[len(START):], "reasoning"
                else:
                    self.state = "reasoning" if self.parser == "deepseek_r1" else "answer"
                continue
            if self.state == "answer":
                out.content, self.buf = out.content + self.buf, ""
                return out
            if self.state == "content":
                out.content += self._content(self.buf)
                self.buf = ""
                return out
            end = self.buf.find(END)
            if end >= 0:  # the thinking ends: its held newlines at the end are dropped with the tag
                out.reasoning += self._reasoning(self.buf[:end])
                self.buf, self.state = self.buf[end + len(END):], "content"
                continue
            keep = _tag_prefix(self.buf, END)
            out.reasoning += self._reasoning(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return out

    def finish(self) -> Delta:
        """What the held text turns out to be once the output has ended."""
        rest, self.buf, self.blank = self.buf + "".join(self.blank), "", []
        if self.state == "answer" or (self.state == "head" and self.parser == "qwen3"):  # never thought
            return Delta(content=rest)
        if self.state == "content":
            return Delta(content=self._content(rest))
        return Delta(reasoning=self._reasoning(rest))  # (its trailing newlines stay held: dropped)
