"""ModelRunner: turns a scheduled batch into fixed-size step inputs, runs the model, samples.

All step inputs live in buffers sized once for the largest step (max_num_batched_tokens rows,
max_num_seqs sequences, max_model_len / block_size blocks each): host arrays are filled, then
copied into the backend's buffers of the same shapes. Nothing is allocated per step, which is
what lets the CUDA backend capture a decode step as a graph and replay it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from minillm.backends.compile import env_flag
from minillm.backends.staging import HEADER_INTS, StageFill
from minillm.engine.block_manager import BlockManager
from minillm.engine.penalty_history import NONE, PenaltyHistory
from minillm.engine.readback import TokenReadback
from minillm.engine.sampler import DRAFT_SEED_SALT
from minillm.engine.scheduler import ScheduledSeq
from minillm.engine.structured import ThinkState, add_token
from minillm.models.transformer import StepInputs, Transformer, Workspace

# The runner's on/off switches, read when a runner is made (a garbled value is a start-up error): MINILLM_DEBUG=1
# checks every step's host inputs (_check); MINILLM_DECODE_ORDER=0: decode steps give attention no launch order
# (see StepInputs.attn_order); MINILLM_SHORT_RUN_GRAPHS below.

# batches whose every row gives logits (verification, a drafter's blocks) take the whole-array
# fill from this many sequences: below it the per-sequence loop is faster (CPU dev machine,
# `scripts/host_overhead.py --dflash 8`: 2 sequences 157-168 against 110-114 us a round, 8
# sequences 290-299 against 327-344)
RUNS_FILL_MIN = 8
# verification and drafting graphs also come without the decode kernel's launch, for steps whose
# every run takes the tensor-core attention (Runner._short_runs_only); MINILLM_SHORT_RUN_GRAPHS=0:
# one graph a shape, that launch always in it (A/B runs)
SHORT_RUNS = "short_runs"  # the third part of such a graph's key
# decode graphs that stop at the logits (the third part of their key): steps whose logits are
# changed before sampling (penalties, logit_bias, min_tokens, structured outputs) replay one and
# run the changes and the sampler eagerly after it, instead of the whole step eagerly
FORWARD_ONLY = "forward_only"
DEFERRED = "deferred"  # the first part of a launch handle whose sampling finish_sampling() runs
BEHIND_NEXT = "behind_next"  # launch(readback=...): the ids' copy rides on the next upload
DRAW_DRAFTS = "draw_drafts"  # launch(greedy=...): a drafter's step drawing each row from its q


@dataclass
class GraphPick:
    """The graph a step replays (Runner._graph_for): its bucket, rows a sequence, and whether it
    samples (False: a FORWARD_ONLY graph, the sampler left to the caller)."""

    bucket: int
    rows: int
    graph: object
    samples: bool = True


@dataclass
class BlockAdvance:
    """How a windowed runner's blocks (a DFlash drafting step) follow a verification step the host
    has not read yet (ModelRunner.launch's advance): the block of sequence i starts where that
    step leaves it, rows[i] + a of the verification's sampled ids, a its leading accepted drafts
    among drafts[i] (0 for a plain decode or a prompt's last chunk: rows[i] is then its one
    logits row). The host fills the step as if a were 0 (the other rows' ids: `fill_id`, the
    drafter's mask) and the device moves each block by its a and writes its first id
    (backend.advance_blocks) between the upload and the forward."""

    tokens: object  # the verification's sampled ids (its runner's out_tokens, on the device)
    accepted: object  # its accept flags (out_accepted, on the device)
    rows: np.ndarray  # int32 [B]
    drafts: np.ndarray  # int32 [B]
    fill_id: int


class StepBuffers:
    """Named arrays of fixed size, a host copy and a backend copy each, packed for cheap uploads.

    Everything lives in one byte buffer (host and device alike; each name is a typed view at a
    16-byte aligned offset), arrays whose length follows the same count side by side at one stride
    (the step's logits rows, sequences, tokens: their `kind`), so a step's inputs reach the device
    in one backend.stage_inputs call that moves only the rows the step uses, a run per kind
    (minillm/backends/staging.py): on the GPU one kernel reading them from pinned host memory, where
    the whole buffer's copy (33 KB at 2,048 tokens) and the block tables' took 13 us around a 0.8 ms
    decode graph (part316). Rows past a step's counts keep what earlier steps left: nothing reads
    them.

    The arrays the sampler writes on the device (out_tokens, out_accepted) sit at the end and
    are never uploaded: with async scheduling step n + 1's inputs are uploaded while step n's
    sampled ids are still needed on the device (its input ids are filled from them) and still
    being copied to the host.
    """

    def __init__(self, backend, max_tokens: int, max_seqs: int, max_logits: int, max_blocks: int):
        self.backend = backend
        specs = {  # name: (shape, dtype, kind); a kind's arrays sit together, in this order
            "seeds": ((max_logits,), np.uint64, "logits"),  # first: the only 8-byte type
            "logits_indices": ((max_logits,), np.int32, "logits"),
            "temperature": ((max_logits,), np.float32, "logits"),
            "top_p": ((max_logits,), np.float32, "logits"),
            "top_k": ((max_logits,), np.int32, "logits"),
            "min_p": ((max_logits,), np.float32, "logits"),  # 0: off
            "sample_pos": ((max_logits,), np.int32, "logits"),
            "draft_tokens": ((max_logits,), np.int32, "logits"),  # a drafted token to verify per row, or -1
            # per logits row: where to take its draft_tokens entry from in the drafter's out_tokens,
            # or -1 (draft_tokens holds it)
            "draft_src": ((max_logits,), np.int32, "logits"),
            # per logits row: the row of the drafter's logits (draft_q's) its draft was drawn from,
            # the draft's q, or -1 (a deterministic draft: q one-hot)
            "draft_q_rows": ((max_logits,), np.int32, "logits"),
            "seq_lens": ((max_seqs,), np.int32, "seqs"),
            "query_start": ((max_seqs + 1,), np.int32, "seqs"),
            # a drafting step launched behind the verification it follows (BlockAdvance), per
            # block: the sequence's first logits row in the verification, its drafts there, the
            # block's start had none been accepted, and the last start its block table fits
            "adv_row": ((max_seqs,), np.int32, "seqs"),
            "adv_drafts": ((max_seqs,), np.int32, "seqs"),
            "adv_base": ((max_seqs,), np.int32, "seqs"),
            "adv_limit": ((max_seqs,), np.int32, "seqs"),
            # a decode step's rows, longest context first: the order decode attention starts
            # their work in (a permutation of every row of the step, padding rows included); in
            # a step with long query runs, the rows of its short ones (StepInputs.decode_rows)
            "attn_order": ((max_seqs,), np.int32, "rows"),
            "block_tables": ((max_seqs, max_blocks), np.int32, "table"),
            "input_ids": ((max_tokens,), np.int32, "tokens"),  # the fill's ids: first of its run
            "positions": ((max_tokens,), np.int32, "tokens"),
            "slot_mapping": ((max_tokens,), np.int32, "tokens"),
            # per token row: where to take its input id from in the previous step's out_tokens
            # (async scheduling: that id is not on the host yet) or, in a verification step, in
            # the drafter's (its drafts are not on the host yet), or -1 (input_ids holds it)
            "src_rows": ((max_tokens,), np.int32, "tokens"),  # last of its run
            # from here on: written on the device by the sampler, never uploaded
            "out_tokens": ((max_logits,), np.int32, "out"),
            "out_accepted": ((max_logits,), np.int32, "out"),  # 1 where the row's draft was accepted
        }

        def padded(shape, dtype) -> int:
            return -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 16) * 16

        # runs: consecutive arrays of one kind and element size, each at the run's widest stride
        groups: list[list[str]] = []
        for name, (_, dtype, kind) in specs.items():
            last = specs[groups[-1][0]] if groups else None
            if last is not None and last[2] == kind and np.dtype(last[1]).itemsize == np.dtype(dtype).itemsize:
                groups[-1].append(name)
            else:
                groups.append([name])
        offsets, size, self._runs = {}, 0, []  # runs: (kind, offset, stride, arrays, bytes a count unit)
        for names in groups:
            shape, dtype, kind = specs[names[0]]
            stride = max(padded(specs[n][0], specs[n][1]) for n in names)
            for j, name in enumerate(names):
                offsets[name] = size + j * stride
            if kind != "out":
                unit = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
                self._runs.append((kind, size, stride, len(names), unit))
            size += stride * len(names)
        self._fill_run = next(k for k, run in enumerate(self._runs) if run[0] == "tokens")
        self._runs_cache: dict[tuple[int, int, int], list] = {}
        self.packed_host = np.zeros(size, np.uint8)
        self.packed_dev = backend.zeros((size,), np.uint8)
        backend.ensure_staging(2 * (HEADER_INTS * 4 + size))  # two of the largest uploads (every row)

        def view(buf, name):
            shape, dtype, _ = specs[name]
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            return buf[offsets[name] : offsets[name] + n].view(dtype).reshape(shape)

        self.host = {name: view(self.packed_host, name) for name in specs}
        self.dev = {name: view(self.packed_dev, name) for name in specs}
        # the Sequence.block_version each host block-table row holds, -1 for none (see _prepare_decode)
        self.table_rows = np.full(max_seqs, -1, np.int64)
        self.table_lens = np.zeros(max_seqs, np.int64)  # each cached row's table length (the decode fill's guard)
        self.iota = np.arange(max(max_seqs, max_blocks) + 1, dtype=np.int32)  # 0, 1, 2, ...: sliced

    def runs(self, num_seqs: int, num_tokens: int, num_logits: int) -> list[tuple[int, int, int, int]]:
        """What a step of num_seqs sequence slots, num_tokens token rows and num_logits logits rows
        reads of each array, as backend.stage_inputs runs (offset, stride, arrays, bytes): every
        array to its count, a sequence array one further (query_start has num_seqs + 1 entries)."""
        key = (num_seqs, num_tokens, num_logits)
        runs = self._runs_cache.get(key)
        if runs is None:
            counts = {"logits": num_logits, "seqs": num_seqs + 1, "rows": num_tokens, "table": num_seqs,
                      "tokens": num_tokens}
            runs = [(offset, stride, n, min(-(-counts[kind] * unit // 16) * 16, stride))
                    for kind, offset, stride, n, unit in self._runs]
            if len(self._runs_cache) >= 4096:  # eager steps' shapes vary without end
                self._runs_cache.clear()
            self._runs_cache[key] = runs
        return runs

    def upload(self, num_seqs: int, num_tokens: int, num_logits: int, fill_from=None, copy_out=None) -> None:
        """Send the rows of the step inputs that a step of these counts reads (runs); fill_from
        (the previous step's out_tokens, on the device): then take the input id of every token
        row whose src_rows entry is >= 0 from it (async scheduling, fill_input_ids' rule);
        copy_out (device ids, pinned host row): copy those to the host in the same launch (a
        deferred readback, TokenReadback.defer).

        Two steps in flight do not corrupt each other's inputs: the backend copies the rows out of
        the host arrays at once (on the GPU into its pinned staging ring, which the device reads,
        fresh space each step, reused only after the transfers queued before it finished), so
        prepare may refill them for the next step while this one is still queued."""
        fill = None
        if fill_from is not None:
            fill = StageFill(self._fill_run, 0, self._runs[self._fill_run][3] - 1, num_tokens, fill_from)
        self.backend.stage_inputs(self.packed_dev, self.packed_host, self.runs(num_seqs, num_tokens, num_logits),
                                  fill, copy_out)


class ModelRunner:
    """Step buffers, the forward and sampling of one model, and its CUDA graphs.

    causal=False and transform_logits (applied to the logits rows in place before sampling) are
    fixed per runner, not per step, so the function a graph captures is the same one an eager step
    runs: a DFlash drafter's runner is built with both, and with logits_window (first, count): its
    steps are blocks (a sequence's last token, then its draft ids), and each block gives logits only
    for its rows [first, first + count) (rows 1..k, the drafts: the LM head of the other rows took
    0.11 ms of a 16-sequence 8B round, part120, computed and never read; _prepare_blocks fills
    them). after_forward(x, num_tokens), when set,
    runs right after each sampled step's forward, inside its graph too (the DFlash context update,
    which reads the hidden states the forward wrote to capture_out).
    """

    # the environment's switches (read in __init__); these defaults serve runners the tests build bare
    debug = False
    decode_order = True

    # a step's sequences with at most this many queries take the decode attention kernel when
    # others take the prefill kernel (0: the backend does not split, NumPy); set from the backend
    decode_max_q = 0
    num_decode_rows: int | None = None  # prepare(): StepInputs.decode_rows' length
    logits_window: tuple[int, int] | None = None  # (first, count): see the class docstring
    # a drafter's sampled ids on the device (DFlash; the engine sets it): a verification step
    # takes the drafts of sequences with seq.draft_row >= 0 from there, before its forward
    draft_source = None
    # a drafter that samples its drafts at temperature > 0 (DFlash, the draft model; the engine sets
    # it): its `logits` hold each draft's q and `launches` counts its drafting steps (the draft
    # model's: rounds), so a verification step gives the sampler the q rows of the drafts from the
    # latest one (seq.draft_q)
    draft_q = None
    _advance: BlockAdvance | None = None  # the step being launched follows a verification (launch)

    def __init__(self, model: Transformer, backend, kv, block_manager: BlockManager,
                 max_tokens: int, max_seqs: int, max_logits: int, max_model_len: int,
                 causal: bool = True, transform_logits: Callable[[object], None] | None = None,
                 logits_window: tuple[int, int] | None = None,
                 select_drafts: Callable[[object, object, object, object], None] | None = None):
        max_vocab = getattr(backend, "max_sample_vocab", None)  # the NumPy sampler has no limit
        if max_vocab is not None and model.cfg.vocab_size > max_vocab:
            raise ValueError(f"the {backend.name} backend's sampler handles vocabularies up to {max_vocab} ids; "
                             f"this model has {model.cfg.vocab_size}: run it on the CPU backend (--device cpu)")
        self.model = model
        self.backend = backend
        self.kv = kv
        self.bm = block_manager
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.max_logits = max_logits
        self.max_blocks = -(-max_model_len // block_manager.block_size)
        # one spare sequence slot: a CUDA graph's padding sequence
        self.buf = StepBuffers(backend, max_tokens, max_seqs + 1, max_logits, self.max_blocks)
        # logits_window: a step's logits rows are at most max_seqs x count (a drafter's fp32
        # logits buffer then holds k rows a sequence, not block_size)
        logits_rows = max_logits if logits_window is None else min(max_logits, max_seqs * logits_window[1])
        self.ws = Workspace(backend, model.cfg, max_tokens, logits_rows)
        self.eos_ids = list(model.cfg.eos_token_ids)
        # hidden states after these layers are written to capture_out (a DFlash drafter's context)
        self.capture_layers: tuple[int, ...] = ()
        self.capture_out = None
        self.last_inputs: StepInputs | None = None
        self.causal = causal
        self.transform_logits = transform_logits
        self.logits_window = logits_window
        # a DFlash2 drafter's candidate selector, in place of the sampler's argmax: (logits rows,
        # their final normed hidden rows, the step's input ids, out_tokens rows)
        self.select_drafts = select_drafts
        # the target's structured-output masks (engine/structured.py's GrammarCompiler; set by the
        # engine, None in a drafter's runner: drafts ignore the constraint, verification applies it)
        self.grammars = None
        self.after_forward: Callable[[StepInputs, int], None] | None = None
        self.graphs: dict = {}
        self._spec_k = 0  # rows per sequence of a verification graph, minus one
        # a draft model's runner: runs of up to 1 + _spec_k new tokens without drafts, sampling
        # only their last row, also replay the (bucket, 1 + _spec_k) graphs (DraftModelProposer)
        self.catch_up_graphs = False
        self.replay_timer = None  # a benchmark may wrap graph replays to time them
        self.replays = 0  # graph replays so far (tests check that graphs were used)
        self.num_fill = 0  # rows of the prepared step whose input id comes from the device
        self.fills_from_drafts = False  # the prepared step's fills read draft_source
        self.draft_fills = 0  # steps that took drafts from the device (tests read it)
        self.readback = TokenReadback(backend, max_logits)  # async scheduling's result copies
        self.decode_max_q = int(getattr(backend, "decode_max_q", 0))
        # the device's short-run rule, for the graphs without the decode kernel (0: none captured)
        self.debug = env_flag("MINILLM_DEBUG", False, "the runner's host-side checks of every step")
        self.decode_order = env_flag("MINILLM_DECODE_ORDER", True, "0: decode steps give the attention no launch order")
        short_graphs = env_flag("MINILLM_SHORT_RUN_GRAPHS", True, "0: no graphs without the decode kernel's launch")
        self.short_run_max_ctx = int(getattr(backend, "short_run_max_ctx", 0)) if short_graphs else 0
        self.short_run_min_seqs = int(getattr(backend, "short_run_min_seqs", 1))  # StepInputs.short_runs
        self.short_run_replays = 0  # replays of graphs without the decode kernel (tests read it)
        self.forward_only_replays = 0  # replays of FORWARD_ONLY graphs (tests read it)

    def prepare(self, batch: list[ScheduledSeq]) -> tuple[int, int]:
        """Fill the host buffers for this step; returns (num_tokens, num_logit_rows)."""
        if self.logits_window is not None:  # a drafter's blocks: the only steps such a runner runs
            t, r = self._prepare_blocks(batch)
            self.max_query_len = batch[0].num_new
        # from two sequences on, ~15 whole-array ops beat a loop of as many small ones per sequence
        elif len(batch) > 1 and all(item.decode for item in batch):
            t = r = self._prepare_decode(batch)
            self.max_query_len = 1
        else:
            runs = len(batch) >= RUNS_FILL_MIN and all(
                item.num_logits == item.num_new and not item.seq.num_pending and item.src_row < 0 for item in batch)
            t, r = self._prepare_runs(batch) if runs else self._prepare_any(batch)
            self.max_query_len = max(item.num_new for item in batch)  # attention's launch hint
        h = self.buf.host
        self.num_decode_rows = None
        if self.max_query_len == 1 and self.decode_order:  # the longest contexts' attention starts first
            n = min(t, h["attn_order"].shape[0])
            h["attn_order"][:n] = np.argsort(-h["seq_lens"][:n], kind="stable")
        elif self.max_query_len > self.decode_max_q > 0:
            self._prepare_decode_rows(len(batch))
        if self.debug:
            self._check(batch, t)
        return t, r

    def _prepare_blocks(self, batch: list[ScheduledSeq]) -> tuple[int, int]:
        """prepare() for a windowed runner's step (logits_window): a block of n rows a sequence,
        its last token then n - 1 draft ids (a DFlash drafter's masks). Fills what _prepare_runs
        fills for such a step, with the logits rows kept to [first, first + count) of each block,
        in whole-array ops: this fill is on a speculative round's critical path (the device waits
        for the drafting step's launch)."""
        h = self.buf.host
        bs = self.bm.block_size
        B = len(batch)
        n = batch[0].num_new
        first, count = self.logits_window
        seqs = [item.seq for item in batch]
        adv = self._advance  # blocks behind a verification not yet read: their own start unknown
        if first + count > n or any(item.num_new != n or item.num_draft != n - 1 or item.seq.num_pending
                                    or (adv is None and (item.start != item.seq.num_tokens - 1
                                                         or len(item.seq.draft_ids) < n - 1))
                                    for item in batch) or (adv is not None and len(adv.rows) != B):
            raise ValueError(f"logits_window {self.logits_window}: a step of blocks of {first + count}+ rows, "
                             "each a sequence's last token and its draft ids, was expected")
        t = B * n
        starts = np.fromiter((item.start for item in batch), np.int64, B)
        ids = h["input_ids"][:t].reshape(B, n)
        if adv is None:
            ids[:, 0] = [s.token(s.num_tokens - 1) for s in seqs]
            ids[:, 1:] = [s.draft_ids[: n - 1] for s in seqs]
        else:  # the device writes each block's first id (advance_blocks)
            ids[:, 0] = 0
            ids[:, 1:] = adv.fill_id
        pos = starts[:, None] + np.arange(n)  # [B, n]
        block = pos // bs
        lens = np.fromiter((len(s.block_table) for s in seqs), np.int64, B)
        if (block[:, -1] >= lens).any():
            raise IndexError("prepare: a position past its sequence's block table")
        if adv is not None:
            h["adv_row"][:B] = adv.rows
            h["adv_drafts"][:B] = adv.drafts
            h["adv_base"][:B] = starts
            h["adv_limit"][:B] = lens * bs - n  # the last start whose block the table holds
        tables = self._fill_block_tables(seqs)
        h["positions"][:t] = pos.ravel()
        h["slot_mapping"][:t] = (tables[np.arange(B)[:, None], block] * bs + pos % bs).ravel()
        h["src_rows"][:t] = -1
        h["seq_lens"][:B] = starts + n
        h["query_start"][: B + 1] = np.arange(B + 1) * n
        # the window's rows: row j of a block samples position start + j + 1 and checks draft j
        # (the last row none)
        r = B * count
        win = np.arange(first, first + count)
        h["logits_indices"][:r] = (np.arange(B)[:, None] * n + win).ravel()
        self._fill_sampling(seqs, r, count)
        h["sample_pos"][:r] = (pos[:, first : first + count] + 1).ravel()
        drafts = ids[:, 1:] if first + count < n else np.c_[ids[:, 1:], np.full(B, -1)]
        h["draft_tokens"][:r] = drafts[:, first : first + count].ravel()
        h["draft_src"][:r] = -1
        h["draft_q_rows"][:r] = -1
        self.fills_from_drafts = False
        self.num_fill = 0
        return t, r

    def _logits_rows(self, T: int, seqs: int) -> int:
        """Logits rows of a graph of T token rows over seqs sequences."""
        if self.catch_up_graphs:  # a draft model's steps sample one row a sequence
            return seqs
        return T if self.logits_window is None else seqs * self.logits_window[1]

    def _prepare_decode_rows(self, B: int) -> None:
        """A step with long query runs (prefill chunks): attention runs the sequences of at most
        decode_max_q queries (decodes riding along) with the decode kernel, the others with the
        prefill kernel. attn_order gets the short sequences' rows, longest context first, so the
        decode kernel's grid covers only them (a grid over every row measured 48-59 us a layer of
        CTAs that only exit in an 8,192-token prefill step, part85). Left unset (the kernel then
        walks every row) when they do not fit the buffer."""
        h = self.buf.host
        qs = h["query_start"][: B + 1]
        qlen = np.diff(qs)
        short = np.flatnonzero((qlen >= 1) & (qlen <= self.decode_max_q))
        n = int(qlen[short].sum())
        if n > h["attn_order"].shape[0]:
            return
        short = short[np.argsort(-h["seq_lens"][short], kind="stable")]
        lens = qlen[short]
        # row i of the list: its sequence's first row plus its offset inside the sequence
        firsts = np.repeat(qs[short] - (np.cumsum(lens) - lens), lens)
        h["attn_order"][:n] = firsts + self.buf.iota[:n]
        self.num_decode_rows = n

    def _prepare_decode(self, batch: list[ScheduledSeq]) -> int:
        """prepare() for a batch of plain decodes (the common step), with whole-array NumPy ops
        instead of a Python loop of small array writes per sequence; fills exactly what
        _prepare_any would."""
        h = self.buf.host
        bs = self.bm.block_size
        B = len(batch)
        seqs = [item.seq for item in batch]
        pos = np.array([item.start for item in batch], dtype=np.int32)
        if any(s.num_pending for s in seqs):  # async scheduling: some last tokens are still in flight
            h["input_ids"][:B] = [0 if s.num_pending else (s.output_ids or s.prompt_ids)[-1] for s in seqs]
            src = [s.pending_row if s.num_pending else -1 for s in seqs]
            h["src_rows"][:B] = src
            self.num_fill = B - src.count(-1)
        else:
            h["input_ids"][:B] = [(s.output_ids or s.prompt_ids)[-1] for s in seqs]  # the last token
            h["src_rows"][:B] = -1
            self.num_fill = 0
        h["positions"][:B] = pos
        block, offset = np.divmod(pos, bs)
        tables = self._fill_block_tables(seqs)
        # a position past its table would read the table row's zero padding: block 0, another
        # sequence's keys, written over without a fault (_prepare_runs and _prepare_blocks raise too);
        # the lengths cached with the rows keep a per-sequence loop off this, the every-step fill
        if (block >= self.buf.table_lens[:B]).any():
            raise IndexError("prepare: a position past its sequence's block table")
        iota = self.buf.iota
        h["slot_mapping"][:B] = tables[iota[:B], block] * bs + offset
        pos += 1
        h["seq_lens"][:B] = pos
        h["sample_pos"][:B] = pos  # where each sample goes
        h["query_start"][: B + 1] = iota[: B + 1]
        h["logits_indices"][:B] = iota[:B]
        self._fill_sampling(seqs, B, 1)
        h["draft_tokens"][:B] = -1
        h["draft_src"][:B] = -1
        h["draft_q_rows"][:B] = -1
        self.fills_from_drafts = False
        return B

    def _fill_sampling(self, seqs: list, rows: int, each) -> None:
        """The sampling parameters of `rows` logits rows: `each` consecutive rows a sequence (an
        int, or one count a sequence), in whole-array ops (the whole-array fills' shared part)."""
        h, B = self.buf.host, len(seqs)
        h["temperature"][:rows] = np.repeat(np.fromiter((s.params.temperature for s in seqs), np.float32, B), each)
        h["top_p"][:rows] = np.repeat(np.fromiter((s.params.top_p for s in seqs), np.float32, B), each)
        h["top_k"][:rows] = np.repeat(np.fromiter((s.params.top_k for s in seqs), np.int32, B), each)
        h["min_p"][:rows] = np.repeat(np.fromiter((s.params.min_p for s in seqs), np.float32, B), each)
        h["seeds"][:rows] = np.repeat(np.fromiter((s.seed for s in seqs), np.uint64, B), each)

    def _fill_block_tables(self, seqs: list) -> np.ndarray:
        """Host block-table rows 0..B-1 for seqs (the whole-array fills'). A sequence's table
        changes only when it gains or loses a block (every block_size tokens), or its row goes to
        another sequence, so only rows whose cached version differs are rewritten (a full rebuild
        cost O(batch x context) every step)."""
        tables = self.buf.host["block_tables"]
        held = self.buf.table_rows
        B = len(seqs)
        versions = np.fromiter((s.block_version for s in seqs), np.int64, B)
        for b in np.flatnonzero(held[:B] != versions).tolist():
            table = seqs[b].block_table
            row = tables[b]
            row[: len(table)] = table
            row[len(table) :] = 0  # a reused row keeps no stale entries
            self.buf.table_lens[b] = len(table)
        held[:B] = versions
        return tables

    def _prepare_runs(self, batch: list[ScheduledSeq]) -> tuple[int, int]:
        """prepare() for a batch whose every row gives logits and whose input ids are all on the
        host: speculative verification (1 + k rows a sequence) and a drafter's blocks. Whole-array
        ops instead of _prepare_any's ~12 small ones a sequence (a rejected DFlash round prepares
        two such steps); fills exactly what _prepare_any would."""
        h = self.buf.host
        bs = self.bm.block_size
        B = len(batch)
        seqs = [item.seq for item in batch]
        n = np.fromiter((item.num_new for item in batch), np.int64, B)
        starts = np.fromiter((item.start for item in batch), np.int64, B)
        qs = np.zeros(B + 1, np.int64)
        np.cumsum(n, out=qs[1:])
        t = int(qs[-1])
        ids: list[int] = []
        drafts: list[int] = []
        on_device = self._drafts_on_device(batch)
        src: list[int] = []
        q_rows: list[int] = []
        for item in batch:
            seq, start, m, k = item.seq, item.start, item.num_new, item.num_draft
            end, total = start + m, seq.num_tokens
            ids += seq.tokens(start, min(end, total))  # positions past the end hold its drafts
            ids += seq.draft_ids[max(0, start - total) : max(0, end - total)]
            # row j checks draft j; the last row samples the bonus token (every row gives logits:
            # k is m - 1, or 0 when scoring)
            drafts += seq.draft_ids[:k] + [-1] * (m - k)
            q = self._draft_q_row(seq, k)
            if q is None:  # stale q: plain rows
                drafts[len(drafts) - m :] = [-1] * m
            q_rows += [q + j for j in range(k)] + [-1] * (m - k) if q is not None and q >= 0 else [-1] * m
            if on_device:  # a verification run: its last k rows hold the drafts
                row = seq.draft_row if k and q is not None else -1
                src += [-1] * (m - k) + [row + j for j in range(k)] if row >= 0 else [-1] * m
        if len(ids) != t or len(drafts) != t:
            raise ValueError(f"prepare: {len(ids)} input ids and {len(drafts)} draft rows for {t} rows")
        of_seq = np.repeat(np.arange(B), n)  # each row's sequence
        pos = (np.repeat(starts - qs[:-1], n) + np.arange(t)).astype(np.int32)
        block = pos // bs
        lens = np.fromiter((len(s.block_table) for s in seqs), np.int64, B)
        if (block >= lens[of_seq]).any():
            raise IndexError("prepare: a position past its sequence's block table")
        tables = self._fill_block_tables(seqs)
        h["input_ids"][:t] = ids
        if on_device:
            # row j checks the draft that row j + 1 takes as input (a run's last row: the next
            # run's first, which is -1), so the logits rows' sources are the token rows' shifted
            h["src_rows"][:t] = src
            h["draft_src"][: t - 1] = h["src_rows"][1:t]
            h["draft_src"][t - 1] = -1
        else:
            h["src_rows"][:t] = -1
            h["draft_src"][:t] = -1
        self.fills_from_drafts = on_device
        h["positions"][:t] = pos
        h["slot_mapping"][:t] = tables[of_seq, block] * bs + pos % bs
        h["seq_lens"][:B] = starts + n
        h["query_start"][: B + 1] = qs
        h["logits_indices"][:t] = np.arange(t)
        self._fill_sampling(seqs, t, n)
        h["sample_pos"][:t] = pos + 1  # where each sample goes
        h["draft_tokens"][:t] = drafts
        h["draft_q_rows"][:t] = q_rows
        self.num_fill = 0
        return t, t

    def _prepare_any(self, batch: list[ScheduledSeq]) -> tuple[int, int]:
        """prepare() for any batch: prefill chunks, drafts to verify, a drafter's steps, scoring."""
        h = self.buf.host
        bs = self.bm.block_size
        t = 0
        r = 0
        fill = 0
        on_device = self._drafts_on_device(batch)
        h["query_start"][0] = 0
        h["block_tables"][: len(batch)] = 0
        self.buf.table_rows[: len(batch)] = -1  # rewritten here, outside the decode fill's cache
        for b, item in enumerate(batch):
            seq, n, start = item.seq, item.num_new, item.start
            end, total = start + n, seq.num_tokens
            # positions past the sequence's end hold its speculative drafts
            ids = seq.tokens(start, min(end, total)) + seq.draft_ids[max(0, start - total) : max(0, end - total)]
            h["src_rows"][t : t + n] = -1
            if seq.num_pending:  # async scheduling: the id at position `known` is still in flight
                known = seq.num_known_tokens
                assert seq.num_pending == 1 and start <= known < end, "one token in flight, computed here"
                ids.insert(known - start, 0)
                h["src_rows"][t + known - start] = seq.pending_row
                fill += 1
            if item.src_row >= 0:  # a draft model's chained step: its input, the last draft, on the device
                assert n == 1 and not seq.num_pending, "a chained step computes one known position"
                h["src_rows"][t] = item.src_row
                fill += 1
            row = seq.draft_row if on_device and item.num_draft else -1
            if row >= 0:  # its drafts (positions from `total` on) are still on the device
                h["src_rows"][t + total - start : t + n] = np.arange(row, row + end - total)
            h["input_ids"][t : t + n] = ids
            pos = np.arange(start, start + n, dtype=np.int32)
            h["positions"][t : t + n] = pos
            table = np.asarray(seq.block_table, dtype=np.int32)
            h["slot_mapping"][t : t + n] = table[pos // bs] * bs + pos % bs
            h["block_tables"][b, : len(table)] = table
            h["seq_lens"][b] = start + n
            t += n
            h["query_start"][b + 1] = t
            m = item.num_logits
            if m:
                p = seq.params
                h["logits_indices"][r : r + m] = np.arange(t - m, t)
                h["temperature"][r : r + m] = p.temperature
                h["top_p"][r : r + m] = p.top_p
                h["top_k"][r : r + m] = p.top_k
                h["min_p"][r : r + m] = p.min_p
                h["seeds"][r : r + m] = seq.seed
                h["sample_pos"][r : r + m] = np.arange(end - m + 1, end + 1)  # where each sample goes
                # verification rows: row j checks draft j; the last row samples the bonus token
                k = item.num_draft
                h["draft_tokens"][r : r + m] = -1
                h["draft_src"][r : r + m] = -1
                h["draft_q_rows"][r : r + m] = -1
                if k:
                    h["draft_tokens"][r + m - k - 1 : r + m - 1] = seq.draft_ids[:k]
                    q = self._draft_q_row(seq, k)
                    if q is None:  # stale q: plain rows
                        h["draft_tokens"][r + m - k - 1 : r + m - 1] = -1
                    elif q >= 0:
                        h["draft_q_rows"][r + m - k - 1 : r + m - 1] = np.arange(q, q + k)
                    if row >= 0 and q is not None:
                        h["draft_src"][r + m - k - 1 : r + m - 1] = np.arange(row, row + k)
                r += m
        if fill and on_device:
            raise ValueError("prepare: ids in flight from the previous step and drafts on the device in one step")
        self.num_fill = fill
        self.fills_from_drafts = on_device
        return t, r

    def _draft_q_row(self, seq, k: int) -> int | None:
        """The drafter's logits row of seq's first draft when its k drafts were drawn from those
        rows' distributions (draft_q), -1 when they were drawn deterministically (q one-hot), or
        None when they came from an older drafting step than the latest, whose q rows that step
        has overwritten: those drafts are then not verified (their rows sample as plain rows,
        accepting none), since verifying a drawn draft against any other q is not lossless."""
        dq = self.draft_q
        if dq is None or not k or seq.draft_q is None:
            return -1
        launch, row = seq.draft_q
        return row if launch == dq.launches else None

    def _drafts_on_device(self, batch: list[ScheduledSeq]) -> bool:
        """Whether some sequence verifies drafts its drafter left on the device (seq.draft_row)."""
        return self.draft_source is not None and any(item.num_draft and item.seq.draft_row >= 0 for item in batch)

    def _check(self, batch: list[ScheduledSeq], t: int) -> None:
        """MINILLM_DEBUG=1: every index the kernels will read is inside the pool and owned, and each row's
        slot is its position's in its own sequence's block table."""
        bs = self.bm.block_size
        limit = self.bm.num_blocks * bs
        slots = self.buf.host["slot_mapping"][:t]
        positions = self.buf.host["positions"][:t]
        r = 0
        for item in batch:
            table = item.seq.block_table
            for j in range(item.num_new):
                p = item.start + j
                if positions[r + j] != p or p // bs >= len(table) or slots[r + j] != table[p // bs] * bs + p % bs:
                    raise AssertionError(f"row {r + j} of {item.seq.request_id}: position {positions[r + j]}, slot "
                                         f"{slots[r + j]}; its position {p} is block {p // bs} of a table of "
                                         f"{len(table)}")
            r += item.num_new
        if r != t:
            raise AssertionError(f"{t} token rows for a batch of {r}")
        if slots.size and (slots.min() < 0 or slots.max() >= limit):
            raise AssertionError(f"slot index outside the pool [0, {limit}): {slots.min()}..{slots.max()}")
        if len(set(slots.tolist())) != len(slots):
            raise AssertionError("two tokens of one step write the same KV slot")
        owner: dict[int, str] = {}
        for item in batch:
            self.bm.check_sequence(item.seq)
            # every block this step writes (from `start`: a drafter may trail the target) is private
            first_writable = min(item.start, item.seq.num_computed) // self.bm.block_size
            for b in item.seq.block_table[first_writable:]:
                if b in owner or self.bm.ref_count[b] != 1:
                    raise AssertionError(f"block {b} written by {item.seq.request_id} is shared")
                owner[b] = item.seq.request_id

    def _suppress_stop_tokens(self, batch: list[ScheduledSeq], logits) -> None:
        """min_tokens: rows of sequences still short of it may not sample EOS or a stop token."""
        if not any(item.seq.params.min_tokens for item in batch):
            return  # the usual case: nothing to mask
        rows, ids = [], []
        r = 0
        for item in batch:
            seq, p = item.seq, item.seq.params
            first_pos = item.start + item.num_new - item.num_logits + 1  # where row 0's sample goes
            for j in range(item.num_logits):
                if first_pos + j - seq.num_prompt_tokens < p.min_tokens:  # outputs before this one
                    banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.eos_ids))
                    rows += [r] * len(banned)
                    ids += banned
                r += 1
        if rows:
            rows, ids = np.asarray(rows, np.int32), np.asarray(ids, np.int32)
            keep = ids < logits.shape[-1]  # past a row's vocabulary (a drafter's draft_vocab_size): never sampled
            self.backend.suppress_tokens(logits, rows[keep], ids[keep])

    def _adjust_logits(self, batch: list[ScheduledSeq], logits) -> None:
        """Penalties and logit_bias (SamplingParams) on the rows of sequences that ask for them.
        Penalties read the tokens so far: the engine keeps such steps synchronous, so a row's
        history is the sequence's known ids, and for a verification row j also drafts 0 .. j - 1
        (the tokens that row would follow were they accepted)."""
        if not any(item.seq.params.adjusts_logits for item in batch):
            return
        parts = []
        r = 0
        for item in batch:
            p = item.seq.params
            if item.num_logits and p.adjusts_logits:
                for j in range(item.num_logits):
                    if j == 0 or p.penalized:  # a logit bias alone is the same on every row
                        ids, pos, neg, sub = self._adjustments(item.seq, item.seq.draft_ids[:j])
                        # ids past the logits' vocabulary (a drafter's draft_vocab_size) are never sampled
                        keep = ids < logits.shape[-1]
                        ids, pos, neg, sub = ids[keep], pos[keep], neg[keep], sub[keep]
                    parts.append((np.full(ids.shape[0], r + j, np.int32), ids, pos, neg, sub))
            r += item.num_logits
        if parts:
            self.backend.penalize_logits(logits, *(np.concatenate(c) for c in zip(*parts)))

    def _constrain_logits(self, batch: list[ScheduledSeq], logits) -> None:
        """Structured outputs: every sampling row of a constrained sequence keeps only the tokens
        its grammar allows there, after the penalties and bias (nothing can lift a ban); row j of a
        verification step as if drafts 0 .. j - 1 were accepted. The changes run once the previous
        step's ids are accepted (a synchronous step, or async scheduling's finish_sampling), so a
        matcher has consumed every token before this step's. Rows of a thinking model's thinking
        (structured.ThinkState) are left alone; a row that may open the thinking allows <think> too."""
        if self.grammars is None or not any(item.seq.grammar is not None for item in batch):
            return
        rows, jobs, first_rows, opens = [], [], [], []  # first_rows, opens: rows that may open a thinking
        r = 0
        for item in batch:
            g, seq = item.seq.grammar, item.seq
            if g is not None and item.samples and item.num_logits:
                drafts = seq.draft_ids[: item.num_draft]
                a, may_open = ThinkState.rows(seq.think_state, drafts, seq.params.think_token_ids)
                if a is not None:
                    jobs.append((g, drafts[a:]))
                    rows.extend(range(r + a, r + item.num_logits))
                if may_open:
                    (opens if a == 0 else first_rows).append((r, g, seq.params.think_token_ids[0]))
            r += item.num_logits
        masks = self.grammars.next_token_masks(jobs) if jobs else np.zeros((0, self.grammars.words), np.int32)
        if first_rows:  # row 0 of a step whose later rows think: the matcher's first mask, apart
            masks = np.concatenate([masks, self.grammars.next_token_masks([(g, []) for _, g, _ in first_rows])])
            rows.extend(r0 for r0, _, _ in first_rows)
        for r0, _, start in opens + first_rows:
            add_token(masks, rows.index(r0), start)
        if rows:
            self.backend.mask_logits(logits, np.asarray(rows, np.int32), masks)

    def _allow_tokens(self, batch: list[ScheduledSeq], logits) -> None:
        """allowed_token_ids (SamplingParams): every sampling row of such a sequence keeps only its
        tokens, through the structured outputs' mask kernel (with a constraint too, a token must
        pass both)."""
        rows, masks = [], []
        r = 0
        for item in batch:
            m = item.seq.allowed_mask
            if m is not None and item.samples and item.num_logits:
                rows.extend(range(r, r + item.num_logits))
                masks.extend([m] * item.num_logits)
            r += item.num_logits
        if rows:
            self.backend.mask_logits(logits, np.asarray(rows, np.int32), np.stack(masks))

    def _ban_bad_words(self, batch: list[ScheduledSeq], logits) -> None:
        """bad_words (SamplingParams): in each sampling row, a word's last token is banned where the
        output so far (for verification row j, with drafts 0 .. j - 1) ends with its other tokens."""
        rows, ids = [], []
        r = 0
        for item in batch:
            words = item.seq.bad_word_ids
            if words and item.samples:
                longest = max(len(w) for w in words)
                tail = list(item.seq.output_ids[-longest:])  # the output's end is all a word can match
                drafts = [int(t) for t in item.seq.draft_ids[: item.num_draft]]
                for j in range(item.num_logits):
                    seen = tail + drafts[:j]
                    for w in words:
                        n = len(w) - 1  # the tokens before the banned one
                        if n == 0 or (len(seen) >= n and tuple(seen[len(seen) - n:]) == w[:-1]):
                            rows.append(r + j)
                            ids.append(w[-1])
            r += item.num_logits
        if rows:
            self.backend.suppress_tokens(logits, np.asarray(rows, np.int32), np.asarray(ids, np.int32))

    @staticmethod
    def _adjustments(seq, drafted: list[int] = ()) -> tuple[np.ndarray, ...]:
        """(token ids, scale of a positive logit, of a negative one, amount subtracted), each token
        once: repetition on prompt and output tokens, frequency and presence on output tokens (and
        `drafted`, the drafts a verification row follows), then the logit bias (subtracting its
        negative)."""
        p = seq.params
        out_ids = counts = rep_ids = NONE
        if p.penalized:  # the sequence's history, updated with the tokens since the last step (not rebuilt)
            if seq.penalty_history is None:
                seq.penalty_history = PenaltyHistory(seq.prompt_ids, p.repetition_penalty != 1)
            seq.penalty_history.update(seq.output_ids)
            out_ids, counts, seen = seq.penalty_history.with_drafts(drafted)
            if seen is not None:
                rep_ids = seen  # prompt and output ids: every output id among them
        bias_ids = np.fromiter(p.logit_bias or {}, np.int64)
        ids = rep_ids if rep_ids.size else out_ids
        if bias_ids.size:
            ids = np.union1d(ids, bias_ids)
        pos, neg = np.ones(ids.shape[0], np.float32), np.ones(ids.shape[0], np.float32)
        if rep_ids.size:
            if ids is rep_ids:
                pos[:], neg[:] = 1 / np.float32(p.repetition_penalty), np.float32(p.repetition_penalty)
            else:
                at = np.minimum(np.searchsorted(rep_ids, ids), rep_ids.shape[0] - 1)
                seen = rep_ids[at] == ids
                pos[seen], neg[seen] = 1 / np.float32(p.repetition_penalty), np.float32(p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            amount = (p.frequency_penalty * counts + p.presence_penalty * (counts > 0)).astype(np.float32)
            sub = amount if ids is out_ids else np.zeros(ids.shape[0], np.float32)
            if ids is not out_ids:
                sub[np.searchsorted(ids, out_ids)] = amount
        else:
            sub = np.zeros(ids.shape[0], np.float32)
        if p.logit_bias:
            sub[np.searchsorted(ids, bias_ids)] -= np.fromiter(p.logit_bias.values(), np.float32)
        return ids.astype(np.int32), pos, neg, sub

    # ---- running a step --------------------------------------------------------------------
    def _inputs(self, B: int, t: int, r: int, max_query_len: int, prepared: bool = False,
                seqs: int | None = None) -> StepInputs:
        """The step's device inputs. prepared: the step prepare() just filled (an eager step), so
        its decode_rows may be passed; graphs are captured and replayed without them. seqs: the
        most real sequences the step holds (default B; a graph's bucket), which sets short_runs."""
        d = self.buf.dev
        decode = self.decode_order and max_query_len == 1 and t <= d["attn_order"].shape[0]
        order = d["attn_order"][:t] if decode else None
        n = self.num_decode_rows if prepared else None  # prepare() sets it for split steps only
        return StepInputs(d["input_ids"][:t], d["positions"][:t], d["slot_mapping"][:t],
                          d["block_tables"][:B], d["seq_lens"][:B], d["query_start"][: B + 1],
                          d["logits_indices"][:r], max_query_len, order,
                          None if n is None else d["attn_order"][:n],
                          (B if seqs is None else seqs) >= self.short_run_min_seqs)

    def _forward(self, x: StepInputs, t: int, r: int, after_forward: bool = True):
        """Forward, after_forward, transform_logits: the device work of a step up to sampling,
        shared by eager steps and graph captures so the two cannot drift apart."""
        logits = self.model.forward(x, t, r, self.kv, self.ws, causal=self.causal,
                                    capture_layers=self.capture_layers, capture_out=self.capture_out)
        if after_forward and self.after_forward is not None:
            self.after_forward(x, t)
        if self.transform_logits is not None:
            self.transform_logits(logits)
        return logits

    def _upload(self, num_seqs: int, t: int, r: int) -> None:
        """Upload the step's inputs; with async scheduling, the same launch takes the input ids of
        rows whose token the previous step sampled from that step's out_tokens, on the device, and
        copies a deferred readback of those ids to the host (TokenReadback.defer); in a
        verification step, two fills then take the drafts still on the device from the drafter's
        out_tokens (input ids and the sampler's draft_tokens alike). Stream order puts this after
        the previous step's (or the drafter's) sampler and before this step's forward (none of it
        is part of a graph: a graph replays right after it)."""
        d = self.buf.dev
        plain_fill = self.num_fill and not self.fills_from_drafts
        pending = self.readback.pending()  # the previous step's ids, still to copy to the host
        copy_out = None if pending is None else (pending[1], self.readback.slot(pending[0]))
        self.buf.upload(num_seqs, t, r, fill_from=d["out_tokens"] if plain_fill else None, copy_out=copy_out)
        if pending is not None:
            self.readback.queued(pending[0])
        if self.fills_from_drafts:
            self.backend.fill_input_ids(d["input_ids"][:t], self.draft_source, d["src_rows"][:t])
            self.backend.fill_input_ids(d["draft_tokens"][:r], self.draft_source, d["draft_src"][:r])
            self.draft_fills += 1
        adv = self._advance
        if adv is not None:  # each block moved past its accepted drafts, read on the device
            B, (n, (first, count)) = len(adv.rows), (self.max_query_len, self.logits_window)
            self.backend.advance_blocks(d["input_ids"], d["positions"], d["slot_mapping"], d["seq_lens"],
                                        d["sample_pos"], d["block_tables"], self.bm.block_size, adv.tokens,
                                        adv.accepted, d["adv_row"][:B], d["adv_drafts"][:B], d["adv_base"][:B],
                                        d["adv_limit"][:B], n, first, count)

    def _eager_forward(self, B: int, t: int, r: int, after_forward: bool = True):
        """Upload the prepared step and launch its forward (no graph); returns the logits rows."""
        self._upload(B, t, r)
        x = self._inputs(B, t, r, self.max_query_len, prepared=True)
        logits = self._forward(x, t, r, after_forward)
        self.last_inputs, self.last_num_tokens = x, t
        return logits

    def _forward_and_sample(self, B: int, t: int, r: int, max_query_len: int, short_runs_only: bool = False,
                            sample: bool = True):
        """The device work of a decode step: exactly what a CUDA graph captures and replays.
        short_runs_only: every run takes the tensor-core attention kernel (an empty decode_rows
        hint: no decode-kernel launch; _short_runs_only says when a step may replay such a graph).
        sample=False: up to the logits (a FORWARD_ONLY graph)."""
        x = self._inputs(B, t, r, max_query_len, seqs=B - 1)  # B - 1: the bucket (+ padding slot)
        if short_runs_only:
            x.decode_rows = self.buf.dev["attn_order"][:0]
        logits = self._forward(x, t, r)
        if sample:
            self._sample(logits, r)
        return x, logits

    def _sample(self, logits, r: int) -> None:
        d = self.buf.dev
        if self.select_drafts is not None:
            self.select_drafts(logits, self.ws.last[:r], d["input_ids"], d["out_tokens"][:r])
            return
        q = {} if self.draft_q is None else {"draft_logits": self.draft_q.logits, "draft_rows": d["draft_q_rows"][:r]}
        self.backend.sample(logits, d["temperature"][:r], d["top_p"][:r], d["top_k"][:r],
                            d["seeds"][:r], d["sample_pos"][:r], d["out_tokens"][:r],
                            d["draft_tokens"][:r], d["out_accepted"][:r], min_p=d["min_p"][:r], **q)

    def _results(self, r: int, verifying: bool) -> np.ndarray:
        """The sampled tokens (host); after a verification step also self.last_accepted."""
        d = self.buf.dev
        if verifying:
            self.last_accepted = self.backend.to_host(d["out_accepted"][:r]).copy()
        return self.backend.to_host(d["out_tokens"][:r]).copy()

    def execute(self, batch: list[ScheduledSeq], sample: bool = True, greedy: bool = False) -> np.ndarray:
        """Run one step; returns the sampled token of every logits row (host int32), or with
        sample=False the logits rows themselves (host float32). greedy=True takes every row's
        argmax whatever the requests ask (drafters: their proposals are deterministic). Rows that
        verify a draft also leave their accept flags in self.last_accepted."""
        if not sample:
            t, r = self.prepare(batch)
            # scoring skips after_forward: no decoding step follows it
            logits = self._eager_forward(len(batch), t, r, after_forward=False)
            return self.backend.to_host(logits).astype(np.float32)
        return self.collect(self.launch(batch, greedy))

    def launch(self, batch: list[ScheduledSeq], greedy: bool | str = False, readback: bool | str = False,
               advance: BlockAdvance | None = None, defer_sampling: bool = False) -> tuple:
        """The device half of a sampling step: prepare, upload, then the forward and the sampler
        (a graph replay or eager launches), without waiting for them. Returns the handle collect()
        takes: (logits rows, whether rows verify drafts, readback ticket or None). Between the two
        the host is free (the engine renders the previous step's text there) while the device runs.

        greedy=True (a drafter proposing deterministically) takes every row's argmax; greedy=
        DRAW_DRAFTS (a drafter drawing from its q) samples each row with its request's parameters
        and a salted seed, verifying nothing.

        readback=True (async scheduling, early drafting) also enqueues the copy of the sampled ids
        (and a verification's accept flags) to the host behind the sampler, so collect() waits
        for this step only, even once later steps have been launched; the ids stay in out_tokens
        for the next step's fill_input_ids. readback=BEHIND_NEXT (async scheduling's plain steps,
        whose next launch comes before this one's collect): the copy rides on this runner's next
        upload instead of a launch of its own, or collect() queues it if none came.

        advance (a windowed runner's blocks only): the step follows a verification step whose
        results the host has not read; see BlockAdvance.

        defer_sampling=True: a step whose logits change before sampling (a FORWARD_ONLY graph or an
        eager forward) stops after the forward and returns a handle for finish_sampling(), which
        applies the changes and samples: async scheduling launches such a step's forward before
        the previous step's ids reach the host, and its penalties and grammar masks, which need
        those ids, once they have."""
        if advance is not None and self.logits_window is None:
            raise ValueError("launch: advance is for a windowed runner's blocks")
        self._advance = advance
        try:
            return self._launch(batch, greedy, readback, defer_sampling)
        finally:
            self._advance = None

    def finish_sampling(self, handle: tuple) -> tuple:
        """The rest of a launch(defer_sampling=True): the logit changes (which now read every id
        before this step's) and the sampler; returns the handle collect() takes. A launch that
        sampled already returns its handle unchanged."""
        if handle[0] != DEFERRED:
            return handle
        _, batch, logits, r, verifying, readback = handle
        self._change_and_sample(batch, logits, r)
        return r, verifying, self._start_readback(r, verifying, readback) if readback else None

    def _launch(self, batch: list[ScheduledSeq], greedy: bool | str, readback: bool | str,
                defer: bool = False) -> tuple:
        t, r = self.prepare(batch)
        if greedy == DRAW_DRAFTS:  # a drafter drawing each row from its q: the request's sampling
            # parameters, a sampled row's seed salted (independent of the verification's draws)
            h = self.buf.host
            salt = np.uint64(DRAFT_SEED_SALT)
            h["seeds"][:r] ^= np.where(h["temperature"][:r] > 0, salt, np.uint64(0))
            h["draft_tokens"][:r] = -1
        elif greedy:  # a drafter's own step: argmax everywhere, nothing to verify
            self.buf.host["temperature"][:r] = 0.0
            self.buf.host["draft_tokens"][:r] = -1
        verifying = not greedy and any(item.num_draft for item in batch)
        B = len(batch)
        pick = self._graph_for(batch, t)
        logits = None  # set where the changes and the sampler are still to run
        if pick is not None:
            self._replay(pick, B, t, r)
            if not pick.samples:
                logits = self.ws.logits[:r]
        else:
            logits = self._eager_forward(B, t, r)
        if logits is not None and r:
            if defer:
                return DEFERRED, batch, logits, r, verifying, readback
            self._change_and_sample(batch, logits, r)
        return r, verifying, self._start_readback(r, verifying, readback) if readback and r else None

    def _start_readback(self, r: int, verifying: bool, readback: bool | str = True):
        """The copy of the sampled ids (and a verification's accept flags) to the host, behind the
        sampler; readback=BEHIND_NEXT: the ids' copy is deferred to the next upload (TokenReadback.defer)."""
        if readback == BEHIND_NEXT and not verifying:
            return self.readback.defer(self.buf.dev["out_tokens"][:r])
        ticket = self.readback.start(self.buf.dev["out_tokens"][:r])
        if verifying:  # and its accept flags, copied behind the same step
            ticket = (ticket, self.readback.start(self.buf.dev["out_accepted"][:r]))
        return ticket

    def _change_and_sample(self, batch: list[ScheduledSeq], logits, r: int) -> None:
        """min_tokens, penalties, logit_bias, structured outputs and allowed_token_ids on the step's
        logits, then the sampler (eager launches, after an eager forward or a FORWARD_ONLY graph)."""
        if self.logits_window is None:  # (a windowed drafter's argmax: its drafts only)
            self._suppress_stop_tokens(batch, logits)
            self._adjust_logits(batch, logits)
            self._constrain_logits(batch, logits)
            self._allow_tokens(batch, logits)
            self._ban_bad_words(batch, logits)
        self._sample(logits, r)

    def collect(self, handle: tuple) -> np.ndarray:
        """Wait for a launched step; its sampled tokens (host int32), accept flags in last_accepted."""
        if handle[0] == DEFERRED:
            raise RuntimeError("collect: the step's sampling was deferred; finish_sampling() it first")
        r, verifying, ticket = handle
        if r == 0:
            return np.zeros(0, dtype=np.int32)
        if ticket is not None:
            if verifying:
                ids, flags = ticket
                self.last_accepted = self.readback.wait(flags)
                return self.readback.wait(ids)
            return self.readback.wait(ticket)
        return self._results(r, verifying)

    # ---- CUDA graphs ------------------------------------------------------------------------
    # A graph is captured per (bucket of sequences Bk, rows per sequence: 1 for decode, 1 + k for
    # speculative verification or a DFlash drafter's block). It always runs Bk + 1 sequence slots
    # and Bk x rows tokens: the real sequences first, then one padding sequence (seq_len 0, slots
    # -1) that takes the leftover rows, then empty ones. Every per-step value is read from the step
    # buffers, so one capture replays for any batch that fits its bucket.

    def capture_graphs(self, buckets: list[int], rows_per_seq: list[int], forward_only: bool = False) -> None:
        """Capture a graph per bucket and rows per sequence (1: decode; 1 + k: a verification
        step, or a DFlash drafter's block of 1 + k rows), where the step buffers hold it; runs of
        2+ rows also get a graph without the decode kernel's launch (_short_runs_only), and with
        forward_only (the target's runner) decode steps also one that stops at the logits."""
        self.graphs: dict[tuple, object] = {}
        self.graph_buckets = sorted(buckets)
        self._spec_k = max(rows_per_seq) - 1  # the row count _graph_for gives items with drafts
        for rows in rows_per_seq:
            for bk in self.graph_buckets:
                T = bk * rows
                R = self._logits_rows(T, bk)
                if T > self.max_tokens or R > self.max_logits or bk > self.max_seqs:
                    continue
                self._pad(0, 0, 0, bk, T, R)
                self.buf.upload(bk + 1, T, R)
                self._forward_and_sample(bk + 1, T, R, rows)  # eager once: loads every kernel
                self.graphs[(bk, rows)] = self.backend.capture_graph(
                    lambda bk=bk, T=T, R=R, rows=rows: self._forward_and_sample(bk + 1, T, R, rows))
                if 1 < rows <= self.decode_max_q and self.short_run_max_ctx > 0 and bk >= self.short_run_min_seqs:
                    self.graphs[(bk, rows, SHORT_RUNS)] = self.backend.capture_graph(
                        lambda bk=bk, T=T, R=R, rows=rows: self._forward_and_sample(bk + 1, T, R, rows, True))
                if forward_only and rows == 1:
                    self.graphs[(bk, rows, FORWARD_ONLY)] = self.backend.capture_graph(
                        lambda bk=bk, T=T, R=R, rows=rows: self._forward_and_sample(bk + 1, T, R, rows, sample=False))
        self.backend.synchronize()

    def _graph_for(self, batch: list[ScheduledSeq], t: int) -> GraphPick | None:
        graphs = getattr(self, "graphs", None)
        if not graphs:
            return None
        rows = 1
        changed = False  # some row's logits change between forward and sampler
        for item in batch:
            if item.all_logits or not item.samples:
                return None  # prefill chunks run eagerly
            if item.num_new != 1 + item.num_draft:
                # a draft model's catch-up (catch_up_graphs): its last token and the one before
                # it, which it drafted but had not seen (every draft accepted), one logits row
                if not self.catch_up_graphs or item.num_draft or item.num_new > 1 + self._spec_k:
                    return None  # prefill chunks run eagerly
                rows = 1 + self._spec_k
            if item.num_draft:
                if item.num_draft > self._spec_k:
                    return None  # more rows than any graph has (the attention hint would be short)
                rows = 1 + self._spec_k
            # min_tokens bans stop tokens; penalties, a bias or a grammar change logits too
            if (len(item.seq.output_ids) + item.seq.num_pending < item.seq.params.min_tokens
                    or item.seq.params.adjusts_logits):
                changed = True
        bk = next((b for b in self.graph_buckets if b >= len(batch) and (b, rows) in graphs), None)
        if bk is None or t > bk * rows:
            return None
        if changed:  # a graph that stops at the logits, or (none captured for these rows) eager
            g = graphs.get((bk, rows, FORWARD_ONLY))
            if g is None:
                return None
            self.forward_only_replays += 1
            return GraphPick(bk, rows, g, samples=False)
        if (bk, rows, SHORT_RUNS) in graphs and self._short_runs_only(len(batch), t, bk * rows):
            self.short_run_replays += 1
            return GraphPick(bk, rows, graphs[(bk, rows, SHORT_RUNS)])
        return GraphPick(bk, rows, graphs[(bk, rows)])

    def _short_runs_only(self, B: int, t: int, T: int) -> bool:
        """Whether every real run of the prepared step goes to the tensor-core attention kernel (2+
        queries, at most short_run_max_ctx keys: the device's rule, cuda/common.cuh
        short_run_on_tensor_cores, on the keys the device will see), and the padding run is not a
        one-row run (the decode kernel's; a padding run of more than 16 rows may be no kernel's and
        keep what Workspace.attn held, which only padding rows read), so its graph may leave out the decode
        kernel's launch, whose CTAs would all exit (36 launches of ~3 us in an 8B verification
        step, docs/BENCHMARKS.md)."""
        h = self.buf.host
        nq = np.diff(h["query_start"][: B + 1])
        keys = h["seq_lens"][:B]
        if self._advance is not None:  # a drafting step behind a verification: the device moves each
            keys = keys + self._advance.drafts  # block past up to drafts[i] accepted ids (advance_blocks)
        return (T - t != 1 and int(nq.min()) >= 2 and int(keys.max()) <= self.short_run_max_ctx)

    def _pad(self, B: int, t: int, r: int, bk: int, T: int, R: int) -> None:
        """Fill slots [B, bk + 1) and rows [t, T), [r, R) of the host buffers with padding."""
        h = self.buf.host
        h["input_ids"][t:T] = 0
        h["positions"][t:T] = 0
        h["slot_mapping"][t:T] = -1  # padding rows write no KV
        h["block_tables"][B : bk + 1] = 0
        self.buf.table_rows[B : bk + 1] = -1
        h["seq_lens"][B : bk + 1] = 0  # no keys: attention writes zeros for a run of 1-16 rows
        h["query_start"][B + 1] = T  # the padding sequence takes every leftover row
        h["query_start"][B + 2 : bk + 2] = T
        h["logits_indices"][r:R] = 0
        h["temperature"][r:R] = 0.0
        h["top_p"][r:R] = 1.0
        h["top_k"][r:R] = -1
        h["min_p"][r:R] = 0.0
        h["seeds"][r:R] = 0
        h["sample_pos"][r:R] = 0
        h["draft_tokens"][r:R] = -1
        h["draft_src"][r:R] = -1
        h["draft_q_rows"][r:R] = -1
        h["src_rows"][t:T] = -1
        lo, hi = (min(i, h["attn_order"].shape[0]) for i in (t, T))
        h["attn_order"][lo:hi] = self.buf.iota[lo:hi]  # padding rows last, as they come

    def _replay(self, pick: GraphPick, B: int, t: int, r: int) -> None:
        bk, rows, g = pick.bucket, pick.rows, pick.graph
        T = bk * rows
        R = self._logits_rows(T, bk)
        self._pad(B, t, r, bk, T, R)
        self._upload(bk + 1, T, R)
        self.replays += 1
        if self.replay_timer is not None:  # benchmarks: device time of the graph alone
            self.replay_timer(g.replay)
        else:
            g.replay()
        self.last_inputs, self.last_num_tokens = self._inputs(bk + 1, T, R, rows, seqs=bk), T
