"""`python -m minillm.chat` driven through a pseudo-terminal (the stdlib pty module, no pexpect):
two turns that share the conversation, /system, /reset, /exit and Ctrl-D.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from hf_models import make_tiny

ROOT = Path(__file__).resolve().parents[1]
STATS = re.compile(r"\[(\d+) tokens, ([\d.]+) tok/s, prompt (\d+) tokens")


def _own_terminal() -> None:
    """In the child: a new session whose controlling terminal is the pty, so ^C and ^D act as typed,
    and SIGINT's default action, as a terminal gives it: a test run started in the background of a
    non-interactive shell (as CI may be) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt (clean CI: a Ctrl-C at the prompt did nothing)."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Repl:
    def __init__(self, *args: str, env: dict | None = None):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minillm.chat", *args],
            cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, close_fds=True, preexec_fn=_own_terminal,
            env={**os.environ, "TERM": "dumb", **(env or {})})
        os.close(slave)
        self.buf = ""

    def expect(self, pattern: str, timeout: float = 60) -> re.Match:
        """Read until pattern matches; consume the output up to the end of the match."""
        deadline = time.monotonic() + timeout
        while not (m := re.search(pattern, self.buf)):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {pattern!r}; got:\n{self.buf}")
            if select.select([self.master], [], [], left)[0]:
                try:
                    data = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    data = b""
                if not data:
                    raise AssertionError(f"REPL exited waiting for {pattern!r}; got:\n{self.buf}")
                self.buf += data.decode(errors="replace")
        self.buf = self.buf[m.end():]
        return m

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def __enter__(self) -> Repl:
        return self

    def __exit__(self, *exc) -> None:  # a failed test leaves no REPL behind
        if self.proc.poll() is None:
            self.proc.kill()

    def close(self) -> int:
        try:
            return self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            os.close(self.master)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    make_tiny("qwen2", path)
    return path


def turn(repl: Repl, text: str) -> tuple[int, int]:
    repl.send(text + "\n")
    m = repl.expect(STATS.pattern)
    repl.expect(">>> ")
    n, rate, prompt = int(m.group(1)), float(m.group(2)), int(m.group(3))
    assert 1 <= n <= 8 and rate > 0
    return n, prompt


def test_two_turns_system_reset_exit(model_dir):
    with Repl(str(model_dir), "--device", "cpu", "--max-tokens", "8") as repl:
        repl.expect(r"minillm chat: .* on numpy")
        repl.expect(">>> ")
        _, p1 = turn(repl, "hello")
        assert p1 == len("<user>hello\n<assistant>")  # byte tokenizer: one token a byte
        _, p2 = turn(repl, "again")
        # the second turn carries the first: its prompt is the whole conversation through the template
        assert p2 >= p1 + len("\n<user>again\n<assistant>")
        repl.send("/system be brief\n")
        repl.expect(r"system prompt set")
        repl.expect(">>> ")
        _, p3 = turn(repl, "hello")
        assert p3 == len("<system>be brief\n<user>hello\n<assistant>")
        repl.send("/reset\n")
        repl.expect(r"conversation reset")
        repl.expect(">>> ")
        repl.send("/exit\n")
        assert repl.close() == 0


def test_a_message_too_long_to_send_keeps_the_conversation(model_dir):
    """A message that cannot fit max_model_len even alone is refused, and the turns before it stay (they
    used to be dropped one by one looking for room); /help lists the commands."""
    with Repl(str(model_dir), "--device", "cpu", "--max-tokens", "8", "--max-model-len", "128") as repl:
        repl.expect(">>> ")
        _, p1 = turn(repl, "hello")
        repl.send("x" * 200 + "\n")
        repl.expect(r"too long for max_model_len 128; not sent")
        repl.expect(">>> ")
        _, p2 = turn(repl, "again")
        assert p2 >= p1 + len("\n<user>again\n<assistant>")  # the first turn is still there
        repl.send("/help\n")
        repl.expect(r"\(commands: /reset .* /exit")
        repl.expect(">>> ")
        repl.send("/exit\n")
        assert repl.close() == 0


@pytest.mark.parametrize("lang", ["C", "C.UTF-8"])  # stdin decodes with surrogateescape / strictly
def test_bytes_that_are_not_utf8_are_replaced(model_dir, lang):
    with Repl(str(model_dir), "--device", "cpu", "--max-tokens", "8", env={"LC_ALL": lang, "LANG": lang}) as repl:
        repl.expect(">>> ")
        os.write(repl.master, b"a\xffb\n")
        repl.expect(r"not UTF-8: each is sent as U\+FFFD")
        m = repl.expect(STATS.pattern)
        assert int(m.group(3)) == len("<user>a\ufffdb\n<assistant>".encode())  # one token a byte
        repl.expect(">>> ")
        repl.send("/exit\n")
        assert repl.close() == 0


def test_ctrl_d_exits(model_dir):
    with Repl(str(model_dir), "--device", "cpu", "--max-tokens", "8") as repl:
        repl.expect(">>> ")
        turn(repl, "hi")
        repl.send("\x04")  # Ctrl-D at the prompt: EOF
        assert repl.close() == 0


def test_min_p_flag_and_the_models_default():
    """--min-p like --top-p: the flag, else the model's generation_config, else 0 (off)."""
    from types import SimpleNamespace

    from minillm.chat import Chat, parse_args

    eng = SimpleNamespace(generation_defaults={"min_p": 0.1, "top_p": 0.9})
    assert Chat(eng, parse_args([])).sampling["min_p"] == 0.1
    assert Chat(eng, parse_args(["--min-p", "0.3"])).sampling["min_p"] == 0.3
    assert Chat(SimpleNamespace(generation_defaults={}), parse_args([])).sampling["min_p"] == 0.0


def test_bad_min_p_is_one_line_error(model_dir):
    r = subprocess.run([sys.executable, "-m", "minillm.chat", str(model_dir), "--device", "cpu", "--min-p", "2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stderr.startswith("error: min_p") and "Traceback" not in r.stderr


def test_ctrl_c_at_the_prompt_keeps_the_conversation(model_dir):
    """A Ctrl-C that lands after an answer ended (a user stopping it a moment late) must not end the
    session and lose the conversation: Ctrl-D and /exit are the ways out."""
    with Repl(str(model_dir), "--device", "cpu", "--max-tokens", "8") as repl:
        repl.expect(">>> ")
        _, p1 = turn(repl, "hello")
        # as a person would, after the prompt is up, again if nothing shows: readline shows the prompt
        # before it waits for keys, CPython's readline loop only notices a signal that interrupts that
        # wait, and on a loaded machine the answer's own Ctrl-C handler may still be in place
        for _ in range(20):
            time.sleep(0.5)
            repl.send("\x03")
            try:
                repl.expect(r"\(Ctrl-D or /exit to quit\)", timeout=1.5)
                break
            except AssertionError:
                continue
        else:
            raise AssertionError(f"no Ctrl-C reached the prompt; got:\n{repl.buf}")
        repl.expect(">>> ")
        _, p2 = turn(repl, "again")
        assert p2 >= p1 + len("\n<user>again\n<assistant>")  # the first turn is still in the conversation
        repl.send("/exit\n")
        assert repl.close() == 0


def _piped(*args, stdin: bytes = b"/exit\n", **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minillm.chat", *args], cwd=ROOT, input=stdin, timeout=120,
                          capture_output=True, **kw)


def test_system_flag_bytes_that_are_not_utf8_are_replaced(model_dir):
    """--system from argv with a byte that is not UTF-8 (a surrogate) is cleaned as a typed line is;
    it was kept, and the template then refused every turn of the session."""
    r = _piped(str(model_dir), "--device", "cpu", "--max-tokens", "2", "--system", b"a\xffb", stdin=b"hi\n")
    out = r.stdout.decode()
    assert r.returncode == 0 and "--system had bytes that are not UTF-8" in out and "refused" not in out
    assert int(STATS.search(out).group(3)) == len("<system>a\ufffdb\n<user>hi\n<assistant>".encode())


def test_a_closed_stdout_stops_quietly(model_dir):
    """| head that has read enough: exit as cat does (141), without a BrokenPipeError traceback."""
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([sys.executable, "-m", "minillm.chat", str(model_dir), "--device", "cpu", "--max-tokens", "2"],
                       cwd=ROOT, input=b"hi\n", stdout=w, stderr=subprocess.PIPE, timeout=120)
    os.close(w)
    assert p.returncode == 141 and p.stderr == b""


def test_text_the_terminal_cannot_encode_is_replaced(model_dir):
    """An ASCII-only stdout gets '?' for what it cannot show (here the model's name), not a traceback."""
    model = model_dir.parent / "mod\u00e8le"
    if not model.exists():
        model.symlink_to(model_dir)
    r = _piped(str(model), "--device", "cpu", "--max-tokens", "2", env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0 and b"mod?le" in r.stdout and b"Traceback" not in r.stderr


def test_closed_stdin_is_one_line_error(model_dir):
    r = subprocess.run([sys.executable, "-m", "minillm.chat", str(model_dir), "--device", "cpu"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.close(0))
    assert r.returncode == 2 and r.stderr.startswith("error: stdin is closed") and r.stderr.count("\n") == 1


def test_bad_max_tokens_is_refused_before_loading():
    """A flag error says so at once: no model is loaded (the path does not even exist)."""
    r = _piped("/no/such/model", "--max-tokens", "0")
    assert r.returncode == 2 and r.stderr.decode() == "error: --max-tokens must be >= 1, got 0\n"


def test_ctrl_c_stops_an_answer_and_keeps_the_session(tiny):
    """Ctrl-C mid-answer: that reply stops (marked interrupted), the next turn runs as usual."""
    with Repl(str(tiny), "--device", "cpu", "--max-tokens", "4000", "--temperature", "0") as repl:
        repl.expect(">>> ")
        repl.send("hello\n")
        repl.expect(r"hello\r?\n")  # the terminal's echo: a Ctrl-C before input() read the line would drop it
        repl.expect(r"\S")  # the answer has begun (4000 tokens take seconds)
        repl.send("\x03")
        m = repl.expect(STATS.pattern + r", interrupted[;\]]")
        assert int(m.group(1)) < 4000
        repl.expect(">>> ")
        repl.send("/reset\n")
        repl.expect(">>> ")
        repl.send("/exit\n")
        assert repl.close() == 0


def test_bad_sampling_flag_is_refused_before_loading():
    """A sampling flag the engine refuses says so at once, as --max-tokens does: it was checked only
    after the model had loaded (seconds on the CPU, a minute with a cold CUDA build); the path does not
    even exist here, and the flag is what gets named."""
    for flag, value, name in (("--temperature", "nan", "temperature"), ("--top-p", "0", "top_p"),
                              ("--top-k", "-2", "top_k")):
        r = _piped("/no/such/model", flag, value)
        err = r.stderr.decode()
        assert r.returncode == 2 and err.startswith(f"error: {name} ") and err.count("\n") == 1, err


def test_a_message_that_begins_with_a_slash(model_dir):
    """//TEXT sends /TEXT (a path, say): a line that began with / could never be sent; an unknown
    command says how. A tab after /system works as a space does (it was an unknown command)."""
    r = _piped(str(model_dir), "--device", "cpu", "--max-tokens", "2",
               stdin=b"//etc/hosts\n/etc/hosts\n/system\tbe brief\nhi\n/exit\n")
    out = r.stdout.decode()
    assert r.returncode == 0 and "unknown command /etc/hosts" in out and "type it as //" in out
    assert "system prompt set" in out
    prompts = [int(m.group(3)) for m in STATS.finditer(out)]
    assert prompts == [len("<user>/etc/hosts\n<assistant>"), len("<system>be brief\n<user>hi\n<assistant>")]


NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>")


def test_a_system_prompt_the_template_refuses_keeps_the_conversation(model_dir):
    """A template with no system role (Gemma's): /system TEXT is refused when given, and the conversation
    stays; it used to say "set", reset the conversation, and then every turn was refused. --system is
    refused at startup."""
    r = _piped(str(model_dir), "--device", "cpu", "--max-tokens", "2", "--chat-template", NO_SYSTEM,
               stdin=b"hi\n/system be brief\nagain\n/exit\n")
    out = r.stdout.decode()
    assert r.returncode == 0 and "the chat template refuses a system prompt: System role not supported" in out
    assert "conversation reset" not in out and "refused the conversation" not in out
    p1, p2 = (int(m.group(3)) for m in STATS.finditer(out))
    assert p1 == len("<user>hi\n<assistant>") and p2 > p1 + len("\n<user>again\n<assistant>")  # the first turn too
    r = _piped(str(model_dir), "--device", "cpu", "--chat-template", NO_SYSTEM, "--system", "be brief")
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith("error: --system: the chat template refuses a system prompt"), err


def test_no_chat_template_names_the_flag_that_gives_one(model_dir, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / "tokenizer_config.json").write_text("{}")
    r = _piped(str(model), "--device", "cpu")
    err = r.stderr.decode()
    assert r.returncode == 2 and "has no chat template; give one with --chat-template FILE" in err, err
