"""Tokenizer: the `tokenizers` library for text <-> ids, jinja2 for the chat template.

Built from an HF directory (tokenizer.json + tokenizer_config.json) or from GGUF metadata
(minillm/models/gguf_loader.py). Also holds the incremental detokenizer used for streaming.
"""

from __future__ import annotations

import codecs
import json
import re
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    """transformers' tojson filter, which templates are written against (tools and tool-call arguments
    are rendered with it): jinja's own sorts keys and escapes <, >, & and ' as HTML."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_chat_template(template: str, where: str | None = None) -> jinja2.Template:
    """template compiled in the sandbox it renders in; one that does not compile is a ValueError naming
    where it came from (`where`) and jinja's message and line, raised at load rather than at the first
    chat request."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:  # unknown tags and filters too (TemplateAssertionError)
        raise ValueError(f"{where or 'the chat template'} does not compile: {e.message} (line {e.lineno} of "
                         "the template); fix the template") from None


# Texts this long (characters) are encoded through encode_batch, which lets other Python threads run
# while it works (the server tokenizes in worker threads beside its event loop); shorter ones take
# plain encode, microseconds either way.
_LONG_TEXT = 1 << 16


class Tokenizer:
    def __init__(
        self,
        tok: HFTokenizer,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        eos_token_ids: list[int] | None = None,
        add_bos_token: bool = False,
        chat_template_where: str | None = None,
    ):
        """chat_template_where names the template's source in the error when it does not compile."""
        self.tok = tok
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = tok.token_to_id(bos_token) if bos_token else None
        ids = list(eos_token_ids or [])
        if eos_token and tok.token_to_id(eos_token) is not None and tok.token_to_id(eos_token) not in ids:
            ids.append(tok.token_to_id(eos_token))
        self.eos_token_ids = ids
        self.add_bos_token = add_bos_token
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.special_token_ids = {
            i for i, t in tok.get_added_tokens_decoder().items() if t.special
        }
        self.chat_template_where = chat_template_where
        self._template = compile_chat_template(chat_template, chat_template_where) if chat_template else None
        self._read_vars: tuple[str | None, set] = (None, set())  # template_reads' (template, variables)

    def set_chat_template(self, template: str, where: str) -> None:
        """Use template (compiled now: ValueError naming `where` when it does not) for every chat."""
        self._template = compile_chat_template(template, where)
        self.chat_template, self.chat_template_where = template, where

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_hf_dir(cls, path: str | Path, eos_token_ids: list[int] | None = None,
                    vocab_size: int | None = None) -> Tokenizer:
        """tokenizer.json plus tokenizer_config.json (chat template, bos/eos, add_bos_token) or
        chat_template.jinja; a file or value of the wrong kind is a ValueError naming it. With
        vocab_size (the model's embedding rows), a token id at or past it is refused too."""
        # imported here: hf_loader imports this module
        from minillm.models.hf_loader import config_bool, read_json, regular_file

        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.exists():
            # a SentencePiece-only checkpoint (older Llama/Mistral uploads): say how to make the file
            spm = ("; this directory has only a SentencePiece tokenizer.model, which minillm does not read: "
                   "transformers writes a tokenizer.json from it with AutoTokenizer.from_pretrained(DIR)"
                   ".save_pretrained(DIR)") if (path / "tokenizer.model").exists() else ""
            raise FileNotFoundError(
                f"{tj}: missing; minillm needs a fast-tokenizer tokenizer.json beside config.json, or "
                f"--tokenizer naming an HF directory that has one{spm}"
            )
        regular_file(tj)
        try:
            tok = HFTokenizer.from_file(str(tj))
        except Exception as e:  # the tokenizers library raises a bare Exception for any bad file
            raise ValueError(f"{tj}: not a valid tokenizer.json ({e})") from None
        if tok.get_vocab_size(with_added_tokens=False) == 0:  # else every prompt is refused as "empty"
            raise ValueError(f"{tj}: the tokenizer's model has an empty vocabulary; the file is damaged or a "
                             "placeholder")
        tc = path / "tokenizer_config.json"
        cfg = read_json(tc) if tc.exists() else {}
        template = _chat_template(cfg.get("chat_template"), str(tc))
        template_where = f"{tc}: 'chat_template'"
        ct = path / "chat_template.jinja"
        if template is None and ct.exists():
            template_where = f"{ct}: the chat template"
            try:
                template = regular_file(ct).read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{ct}: not UTF-8 text ({e})") from None
        # minillm never appends EOS itself; the key is checked so a broken file is still refused
        config_bool(cfg, "add_eos_token", str(tc), False)
        added = _added_tokens_decoder(cfg, str(tc))
        if vocab_size is not None:
            _check_ids_below(vocab_size, tok, _listed_added_tokens(tj), added, str(tj), str(tc))
        return cls(
            tok,
            chat_template=template,
            bos_token=_token_text(cfg, "bos_token", str(tc)),
            eos_token=_token_text(cfg, "eos_token", str(tc)),
            eos_token_ids=eos_token_ids,
            add_bos_token=config_bool(cfg, "add_bos_token", str(tc), False),
            chat_template_where=template_where,
        )

    # ---- text <-> ids -------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text, as the HF fast tokenizer gives them."""
        if not text.isascii():  # the tokenizers library refuses lone surrogates with a bare TypeError
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"the text is not valid Unicode: a lone surrogate {text[e.start]!a} at "
                                 f"character {e.start}") from None
        if len(text) < _LONG_TEXT:
            ids = self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        else:  # encode holds the GIL throughout: a 7 MB prompt stopped every stream's thread for 5 s
            ids = self.tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if (
            add_special_tokens and self.add_bos_token and self.bos_token_id is not None
            and (not ids or ids[0] != self.bos_token_id)
        ):
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids) -> list[str]:
        """Each id's vocabulary entry as stored ("Ġthe", "▁the", "<0x0A>"), as transformers names it."""
        return [self.tok.id_to_token(i) or "" for i in ids]

    # ---- chat ---------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, **kwargs) -> str:
        """The template's rendering of messages. continue_final_message leaves the last message open
        (vLLM's and transformers' option: the rendering is cut right after that message's text, so
        the model continues it, e.g. an assistant reply begun by the caller) and adds no generation
        prompt."""
        if not self.chat_template:
            raise ValueError(
                "this model has no chat template (tokenizer_config.json chat_template or GGUF "
                "tokenizer.chat_template); use a plain completion prompt instead"
            )
        if self._template is None:  # a template set after construction
            self._template = compile_chat_template(self.chat_template, self.chat_template_where)
        try:
            text = self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **kwargs,
            )
        except jinja2.TemplateError:
            raise
        except Exception as e:  # the template's own fault (1/0, a macro that recurses, a huge range): one type for
            raise jinja2.TemplateError(f"{type(e).__name__}: {e}") from e  # every caller (a server's 500 before)
        return _open_final_message(text, messages) if continue_final_message else text

    def chat_template_error(self) -> str | None:
        """What rendering a one-message conversation raises, or None. A template is only compiled at
        startup, so one that fails on every conversation would otherwise surface as each chat request's
        400 blaming its messages."""
        if not self.chat_template:
            return None
        try:
            self.apply_chat_template([{"role": "user", "content": "Hello"}])
        except Exception as e:  # whatever the template raises (raise_exception, undefined names, type errors)
            return f"{type(e).__name__}: {e}"
        return None

    def template_reads(self, name: str) -> bool:
        """Whether the chat template reads the variable `name` (jinja2.meta over its source): which
        optional inputs a request can give it that it acts on (tools, reasoning_effort, ...)."""
        if not self.chat_template:
            return False
        if self._template is None:
            self._template = compile_chat_template(self.chat_template, self.chat_template_where)
        if self._read_vars[0] != self.chat_template:  # cached per template (it may be set after construction)
            parsed = self._template.environment.parse(self.chat_template)
            self._read_vars = (self.chat_template, jinja2.meta.find_undeclared_variables(parsed))
        return name in self._read_vars[1]

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    add_special_tokens: bool = False, template_kwargs: dict | None = None,
                    continue_final_message: bool = False) -> list[int]:
        """The template's rendering of messages as ids; template_kwargs are extra template variables
        (Qwen3's enable_thinking, ...). The template writes any BOS itself, so by default no special
        tokens are added on top."""
        text = self.apply_chat_template(messages, add_generation_prompt, continue_final_message,
                                        **(template_kwargs or {}))
        return self.encode(text, add_special_tokens=add_special_tokens)


def read_chat_template(value: str) -> tuple[str, str]:
    """--chat-template (vLLM's): a file holding the template, or the template itself; returns (the
    template, where it came from, for errors). A value that is neither is a ValueError saying so."""
    path = Path(value)
    try:
        # a pipe counts as a file: `--chat-template <(...)` gives /dev/fd/N (read once, here)
        is_dir = path.is_dir()
        is_file = not is_dir and (path.is_file() or path.is_fifo() or path.is_char_device())
    except (OSError, ValueError):  # a long inline template is not a valid path on every system
        is_file = is_dir = False
    if is_file:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"--chat-template {value}: not UTF-8 text ({e})") from None
        if not text.strip():
            raise ValueError(f"--chat-template {value}: the file is empty")
        return text, f"--chat-template {value}"
    if "{{" in value or "{%" in value:
        return value, "--chat-template (the template given inline)"
    if is_dir:
        raise ValueError(f"--chat-template {value}: a directory; give the path of a Jinja template file in it, or the "
                         "template itself")
    raise ValueError(f"--chat-template {value!r}: no such file, and not a template (it has no {{{{ or {{%); give "
                     "the path of a Jinja template file or the template itself")


def _shown(v) -> str:
    from minillm.models.hf_loader import shown  # imported here: hf_loader imports this module

    return shown(v)


def _chat_template(v, where: str) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of {"name", "template"} objects
    (the one named "default", else the first)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in v):
        named = {t.get("name"): t["template"] for t in v}
        return named.get("default") or next(iter(named.values()), None)
    raise ValueError(f"{where}: 'chat_template' must be a string or a list of {{\"name\", \"template\"}} "
                     f"objects, got {_shown(v)}")


def _added_tokens_decoder(cfg: dict, where: str) -> dict[int, str]:
    """tokenizer_config.json's added_tokens_decoder ({"<id>": {"content": ...}}) as id -> token.
    tokenizer.json's added tokens are the ones minillm encodes with; this copy is read for transformers,
    which adds its tokens on top, so it is checked against the embedding too."""
    v = cfg.get("added_tokens_decoder")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"{where}: 'added_tokens_decoder' must be an object of token id -> token, got {_shown(v)}")
    bad = next((k for k in v if not (k.isascii() and k.isdigit())), None)
    if bad is not None:
        raise ValueError(f"{where}: 'added_tokens_decoder' keys must be token ids (\"151643\"), got {_shown(bad)}")
    return {int(k): t.get("content") if isinstance(t, dict) else t for k, t in v.items()}


_ADDED_TOKENS_KEY = re.compile(r'"added_tokens"\s*:\s*')


def _listed_added_tokens(tj: Path) -> list:
    """tokenizer.json's "added_tokens" as the file writes them (ids included; the file has already
    loaded, so it is valid JSON). Decoded alone from its key, which comes before the vocabulary: the
    whole file is megabytes, a third of a second to parse for a 150k vocabulary. When that does not
    give a list (a hand-ordered file, a vocabulary token spelled "added_tokens"), the file is parsed
    whole."""
    text = tj.read_text(encoding="utf-8")
    key = _ADDED_TOKENS_KEY.search(text)
    listed = json.JSONDecoder().raw_decode(text, key.end())[0] if key else None
    if not isinstance(listed, list):
        listed = json.loads(text).get("added_tokens")
    return listed if isinstance(listed, list) else []


def _check_ids_below(vocab_size: int, tok: HFTokenizer, listed: list, added: dict[int, str],
                     tj: str, tc: str) -> None:
    """Every id the tokenizer files give must be an embedding row: a prompt holding a larger one
    cannot run (and a renumbered one runs as the wrong token). Fewer ids than rows is common and fine:
    embeddings are padded to a round size (Qwen: 151,665 tokens, 151,936 rows)."""
    enc = tok.encode("", add_special_tokens=True)  # what the post-processor adds to every prompt
    sources = [
        (tj, ((i, t) for t, i in tok.get_vocab(with_added_tokens=True).items())),
        # the file's own ids: the tokenizers library quietly renumbers an added token whose id
        # leaves a gap, so the id the model was trained with is only seen here
        (tj, ((t["id"], t.get("content")) for t in listed if isinstance(t, dict) and isinstance(t.get("id"), int))),
        (tj, zip(enc.ids, enc.tokens)),
        (tc, added.items()),
    ]
    largest = [(max(pairs, key=lambda p: p[0], default=(-1, None)), where) for where, pairs in sources]
    (i, token), where = max(largest, key=lambda p: p[0][0])
    if i >= vocab_size:
        raise ValueError(
            f"{where}: token {_shown(token)} has id {i}, but the model's vocab_size is {vocab_size} (the "
            f"embedding's rows), so every id must be below it: these tokenizer files do not belong to these "
            "weights; use the model's own tokenizer files (or a --tokenizer of its base model)"
        )


def _token_text(cfg: dict, key: str, where: str) -> str | None:
    """bos_token / eos_token: a string, or an AddedToken object whose "content" is one."""
    v = cfg.get(key)
    text = v.get("content") if isinstance(v, dict) else v
    if v is not None and not isinstance(text, str):
        raise ValueError(f"{where}: '{key}' must be a string or an object with a string \"content\", "
                         f"got {_shown(v)}")
    return text


def content_text(content) -> str | None:
    """A chat message's content as the template gets it: a string as is, an array of text parts
    ({"type": "text", "text": ...}) joined by newlines; None for anything else (the caller says
    what is wrong). The server's protocol and LLM.chat both flatten through this."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return None


def final_message_text(messages: list[dict]) -> str:
    """The text continue_final_message continues: the last message's content, or the last text part
    of a content array; ValueError when there is none."""
    content = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        content = texts[-1] if texts else None
    if not isinstance(content, str) or not content.strip():
        raise ValueError("continue_final_message needs a final message with text to continue")
    return content


def _open_final_message(text: str, messages: list[dict]) -> str:
    """text cut right after the final message's text: what follows it there (the template's
    end-of-turn marker) is dropped. Templates that strip the content are matched by its stripped
    form; one that does not write it verbatim gets a ValueError."""
    final = final_message_text(messages)
    for needle in (final, final.strip()):
        at = text.rfind(needle)
        if at >= 0:
            return text[:at + len(needle)]
    raise ValueError("continue_final_message: the chat template does not write the final message's text "
                     "verbatim, so it cannot be left open")


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _bytelevel_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is written as in a ByteLevel vocabulary."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class _StreamInfo:
    """What IncrementalDecoder needs to know of a tokenizer's decoder, worked out once per tokenizer."""

    def __init__(self, tokenizer: Tokenizer):
        tok = tokenizer.tok
        try:
            kinds = set(re.findall(r'"type"\s*:\s*"(\w+)"', tok.decoder.__getstate__().decode()))
        except Exception:  # no decoder, or one that does not serialise
            kinds = set()
        self.special_ids = frozenset(tokenizer.special_token_ids)
        self.added_ids = frozenset(tok.get_added_tokens_decoder())
        # ByteLevel (GPT-2, Llama 3, Qwen): the tokens' bytes are joined and read as UTF-8 (lossily)
        self.byte_level = "ByteLevel" in kinds
        self._chars = _bytelevel_chars() if self.byte_level else {}
        self._bytes: dict[int, bytes] = {}
        # ByteFallback (Llama 2, Mistral, Gemma): <0xXX> tokens; a run of them that is not valid UTF-8
        # as a whole decodes to one U+FFFD per token, even the ASCII ones ("\n" then 0xE2 is two)
        self.byte_ids = frozenset()
        if "ByteFallback" in kinds:
            self.byte_ids = frozenset(i for i in (tok.token_to_id(f"<0x{b:02X}>") for b in range(256))
                                      if i is not None and i not in self.added_ids)

    def token_bytes(self, tok: HFTokenizer, i: int) -> bytes:
        """A ByteLevel vocabulary token's bytes (b"" for an id the vocabulary lacks)."""
        b = self._bytes.get(i)
        if b is None:
            text = tok.id_to_token(i) or ""
            chars = self._chars
            b = self._bytes[i] = bytes(chars[c] for c in text) if all(c in chars for c in text) else text.encode()
        return b


def _stream_info(tokenizer: Tokenizer) -> _StreamInfo:
    info = tokenizer.__dict__.get("_stream_info")
    if info is None:
        info = tokenizer.__dict__["_stream_info"] = _StreamInfo(tokenizer)
    return info


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas for streaming.

    The tokenizers library's DecodeStream (Rust) does the windowed decode: it decodes the tokens of
    its last delta with and without the new ones and holds back text that ends in U+FFFD (an
    incomplete UTF-8 sequence), so multi-byte characters are never split across deltas. One native
    call per token; the Python version it replaced made two decode calls per token and was the
    largest part of the engine's host time at batch 256 (scripts/host_overhead.py).

    Around it: skipped special tokens never reach it (each one held would grow its window, and every
    later step decodes the whole window: quadratic on a run of them); a run of byte-fallback tokens
    is held until a token ends it (the decoder reads the run as a whole, so a later byte can turn an
    earlier one into U+FFFD, which DecodeStream reports as an error); with a ByteLevel decoder, text
    that ends in a U+FFFD no later byte can complete is let out rather than held (a run of stray
    bytes was held, and decoded again, token after token); and flush() gives what is still held when
    the sequence ends. So the deltas joined are the decode of all ids at once.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        """skip_special_tokens False (a request's, as in vLLM) keeps special tokens' text
        (<|im_start|>, a Hermes <tool_call>) in the deltas."""
        from tokenizers.decoders import DecodeStream

        self._new_stream = lambda: DecodeStream(skip_special_tokens=skip_special_tokens)
        self._tok = tokenizer.tok
        self._skip = skip_special_tokens
        self._info = info = _stream_info(tokenizer)
        self._dropped = info.special_ids if skip_special_tokens else frozenset()
        self._byte_ids = info.byte_ids
        self._stream = self._new_stream()  # None once it failed: the same windows, decoded here
        self._last: list[int] = []  # the ids of the last delta: the window's start
        self._pending: list[int] = []  # ids given to the window since, that let out nothing yet
        self._held: list[int] = []  # an open run of byte-fallback tokens, not in the window yet

    def push(self, new_ids: list[int]) -> str:
        """Append tokens; return the newly completed text."""
        pieces = []
        dropped, byte_ids = self._dropped, self._byte_ids
        for i in new_ids:
            if i in dropped:  # decode leaves skipped special tokens out before it reads the rest
                continue
            if i in byte_ids:
                self._held.append(i)
                continue
            if self._held:
                if self._tok.id_to_token(i) is None:  # no entry (an embedding row past the vocabulary): decode
                    continue                          # drops it, so it does not end the run it sits in
                ids, self._held = self._held + [i], []
            else:
                ids = [i]
            piece = self._step(ids)
            if piece:
                pieces.append(piece)
        return "".join(pieces)

    def flush(self) -> str:
        """The text still held back, at the sequence's end: an incomplete character decodes to U+FFFD
        there, as in a decode of all the ids. Call once, after the last push."""
        piece = self._step(self._held) if self._held else ""
        self._held = []
        if self._pending:
            piece += self._window_text(self._last, self._pending)
            self._last, self._pending = [], []
            self._stream = self._new_stream()
        return piece

    def _window_text(self, last: list[int], new: list[int]) -> str:
        decode, skip = self._tok.decode, self._skip
        before, text = decode(last, skip_special_tokens=skip), decode(last + new, skip_special_tokens=skip)
        return text[len(before):]  # by length where the window's text does not start with before's

    def _step(self, ids: list[int]) -> str:
        if self._stream is not None:
            try:
                piece = self._stream.step(self._tok, ids if len(ids) > 1 else ids[0])
            except Exception as e:
                if "prefix" not in str(e).lower():
                    raise
                # the window's text does not start with its last delta's: decode the windows here
                # from now on (by length, as vLLM's Python detokenizer did; what was sent stays sent)
                self._stream = None
            else:
                if piece:
                    self._last, self._pending = self._pending + ids, []
                    return piece
                self._pending += ids
                if self._info.byte_level and self._tail_is_final():
                    # held for a U+FFFD that no later byte completes: let it out; a fresh stream
                    # starts after it (a ByteLevel decode has no context beyond the UTF-8 state)
                    piece = self._window_text(self._last, self._pending)
                    self._last, self._pending = [], []
                    self._stream = self._new_stream()
                    return piece
                return ""
        self._pending += ids
        piece = self._window_text(self._last, self._pending)
        if piece and not piece.endswith("\ufffd"):
            self._last, self._pending = self._pending, []
            return piece
        return ""

    def _tail_is_final(self) -> bool:
        """Whether the pending ids' bytes end with no incomplete UTF-8 sequence (ByteLevel decoders):
        the last delta ended on a whole character, so only the pending bytes after the last added
        token (whose text the decoder does not read) decide it, and only their last three."""
        info, tok, added = self._info, self._tok, self._info.added_ids
        tail = b""
        for i in reversed(self._pending):
            if i in added:
                break
            tail = info.token_bytes(tok, i) + tail
            if len(tail) >= 3:
                break
        tail = tail[-3:]
        return codecs.utf_8_decode(tail, "replace", False)[1] == len(tail)
