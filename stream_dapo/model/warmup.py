"""Supervised warm-up of the tiny model, so that RL starts from a policy with signal.

DAPO starts from a pretrained model that already answers some questions; a freshly initialised tiny
model answers none, every group is all-wrong, dynamic sampling drops them all and RL has nothing to
learn from. ``stream-dapo warmup`` fixes that in a few CPU minutes:

1. build the synthetic data and the untrained model (``init-model``) if they are missing;
2. train on the train split's worked solutions with plain torch and AdamW, loss on the response
   tokens only (the prompt is context, not a target), linear warm-up then cosine decay; with
   ``warmup.reference_min_greedy``, this schedule runs again from where it left the weights until
   greedy pass@1 reaches that floor (at most ``warmup.reference_max_rounds`` rounds, then a clear
   error that keeps the weights reached in ``<model.path>.below-floor``, from which a build with more
   rounds goes on), so that a build lands past the task's transition (see "Why fold a temperature");
   and, with ``warmup.slip_rate`` (the long chain task), ``warmup.slip_steps`` more on solutions
   with that share of their additions off by one (``stream_dapo.data.longcot.draw_slips``): the
   warm model learns the task first, then to slip where it adds (RL's headroom on that task);
3. fold a sampling temperature into the weights (``warmup.fold_temperature``, see below);
4. measure pass@1 on a slice of the eval split with transformers ``generate`` (greedy and at
   temperature 1.0) and the verifier;
5. save the model and tokenizer, and write the marker file last.

The output directory is keyed by a hash of everything that determines the weights (task, data seed,
architecture, init seed, warm-up settings): a second call with the same settings
finds the marker and returns at once, a call with other settings rebuilds the directory.

Why fold a temperature. A tiny model learns this task through an abrupt transition (copying operands
from the question clicks after ~1000-1500 steps), so stopping part-way lands anywhere between 5% and
80% depending on the seed. The warm-up therefore trains past the transition (greedy accuracy ~85%)
and then divides the logits by ``fold_temperature`` (1.8: temperature-1 pass@1 ~30%). The result is
a policy that knows the format and the arithmetic but samples like a high-entropy base model: most
groups are mixed, and RL has something real to sharpen, which is what DAPO's entropy machinery
(Clip-Higher) is about. Set it to 1.0 to keep the trained distribution.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_dapo.config import Config, DataConfig, ModelConfig
from stream_dapo.data.dataset import PromptItem, load_prompts
from stream_dapo.data.longcot import ChainProblem, draw_slips
from stream_dapo.data.synthetic import ensure_synthetic_data, synthetic_task_key
from stream_dapo.errors import ConfigError
from stream_dapo.model.tiny import (
    TinyModelSpec,
    check_replaceable,
    default_init_dir,
    fingerprint,
    init_key,
    init_model,
    publish_dir,
    read_marker,
    write_marker,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "FloorNotReached",
    "PassAtOne",
    "WarmupResult",
    "ensure_warm_model",
    "is_default_model_path",
    "measure_pass_at_1",
    "synthetic_data_dir",
    "tiny_spec",
    "train_until_floor",
    "warmup",
    "warmup_key",
]

log = logging.getLogger(__name__)

# Bump when the training procedure changes in a way that changes the weights.
_WARMUP_VERSION = 1

DEFAULT_MODEL_PATH = Path(ModelConfig.model_fields["path"].default)
"""The embedded default's cache of the warm tiny model (relative: to the working directory, or to the
repository checkout that holds configs/tiny-cpu.toml)."""
LONGCOT_MODEL_PATH = Path("runs/tiny-longcot-model/warm")
"""The long chain-of-thought recipe's cache (configs/tiny-longcot-cpu.toml)."""
BUILT_MODEL_PATHS = (DEFAULT_MODEL_PATH, LONGCOT_MODEL_PATH)
"""The caches a run builds on first use; a model.path anywhere else must already hold a model."""
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class PassAtOne:
    """Accuracy of one response per prompt on ``num_prompts`` eval prompts."""

    greedy: float
    sampled: float
    """At temperature 1.0, top-p 1.0: what rollouts see."""
    num_prompts: int
    mean_response_len: float
    """Of the sampled responses, in tokens."""


@dataclass(frozen=True)
class WarmupResult:
    path: Path
    cached: bool
    pass_at_1: PassAtOne | None
    train_seconds: float
    final_loss: float | None


class FloorNotReached(ConfigError):
    """The reference phase stayed below ``warmup.reference_min_greedy`` for all its rounds."""

    def __init__(self, message: str, rounds: Sequence[float] = ()) -> None:
        super().__init__(message)
        self.rounds = list(rounds)
        """Greedy pass@1 after each round, the earlier builds' rounds included."""


def synthetic_data_dir(cfg: Config) -> Path:
    """Where the synthetic splits are written: ``run.out_dir/data``."""
    return Path(cfg.run.out_dir) / "data"


def warmup_key(cfg: Config, spec: TinyModelSpec) -> str:
    """Hash of everything that determines the warm weights."""
    w = cfg.warmup
    payload = {
        "version": _WARMUP_VERSION,
        "data": synthetic_task_key(cfg.data),
        "init": init_key(spec, w.seed),
        "steps": w.steps,
        "batch_size": w.batch_size,
        "lr": w.lr,
        "fold_temperature": w.fold_temperature,
        "seed": w.seed,
    }
    # Added later: left out at their defaults so that older caches stay valid.
    if w.max_solution_tokens:
        payload["max_solution_tokens"] = w.max_solution_tokens
    if w.batch_by_length:
        payload["batch_by_length"] = True
    if w.slip_rate:
        payload["slip"] = {"rate": w.slip_rate, "steps": w.slip_steps, "lr": w.slip_lr}
    if w.threads != 2:
        payload["threads"] = w.threads
    if w.reference_min_greedy:
        # Not the round limit: a build that reaches the floor has the same weights under any limit.
        payload["reference_floor"] = {"min_greedy": w.reference_min_greedy, "prompts": w.track_prompts}
    return fingerprint(payload)


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def build_examples(
    items: Sequence[PromptItem],
    tokenizer: PreTrainedTokenizerBase,
    *,
    slip_rate: float = 0.0,
    seed: int = 0,
) -> list[tuple[list[int], int]]:
    """(prompt ids + solution ids + EOS, prompt length) for every item with a worked solution.

    ``slip_rate`` > 0 (chain task): each solution is reworked with that share of its forward lines
    off by one (``draw_slips``), drawn from a generator seeded by ``seed`` and the prompt's id."""
    examples = []
    eos = [tokenizer.eos_token_id]
    for item in items:
        solution = item.extra_info.get("solution")
        if not isinstance(solution, str):
            raise ValueError(
                f"prompt {item.prompt_id} has no extra_info['solution']; the warm-up trains on the "
                "synthetic task's worked solutions (leave data.train_path unset)"
            )
        if slip_rate:
            problem = ChainProblem.parse(item.messages[-1]["content"])
            rng = random.Random(f"stream-dapo/warmup/slips/{seed}/{item.prompt_id}")
            solution = problem.worked(draw_slips(problem, rng, slip_rate))
        response = tokenizer(solution, add_special_tokens=False)["input_ids"]
        examples.append((item.prompt_token_ids + response + eos, len(item.prompt_token_ids)))
    return examples


def _collate(
    examples: Sequence[tuple[list[int], int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 on prompt and padding)."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, prompt_len) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
        labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
    return input_ids, mask, labels


def _lr_factor(step: int, total: int) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to 10% of the peak."""
    warm = max(1, total // 20)
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


LENGTH_CHUNK_BATCHES = 50
"""With by-length batching, examples are sorted by length within chunks of this many batches."""


def _batches(
    lengths: Sequence[int], batch_size: int, gen: torch.Generator, *, by_length: bool
) -> Iterator[list[int]]:
    """Index batches forever, epoch by epoch, each epoch a fresh seeded permutation (a remainder
    smaller than a batch is dropped).

    ``by_length``: each chunk of ``LENGTH_CHUNK_BATCHES`` batches of the permutation is sorted by
    length before it is cut, and the epoch's batches are then shuffled, so a batch pads to a length
    near its own examples' instead of the longest of a random draw. With long-tailed lengths this
    halves the padded tokens; batch composition is still random within a length band.
    """
    import torch

    while True:
        order = torch.randperm(len(lengths), generator=gen).tolist()
        usable = len(order) - len(order) % batch_size
        if not by_length:
            for start in range(0, usable, batch_size):
                yield order[start : start + batch_size]
            continue
        chunk = batch_size * LENGTH_CHUNK_BATCHES
        batches: list[list[int]] = []
        for start in range(0, usable, chunk):
            part = sorted(order[start : min(start + chunk, usable)], key=lambda i: lengths[i])
            batches += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
        for b in torch.randperm(len(batches), generator=gen).tolist():
            yield batches[b]


def train_supervised(
    model: PreTrainedModel,
    examples: Sequence[tuple[list[int], int]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    pad_id: int,
    threads: int = 1,
    log_every: int = 200,
    by_length: bool = False,
    stop_after: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> float:
    """AdamW on the response tokens; batches are drawn epoch-wise from a seeded permutation.

    The loss is the token-mean cross-entropy of the response tokens (the prompt is context, not a
    target). ``threads``: torch intra-op threads, at every step (the weights depend on it: two
    threads split some reductions differently from one). ``by_length``: batches of similar lengths
    (see ``_batches``). ``stop_after``: return after that many of the ``steps`` (the lr schedule is still
    the one of ``steps``). ``on_step(step, loss)`` is called after every optimizer step. Returns the
    mean loss over the last 10% of steps (of the steps run, with ``stop_after``).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    torch.set_num_threads(threads)
    model.train()
    batches = _batches([len(ids) for ids, _ in examples], batch_size, gen, by_length=by_length)
    tail_losses: list[float] = []
    run_steps = steps if stop_after is None else min(steps, stop_after)
    t0 = time.perf_counter()
    for step in range(run_steps):
        batch = [examples[i] for i in next(batches)]
        input_ids, mask, labels = _collate(batch, pad_id)
        for group in optimizer.param_groups:
            group["lr"] = lr * _lr_factor(step, steps)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= run_steps - max(1, run_steps // 10):
            tail_losses.append(loss.item())
        if on_step is not None:
            on_step(step, loss.item())
        if log_every and (step + 1) % log_every == 0:
            log.info(
                "warm-up step %d/%d loss %.4f (%.1f s, %d threads)",
                step + 1,
                steps,
                loss.item(),
                time.perf_counter() - t0,
                threads,
            )
    model.eval()
    return sum(tail_losses) / len(tail_losses)


def fold_temperature(model: PreTrainedModel, temperature: float) -> None:
    """Scale the final norm's weight by ``1/temperature``: every logit is divided by ``temperature``.

    Qwen2 computes ``logits = E @ (norm.weight * rms_normalise(h))`` with no bias, so this is exact:
    sampling the saved model at temperature 1 is sampling the trained one at ``temperature``. The
    embeddings are tied to the output layer, which is why the norm, not ``lm_head``, carries it.
    """
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None or not hasattr(norm, "weight"):
        raise TypeError(f"{type(model).__name__} has no final norm at model.norm to fold a temperature into")
    import torch

    with torch.no_grad():
        norm.weight.div_(temperature)


# --------------------------------------------------------------------------------------------------
# pass@1 with transformers
# --------------------------------------------------------------------------------------------------


def _generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[int]],
    *,
    sample: bool,
    max_new_tokens: int,
    seed: int,
    batch_size: int = 64,
) -> list[list[int]]:
    """Response token ids (EOS and padding stripped) for each prompt."""
    import torch
    from transformers import GenerationConfig

    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=1.0 if sample else None,
        top_k=0 if sample else None,  # transformers' default top_k=50 would not be temperature-1 sampling
        top_p=1.0 if sample else None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    outputs: list[list[int]] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            width = max(len(p) for p in chunk)
            # Left padding so that every row's next token follows its own last prompt token.
            ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in chunk])
            mask = (
                torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in chunk])[:, None]
            ).long()
            out = model.generate(  # type: ignore[operator]  # transformers' stubs type it as a Tensor
                input_ids=ids, attention_mask=mask, generation_config=config
            )
            for row in out[:, width:].tolist():
                if eos_id in row:
                    row = row[: row.index(eos_id)]
                while row and row[-1] == pad_id:
                    row.pop()
                outputs.append(row)
    return outputs


def measure_pass_at_1(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[PromptItem],
    *,
    max_new_tokens: int,
    seed: int = 0,
) -> PassAtOne:
    """Greedy and temperature-1.0 accuracy, one response per prompt, scored by the verifier."""
    greedy, _ = accuracy(model, tokenizer, items, sample=False, max_new_tokens=max_new_tokens, seed=seed)
    sampled, lengths = accuracy(
        model, tokenizer, items, sample=True, max_new_tokens=max_new_tokens, seed=seed
    )
    return PassAtOne(
        greedy=greedy, sampled=sampled, num_prompts=len(items), mean_response_len=sum(lengths) / len(lengths)
    )


def accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[PromptItem],
    *,
    sample: bool,
    max_new_tokens: int,
    seed: int = 0,
) -> tuple[float, list[int]]:
    """Share of ``items`` whose one response (greedy, or at temperature 1.0) the verifier accepts,
    and the responses' lengths in tokens."""
    from stream_dapo.verifier import verify

    prompts = [item.prompt_token_ids for item in items]
    responses = _generate(model, tokenizer, prompts, sample=sample, max_new_tokens=max_new_tokens, seed=seed)
    correct = [
        verify(str(tokenizer.decode(resp, skip_special_tokens=True)), item.gold).correct
        for resp, item in zip(responses, items, strict=True)
    ]
    return sum(correct) / len(correct), [len(r) for r in responses]


# --------------------------------------------------------------------------------------------------
# The warm-up as a whole
# --------------------------------------------------------------------------------------------------


def _progress_tracker(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[PromptItem],
    cfg: Config,
    phase: str,
    last: int,
    progress: list[dict[str, Any]],
) -> Callable[[int, float], None]:
    """An ``on_step`` for ``train_supervised`` that appends greedy pass@1 on ``items`` to
    ``progress`` every ``warmup.track_every`` steps (0: never) and after the phase's ``last`` step
    (always: the reference floor reads that point). Greedy decoding
    draws no random numbers and the model has no dropout, so tracking leaves the weights as they
    would be without it."""
    every = cfg.warmup.track_every

    def on_step(step: int, loss: float) -> None:
        if step + 1 != last and not (every and (step + 1) % every == 0):
            return
        model.eval()
        greedy, lengths = accuracy(
            model, tokenizer, items, sample=False, max_new_tokens=cfg.algo.max_response_len
        )
        model.train()
        progress.append(
            {
                "phase": phase,
                "step": step + 1,
                "loss": loss,
                "greedy": greedy,
                "mean_response_len": sum(lengths) / len(lengths),
            }
        )
        log.info("warm-up %s step %d: greedy pass@1 %.3f on %d prompts", phase, step + 1, greedy, len(items))

    return on_step


_ROUND_SEED_STRIDE = 1000
"""Round r > 0 of the reference phase draws its batch order from seed ``warmup.seed + r * 1000``
(round 0 from ``warmup.seed``, the slip phase from ``warmup.seed + 1``)."""


def train_until_floor(
    run_round: Callable[[int], float], *, floor: float, max_rounds: int, done: Sequence[float] = ()
) -> list[float]:
    """Call ``run_round(len(done))``, ``run_round(len(done) + 1)``, ... until the figure one returns
    (greedy pass@1 after that round) reaches ``floor``; return every round's figure, ``done`` (the
    figures of rounds an earlier build ran, all below the floor) first. Each round trains on from where
    the last one left the weights. With ``max_rounds`` rounds below it, raise ``FloorNotReached``."""
    reached = list(done)
    for index in range(len(reached), max_rounds):
        reached.append(run_round(index))
        if reached[-1] >= floor:
            return reached
        if index + 1 < max_rounds:
            log.warning(
                "warm-up reference round %d ended at greedy pass@1 %.3f, below warmup.reference_min_greedy "
                "= %.3f: the schedule runs again from these weights (round %d of at most %d)",
                index + 1,
                reached[-1],
                floor,
                index + 2,
                max_rounds,
            )
    figures = ", ".join(f"{g:.3f}" for g in reached)
    raise FloorNotReached(
        f"the warm-up's reference phase ended its {len(reached)} round(s) at greedy pass@1 {figures} on "
        f"warmup.track_prompts eval prompts, below warmup.reference_min_greedy = {floor}: the tiny model "
        "has not crossed the task's transition. Raise warmup.reference_max_rounds (the next build goes "
        "on from the weights reached), try another warmup.seed, or lower the floor (0: off)",
        reached,
    )


def below_floor_dir(out: Path) -> Path:
    """Where a build that ended below ``warmup.reference_min_greedy`` keeps the weights it reached."""
    return out.with_name(f"{out.name}.below-floor")


def _kept_rounds(kept: Path, key: str) -> dict[str, Any] | None:
    """The marker of weights an earlier build of this same key left below the floor, if any."""
    marker = read_marker(kept)
    if marker is None or marker.get("kind") != "below-floor" or marker.get("key") != key:
        return None
    return marker


def _keep_below_floor(
    model: Any, tokenizer: Any, kept: Path, info: dict[str, Any], err: FloorNotReached
) -> FloorNotReached:
    """Save the below-floor weights to ``kept`` so that a build with more rounds goes on from them;
    return the error to raise, naming where they are (or why they could not be kept)."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{kept.name}.", dir=kept.parent))
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            write_marker(staging, {"kind": "below-floor", **info, "finished_at": time.time()})
            publish_dir(staging, kept)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as save_err:
        return FloorNotReached(f"{err}; the weights reached could not be kept ({save_err})", err.rounds)
    return _kept_error(err, kept)


def _kept_error(err: FloorNotReached, kept: Path) -> FloorNotReached:
    return FloorNotReached(
        f"{err}; the weights reached are kept in {kept} (not a warm model: run and eval do not use "
        "them), and a build with the same settings and more rounds starts from them",
        err.rounds,
    )


def _check_synthetic(data: DataConfig) -> None:
    if data.train_path is not None:
        raise ValueError(
            f"the warm-up trains on the synthetic task's worked solutions, but data.train_path is set "
            f"({data.train_path}); point model.path at an existing model instead of running the warm-up"
        )


def warmup(cfg: Config, *, out: Path | None = None, spec: TinyModelSpec | None = None) -> WarmupResult:
    """Build (or find in cache) the warm tiny model for ``cfg``; return where it is and how it scores."""
    _check_synthetic(cfg.data)
    spec = spec or tiny_spec(cfg)
    check_context(cfg, spec)
    out = Path(out if out is not None else cfg.model.path)
    key = warmup_key(cfg, spec)
    marker = read_marker(out)
    if marker is not None and marker.get("key") == key:
        return _cached_result(out, marker)  # before importing torch: a cache hit takes milliseconds
    check_replaceable(out)
    w = cfg.warmup
    kept = below_floor_dir(out)
    resumed = _kept_rounds(kept, key) if w.reference_min_greedy else None

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # data building and loading are serial; training picks its own count
    try:
        train_path, eval_path = ensure_synthetic_data(cfg.data, synthetic_data_dir(cfg))
        init_dir = init_model(default_init_dir(str(out)), seed=w.seed, spec=spec)
        tokenizer = AutoTokenizer.from_pretrained(init_dir)
        # A build that ended below the floor kept its weights; the same build with more rounds goes on
        # from them (each round has a fresh optimizer, so that is the uninterrupted build's weights).
        model = AutoModelForCausalLM.from_pretrained(kept if resumed else init_dir, dtype=torch.float32)
        if resumed:
            log.info(
                "warm-up: going on from the %d below-floor round(s) kept in %s (greedy pass@1 %s)",
                len(resumed["reference_rounds"]),
                kept,
                ", ".join(f"{g:.3f}" for g in resumed["reference_rounds"]),
            )
        # The synthetic prompts are ~45 tokens; the model's own limit, not model.max_prompt_len, applies
        # here, so that the weights (and the cache key) do not depend on that serving setting.
        train_items, _ = load_prompts(train_path, tokenizer, spec.max_position_embeddings)
        eval_items, _ = load_prompts(eval_path, tokenizer, spec.max_position_embeddings)
        examples = build_examples(train_items, tokenizer)
        if w.max_solution_tokens:
            examples = [(ids, n) for ids, n in examples if len(ids) - n <= w.max_solution_tokens]
            if not examples:
                raise ConfigError(
                    f"no worked solution has at most warmup.max_solution_tokens = {w.max_solution_tokens} "
                    "tokens; raise it (0: all)"
                )
        progress: list[dict[str, Any]] = list(resumed["progress"]) if resumed else []
        tracked = bool(w.track_every or w.reference_min_greedy)

        def train_phase(
            phase: str, phase_examples: Sequence[tuple[list[int], int]], steps: int, lr: float, seed: int
        ) -> float:
            return train_supervised(
                model,
                phase_examples,
                steps=steps,
                batch_size=w.batch_size,
                lr=lr,
                seed=seed,
                pad_id=tokenizer.pad_token_id,
                threads=w.threads,
                by_length=w.batch_by_length,
                on_step=_progress_tracker(
                    model, tokenizer, eval_items[: w.track_prompts], cfg, phase, steps, progress
                )
                if tracked
                else None,
            )

        round_losses: list[float] = []

        def reference_round(index: int) -> float:
            """Round ``index`` of the reference phase; its greedy pass@1 (tracked at its last step)."""
            phase = "reference" if index == 0 else f"reference-{index + 1}"
            round_losses.append(
                train_phase(phase, examples, w.steps, w.lr, w.seed + _ROUND_SEED_STRIDE * index)
            )
            return float(progress[-1]["greedy"])

        reference_rounds: list[float] = []
        done: list[float] = list(resumed["reference_rounds"]) if resumed else []
        t_train = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(w.seed)
            if w.reference_min_greedy:
                try:
                    reference_rounds = train_until_floor(
                        reference_round,
                        floor=w.reference_min_greedy,
                        max_rounds=w.reference_max_rounds,
                        done=done,
                    )
                except FloorNotReached as err:
                    if len(err.rounds) == len(done):  # no round ran: the kept weights are these already
                        raise _kept_error(err, kept) from None
                    info = {
                        "key": key,
                        "reference_rounds": err.rounds,
                        "progress": progress,
                        "train_seconds": round(time.perf_counter() - t_train, 2),
                    }
                    raise _keep_below_floor(model, tokenizer, kept, info, err) from None
                final_loss = round_losses[-1]
            else:
                final_loss = train_phase("reference", examples, w.steps, w.lr, w.seed)
            if w.slip_rate:
                slipped = build_examples(train_items, tokenizer, slip_rate=w.slip_rate, seed=w.seed)
                if w.max_solution_tokens:
                    slipped = [(ids, n) for ids, n in slipped if len(ids) - n <= w.max_solution_tokens]
                final_loss = train_phase("slips", slipped, w.slip_steps, w.slip_lr, w.seed + 1)
        fold_temperature(model, w.fold_temperature)
        train_seconds = time.perf_counter() - t_train
        score = measure_pass_at_1(
            model,
            tokenizer,
            eval_items[: w.eval_prompts],
            max_new_tokens=cfg.algo.max_response_len,
            seed=w.seed,
        )
    finally:
        torch.set_num_threads(previous_threads)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        info = {
            "kind": "warm",
            "key": key,
            "spec": asdict(spec),
            "warmup": cfg.warmup.model_dump(mode="json"),
            "task": cfg.data.synthetic.model_dump(mode="json"),
            "data_seed": cfg.data.seed,
            "train_seconds": round(train_seconds, 2),
            "total_seconds": round(time.perf_counter() - started, 2),
            "final_loss": final_loss,
            "pass_at_1": asdict(score),
            **({"progress": progress} if progress else {}),
            **({"reference_rounds": reference_rounds} if reference_rounds else {}),
            **({"rounds_resumed": len(done)} if done else {}),
            "finished_at": time.time(),
        }
        write_marker(staging, info)
        publish_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if resumed:
        shutil.rmtree(kept, ignore_errors=True)  # gone on into the warm model
    log.info(
        "warm model at %s: pass@1 %.3f (T=1.0), %.3f (greedy) on %d eval prompts; trained %.1f s",
        out,
        score.sampled,
        score.greedy,
        score.num_prompts,
        train_seconds,
    )
    return WarmupResult(
        path=out, cached=False, pass_at_1=score, train_seconds=train_seconds, final_loss=final_loss
    )


def _cached_result(out: Path, marker: dict[str, Any]) -> WarmupResult:
    score = marker.get("pass_at_1")
    return WarmupResult(
        path=out,
        cached=True,
        pass_at_1=PassAtOne(**score) if isinstance(score, dict) else None,
        train_seconds=float(marker.get("train_seconds", 0.0)),
        final_loss=marker.get("final_loss"),
    )


def is_default_model_path(path: str | Path) -> bool:
    """Whether ``path`` is one of the embedded recipes' caches (``BUILT_MODEL_PATHS``)."""
    resolved = Path(path).resolve()
    return resolved in {p.resolve() for p in BUILT_MODEL_PATHS} | {
        (_REPO / p).resolve() for p in BUILT_MODEL_PATHS
    }


def tiny_spec(cfg: Config) -> TinyModelSpec:
    """The tiny model the warm-up builds for ``cfg`` (its context and depth come from [warmup])."""
    return TinyModelSpec(max_position_embeddings=cfg.warmup.context_len, num_layers=cfg.warmup.num_layers)


def check_context(cfg: Config, spec: TinyModelSpec) -> None:
    """The tiny model must hold the longest prompt plus the longest response."""
    need = cfg.model.max_prompt_len + cfg.algo.max_response_len
    if need > spec.max_position_embeddings:
        raise ConfigError(
            f"model.max_prompt_len + algo.max_response_len = {need} tokens do not fit the tiny model's "
            f"{spec.max_position_embeddings} positions; set warmup.context_len >= {need} (or shorten them)"
        )


def ensure_warm_model(cfg: Config) -> Path:
    """The policy's starting directory for the launcher: ``model.path``, built if needed.

    A directory that holds a model stream-dapo did not build (no marker) is used as it is; one that
    we built is rebuilt when the task or warm-up settings changed; otherwise this returns at once.
    Only the embedded default's cache is built on demand: a ``model.path`` elsewhere that holds no
    model (a typo, an empty or half-copied directory) is a ConfigError, not a new tiny model.
    """
    path = Path(cfg.model.path)
    has_model = (path / "config.json").is_file()
    if has_model and read_marker(path) is None:
        return path
    if not has_model and not is_default_model_path(path):
        what = "does not exist" if not path.exists() else "holds no Hugging Face model (no config.json)"
        raise ConfigError(
            f"model.path = {path} {what}; point model.path at a model directory (config.json, weights, "
            f"tokenizer), or build the tiny warm model there with `stream-dapo warmup --out {path}` "
            f"(only the embedded recipes' caches, {', '.join(map(str, BUILT_MODEL_PATHS))}, are built on first use)"
        )
    if not has_model and cfg.data.train_path is not None:
        raise ConfigError(
            f"model.path = {path} holds no model and data.train_path is set, so the tiny warm-up (which "
            "trains on the synthetic task) does not apply; set model.path to a Hugging Face model directory"
        )
    return warmup(cfg).path


# --------------------------------------------------------------------------------------------------
# CLI: stream-dapo warmup
# --------------------------------------------------------------------------------------------------
