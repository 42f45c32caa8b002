"""Generator bookkeeping without vLLM: per-token versions, group assembly, the weight-swap protocol,
credits, unacknowledged groups and the weight watcher.

``FakeEngine`` stands in for ``vllm.v1.engine.llm_engine.LLMEngine`` only here: it emits one token per
request per step, labels outputs with its weight version the way vLLM's engine core does, and records
every control call so the protocol order can be asserted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_dapo.generator.credits import CreditLedger, CreditRequest, UnackedGroups
from stream_dapo.generator.engine import GroupAssembler, RolloutEngine, WeightUpdateError, versions_from_spans
from stream_dapo.generator.weight_watcher import WeightWatcher
from stream_dapo.testing.services import wire_group
from stream_dapo.transport import messages as m
from stream_dapo.weights import WeightUpdate

# RolloutEngine builds vLLM's SamplingParams: importing vLLM takes seconds and runs `file` (cpuinfo).
pytestmark = pytest.mark.process

# --------------------------------------------------------------------------------------------------
# Fakes
# --------------------------------------------------------------------------------------------------


@dataclass
class Logprob:
    logprob: float


@dataclass
class Span:
    version: str
    start: int
    end: int


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    text: str
    finish_reason: str | None = None
    weight_versions: list[Span] | None = None
    index: int = 0


@dataclass
class Output:
    request_id: str
    outputs: list[Completion]
    num_cached_tokens: int = 0


@dataclass
class _Req:
    prompt: dict[str, Any]
    max_tokens: int
    n: int = 0
    spans: list[list[Any]] = field(default_factory=list)


class FakeEngine:
    """One token per running request per step; token id = 100 + position; log-prob = -0.01 * (position+1)."""

    def __init__(self, *, reset_ok: list[bool] | None = None, fail_load: bool = False) -> None:
        self.requests: dict[str, _Req] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.version_label = "?"
        self.paused = False
        self.reset_ok = list(reset_ok or [])
        self.fail_load = fail_load

    # generation
    def add_request(self, request_id: str, prompt: dict[str, Any], params: Any) -> None:
        assert params.n == 1 and params.logprobs == 0
        self.requests[request_id] = _Req(prompt, params.max_tokens)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def abort_request(self, ids: list[str]) -> None:
        self.calls.append(("abort", tuple(ids)))
        for rid in ids:
            self.requests.pop(rid, None)

    def step(self) -> list[Output]:
        assert not self.paused, "stepped while paused"
        out = []
        for rid, req in list(self.requests.items()):
            pos = req.n
            if not req.spans or req.spans[-1][0] != self.version_label:
                req.spans.append([self.version_label, pos])
            req.n += 1
            done = req.n >= req.max_tokens
            spans = None
            if done:
                ends = [s[1] for s in req.spans[1:]] + [req.n]
                spans = [Span(v, s, e) for (v, s), e in zip(req.spans, ends, strict=True)]
                del self.requests[rid]
            completion = Completion(
                [100 + pos],
                [{100 + pos: Logprob(-0.01 * (pos + 1))}],
                f"t{pos} ",
                "length" if done else None,
                spans,
            )
            out.append(Output(rid, [completion], num_cached_tokens=7))
        return out

    # control
    def sleep(self, level: int, mode: str) -> None:
        self.calls.append(("sleep", level, mode))
        self.paused = True

    def wake_up(self, tags: list[str]) -> bool:
        self.calls.append(("wake_up", tuple(tags)))
        self.paused = False
        return True

    def set_weight_version(self, label: str) -> None:
        self.calls.append(("set_weight_version", label))
        self.version_label = label

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = ()) -> list[Any]:
        self.calls.append(("rpc", method, *args))
        if method == "update_weights_from_file":
            if self.fail_load:
                raise RuntimeError("worker exploded")
            return [True]
        if method == "weights_checksum":
            return [f"sum-{self.version_label}"]
        raise AssertionError(method)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.calls.append(("reset_prefix_cache", reset_running_requests))
        if reset_running_requests:
            return True
        return self.reset_ok.pop(0) if self.reset_ok else not self.requests


@dataclass
class Prompt:
    prompt_id: str
    prompt_token_ids: list[int]
    gold: str = "7"


def make_engine(fake: FakeEngine, **kw: Any) -> RolloutEngine:
    return RolloutEngine(fake, group_size=3, max_response_len=kw.pop("max_response_len", 8), **kw)


@pytest.fixture
def weights_file(tmp_path: Path) -> Path:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    path = tmp_path / "v00000001.safetensors"
    save_file({"model.embed_tokens.weight": torch.zeros(4, 2)}, str(path))
    return path


def run_to_end(engine: RolloutEngine) -> list[Any]:
    done = []
    for _ in range(100):
        done.extend(engine.step())
        if not engine.num_in_flight:
            return done
    raise AssertionError("did not finish")


# --------------------------------------------------------------------------------------------------
# Per-token versions
# --------------------------------------------------------------------------------------------------


def test_versions_from_spans_marks_each_token_with_its_version() -> None:
    spans = [Span("3", 0, 2), Span("4", 2, 5), Span("6", 5, 6)]
    assert versions_from_spans(spans, 6, default=0).tolist() == [3, 3, 4, 4, 4, 6]
    assert versions_from_spans(spans, 6, default=0).dtype == np.int32
    assert versions_from_spans(None, 3, default=5).tolist() == [5, 5, 5]
    assert versions_from_spans([], 0, default=5).tolist() == []


@pytest.mark.parametrize(
    "spans",
    [
        [Span("1", 0, 2), Span("2", 3, 6)],  # gap
        [Span("1", 0, 4)],  # short
        [Span("1", 0, 7)],  # past the end
        [Span("default", 0, 6)],  # not one of our labels
    ],
)
def test_versions_from_spans_refuses_spans_that_do_not_tile(spans: list[Span]) -> None:
    with pytest.raises(ValueError):
        versions_from_spans(spans, 6, default=0)


def test_versions_switch_at_the_token_count_when_the_weights_changed(weights_file: Path) -> None:
    fake = FakeEngine()
    engine = make_engine(fake, version=4)
    gid = engine.add_group(Prompt("p", [1, 2, 3]))
    for _ in range(3):
        assert engine.step() == []
    engine.update_weights(weights_file, version=5)
    engine.step()
    engine.update_weights(weights_file, version=6)
    (group,) = run_to_end(engine)
    assert group.group_id == gid and group.start_version == 4
    for s in group.samples:
        assert s.versions.tolist() == [4, 4, 4, 5, 6, 6, 6, 6]
        assert s.token_ids.tolist() == list(range(100, 108))
        np.testing.assert_allclose(s.logprobs, [-0.01 * (i + 1) for i in range(8)], rtol=1e-6)
        assert s.text == "".join(f"t{i} " for i in range(8))
        assert s.truncated and s.cached_prompt_tokens == 7
    assert engine.version == 6 and engine.updates == 2


# --------------------------------------------------------------------------------------------------
# Group assembly
# --------------------------------------------------------------------------------------------------


def test_a_group_comes_out_only_when_all_its_samples_finished() -> None:
    asm = GroupAssembler()
    ids = asm.add("g", Prompt("p", [5, 6]), 2, version=0)
    assert ids == ["g:0", "g:1"]

    def out(rid: str, tok: int, finish: str | None) -> Output:
        spans = [Span("0", 0, 2)] if finish else None
        return Output(rid, [Completion([tok], [{tok: Logprob(-0.5)}], "x", finish, spans)])

    assert asm.consume([out("g:0", 1, None), out("g:1", 2, None)]) == []
    assert asm.consume([out("g:0", 3, "stop")]) == []
    assert len(asm) == 1
    (group,) = asm.consume([out("g:1", 4, "length")])
    assert len(asm) == 0 and "g" not in asm
    assert [s.token_ids.tolist() for s in group.samples] == [[1, 3], [2, 4]]
    assert [s.finish_reason for s in group.samples] == ["stop", "length"]
    assert group.prompt_token_ids.tolist() == [5, 6] and group.gold == "7"
    assert asm.tokens_generated == 4


def test_the_in_flight_report_lists_each_unsent_group_by_its_start_version() -> None:
    """What the buffer holds the learner for: groups in the engine and groups still being verified,
    each at the version it was started at; a group leaves the report once its outcome is taken."""
    from stream_dapo.config import load_config
    from stream_dapo.generator.root import build_generator
    from stream_dapo.verifier.core import VerifyResult

    class Wrong:
        def score_batch(self, items: list[object]) -> list[VerifyResult]:
            return [VerifyResult(False, -1.0, None, "no_answer") for _ in items]

        def close(self) -> None:
            pass

    svc = build_generator(load_config(environ={}))
    engine = make_engine(FakeEngine(), max_response_len=2)
    try:
        svc.engine = engine
        svc.verifier = Wrong()  # type: ignore[assignment]
        engine.add_group(Prompt("a", [1]))
        engine.version = 3
        engine.add_group(Prompt("b", [2]))
        assert sorted(engine.start_versions()) == [0, 3] and svc.in_flight_versions() == [0, 3]
        svc.verify(run_to_end(engine))
        assert engine.num_in_flight == 0 and sorted(svc.in_flight_versions()) == [0, 3]
        svc.verifying.wait()
        taken = next(svc.verifying.done())  # its outcome was taken (and sent)
        assert len(svc.verifying) == 1 and svc.in_flight_versions() == [3 - taken.start_version]
    finally:
        svc.engine = None
        svc.close()


def test_outputs_of_dropped_groups_are_ignored_and_ids_must_be_unique() -> None:
    asm = GroupAssembler()
    asm.add("g", Prompt("p", [1]), 1, version=0)
    with pytest.raises(ValueError, match="already in flight"):
        asm.add("g", Prompt("p", [1]), 1, version=0)
    assert asm.drop("g") == ["g:0"]
    assert asm.drop("g") == []
    late = Output("g:0", [Completion([9], [{9: Logprob(-1.0)}], "x", "stop", [Span("0", 0, 1)])])
    assert asm.consume([late]) == []


def test_missing_logprobs_are_an_error_that_names_the_fix() -> None:
    asm = GroupAssembler()
    asm.add("g", Prompt("p", [1]), 1, version=0)
    with pytest.raises(RuntimeError, match="logprobs=0"):
        asm.consume([Output("g:0", [Completion([9, 10], [{9: Logprob(-1.0)}], "x")])])


def test_abort_all_forgets_every_group_and_aborts_its_requests() -> None:
    fake = FakeEngine()
    engine = make_engine(fake)
    a = engine.add_group(Prompt("a", [1]))
    b = engine.add_group(Prompt("b", [2]))
    engine.step()
    assert engine.num_in_flight == 2
    assert engine.abort_all() == 2
    assert engine.num_in_flight == 0
    assert ("abort", (f"{a}:0", f"{a}:1", f"{a}:2", f"{b}:0", f"{b}:1", f"{b}:2")) in fake.calls
    assert engine.step() == []


# --------------------------------------------------------------------------------------------------
# The weight-swap protocol
# --------------------------------------------------------------------------------------------------


def test_update_runs_pause_load_label_invalidate_resume_in_order(weights_file: Path) -> None:
    fake = FakeEngine()
    engine = make_engine(fake)
    engine.add_group(Prompt("p", [1]))
    engine.step()
    fake.calls.clear()
    seconds = engine.update_weights(weights_file, version=9)
    assert seconds >= 0
    assert fake.calls == [
        ("sleep", 0, "keep"),
        ("rpc", "update_weights_from_file", str(weights_file)),
        ("set_weight_version", "9"),
        ("reset_prefix_cache", True),
        ("wake_up", ("scheduling",)),
    ]
    assert engine.weights_checksum() == "sum-9"


def test_a_missing_or_broken_file_is_refused_before_pausing(tmp_path: Path) -> None:
    fake = FakeEngine()
    engine = make_engine(fake, version=2)
    fake.calls.clear()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        engine.update_weights(tmp_path / "nope.safetensors", version=3)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="not a usable safetensors"):
        engine.update_weights(broken, version=3)
    assert fake.calls == [] and engine.version == 2


def test_a_failed_load_leaves_the_engine_paused_and_says_restart(weights_file: Path) -> None:
    fake = FakeEngine(fail_load=True)
    engine = make_engine(fake, version=2)
    with pytest.raises(WeightUpdateError, match="restart the generator"):
        engine.update_weights(weights_file, version=3)
    assert fake.paused and ("wake_up", ("scheduling",)) not in fake.calls
    assert engine.version == 2


def test_keep_mode_salts_requests_by_version_and_retries_the_cache_reset_when_idle(
    weights_file: Path,
) -> None:
    fake = FakeEngine(reset_ok=[False, False, True])
    engine = make_engine(fake, kv_on_update="keep")
    engine.add_group(Prompt("p", [1]))
    assert {r.prompt["cache_salt"] for r in fake.requests.values()} == {"v0"}
    engine.step()
    engine.update_weights(weights_file, version=1)
    assert ("reset_prefix_cache", False) in fake.calls and engine.kv_reset_pending
    engine.add_group(Prompt("q", [1]))
    assert {r.prompt["cache_salt"] for r in fake.requests.values()} == {"v0", "v1"}
    engine._kv_reset_last_try = -math.inf
    engine.step()  # busy: vLLM would refuse (and warn), so no attempt while requests run
    assert fake.calls.count(("reset_prefix_cache", False)) == 1 and engine.kv_reset_pending
    while fake.has_unfinished_requests():
        engine.step()
    assert fake.calls.count(("reset_prefix_cache", False)) == 1
    engine.step()  # idle: refused once more (the fake's script), still pending
    assert fake.calls.count(("reset_prefix_cache", False)) == 2 and engine.kv_reset_pending
    engine.step()  # idle, but within the retry interval of that try: no new attempt
    assert fake.calls.count(("reset_prefix_cache", False)) == 2
    engine._kv_reset_last_try = -math.inf
    engine.step()
    assert fake.calls.count(("reset_prefix_cache", False)) == 3 and not engine.kv_reset_pending


def test_a_recompute_swap_counts_the_context_each_running_sample_prefills_again(weights_file: Path) -> None:
    # Group p (prompt 2 tokens): 3 samples x 2 tokens + the prompt once = 8. Group q joins after the
    # first swap (prompt 3 tokens): at the second swap p has 3 x 3 tokens, q 3 x 1: (2 + 9) + (3 + 3).
    fake = FakeEngine()
    engine = make_engine(fake)
    engine.add_group(Prompt("p", [1, 2]))
    engine.step(), engine.step()
    engine.update_weights(weights_file, version=1)
    assert engine.tokens_recomputed == 8
    engine.add_group(Prompt("q", [1, 2, 3]))
    engine.step()
    engine.update_weights(weights_file, version=2)
    assert engine.tokens_recomputed == 8 + 11 + 6
    keep = make_engine(FakeEngine(), kv_on_update="keep")
    keep.add_group(Prompt("p", [1, 2]))
    keep.step()
    keep.update_weights(weights_file, version=1)
    assert keep.tokens_recomputed == 0, "keep drops no KV"


def test_an_unknown_kv_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="between-groups"):
        make_engine(FakeEngine(), kv_on_update="later")


class RecordingSource:
    """A `WeightSource` that finds `published` when polled and, instead of loading, records
    (version, groups in flight) and relabels the engine."""

    first_version = 0
    startup = "look"
    latest_seen = -1

    def __init__(self) -> None:
        self.published: WeightUpdate | None = None
        self.loaded: list[tuple[int, int]] = []

    def __call__(self, have: int) -> WeightUpdate | None:
        return self.published if self.published is not None and self.published.version != have else None

    def join(self, engine: Any) -> None:
        pass

    def load(self, engine: Any, update: WeightUpdate) -> float:
        self.loaded.append((update.version, engine.num_in_flight))
        engine.version = update.version
        return 0.0

    def close(self) -> None:
        pass


def between_groups_service(mode: str, tmp_path: Path) -> tuple[Any, RolloutEngine, list[tuple[int, int]]]:
    """A generator service on the fake engine, with 1 credit, an update to v1 waiting to be taken,
    and a weight source recording (version, groups in flight) instead of loading."""
    from stream_dapo.config import load_config
    from stream_dapo.generator.root import build_generator

    source = RecordingSource()
    cfg = load_config(
        overrides=[f'generator.kv_on_update="{mode}"', "generator.weight_poll_s=60"], environ={}
    )
    svc = build_generator(cfg, weights=source)  # type: ignore[arg-type]
    engine = make_engine(FakeEngine(), max_response_len=4)
    svc.engine = engine
    svc.prompts = iter([Prompt(f"p{i}", [1, 2]) for i in range(10)])  # type: ignore[assignment]
    svc.intake.load_initial(engine)  # nothing published yet: version 0 (the watcher polls every 60 s)
    svc.link.credits.held = 1
    svc.start_groups()
    assert engine.num_in_flight == 1
    source.published = WeightUpdate(1, tmp_path / "v1", 10)
    assert svc.intake.watcher is not None and svc.intake.watcher.poll_once() is not None
    svc.link.credits.held = 2
    return svc, engine, source.loaded


def test_between_groups_swaps_only_once_the_groups_in_flight_finished_and_starts_none_meanwhile(
    tmp_path: Path,
) -> None:
    svc, engine, loaded = between_groups_service("between-groups", tmp_path)
    try:
        svc.intake.apply_new()
        svc.start_groups()
        assert loaded == [] and engine.num_in_flight == 1, "no swap, and no group on superseded weights"
        (group,) = run_to_end(engine)
        assert {v for s in group.samples for v in s.versions.tolist()} == {0}
        svc.intake.apply_new()
        assert loaded == [(1, 0)]
        assert svc.registry.get_sample_value("stream_dapo_generator_policy_version") == 1
        svc.start_groups()
        assert engine.num_in_flight == 2 and svc.link.credits.held == 0
        assert svc.registry.get_sample_value("stream_dapo_generator_weight_hold_seconds_total") >= 0.0
    finally:
        svc.engine = None
        svc.close()


def test_recompute_swaps_with_groups_in_flight_and_counts_samples_spanning_versions(
    weights_file: Path, tmp_path: Path
) -> None:
    svc, engine, loaded = between_groups_service("recompute", tmp_path)
    try:
        svc.intake.apply_new()
        assert loaded == [(1, 1)], "swapped at once, the group still running"
        svc.start_groups()
        assert engine.num_in_flight == 3
        engine.step()
        engine.update_weights(weights_file, version=2)  # the next tokens of all three are v2's
        finished = run_to_end(engine)
        for group in finished:
            svc.count_finished(group)
        assert svc.registry.get_sample_value("stream_dapo_generator_multi_version_samples_total") == 9
    finally:
        svc.engine = None
        svc.close()


def test_recompute_mode_sends_no_salt() -> None:
    fake = FakeEngine()
    engine = make_engine(fake)
    engine.add_group(Prompt("p", [1, 2]))
    assert all("cache_salt" not in r.prompt for r in fake.requests.values())
    assert all(r.prompt["prompt_token_ids"] == [1, 2] for r in fake.requests.values())


# --------------------------------------------------------------------------------------------------
# Credits
# --------------------------------------------------------------------------------------------------


def ledger_with_ids(**kw: float) -> CreditLedger:
    ids = iter(range(100, 200))
    return CreditLedger(new_id=lambda: next(ids), **kw)  # type: ignore[arg-type]


def want(req: CreditRequest | None) -> int:
    return 0 if req is None else req.want


def test_credit_requests_ask_for_free_slots_once_at_a_time() -> None:
    ledger = ledger_with_ids(max_in_flight=4, timeout_s=10.0, retry_s=1.0)
    first = ledger.request(in_flight=1, now=0.0)
    assert first == CreditRequest(100, 3)
    assert ledger.request(in_flight=1, now=1.0) is None, "one request in flight at a time"
    assert ledger.granted(2, now=2.0, request_id=100)
    assert ledger.held == 2
    assert ledger.request(in_flight=1, now=2.0) == CreditRequest(101, 1)  # 4 - 1 in flight - 2 held
    assert ledger.granted(0, now=3.0, request_id=101)
    assert ledger.request(in_flight=1, now=3.5) is None, "the buffer's line is full: back off"
    assert want(ledger.request(in_flight=1, now=4.0)) == 1
    assert ledger.take() and ledger.take() and not ledger.take()
    assert ledger.held == 0


def test_an_unanswered_credit_request_is_repeated_with_its_id_and_counted_once() -> None:
    ledger = ledger_with_ids(max_in_flight=2, timeout_s=5.0)
    assert ledger.request(in_flight=0, now=0.0) == CreditRequest(100, 2)
    assert ledger.request(in_flight=0, now=4.9) is None
    assert ledger.request(in_flight=0, now=5.0) == CreditRequest(100, 2), "same id: the buffer grants once"
    # both replies arrive (the buffer answers the repeat with the same grant): only the first counts
    assert ledger.granted(2, now=6.0, request_id=100)
    assert not ledger.granted(2, now=6.1, request_id=100)
    assert ledger.held == 2 and ledger.request(in_flight=0, now=7.0) is None


def test_a_credit_reply_to_no_pending_request_changes_nothing() -> None:
    ledger = ledger_with_ids(max_in_flight=2, timeout_s=5.0)
    assert not ledger.granted(0, now=0.0, request_id=None), "the hello's reply"
    assert ledger.request(in_flight=0, now=0.0) == CreditRequest(100, 2)
    assert not ledger.granted(2, now=0.1, request_id=99)
    assert not ledger.granted(2, now=0.1, request_id=None)
    assert ledger.held == 0 and ledger.pending == CreditRequest(100, 2)


def test_a_reconnect_resends_the_pending_credit_request_at_once() -> None:
    ledger = ledger_with_ids(max_in_flight=3, timeout_s=10.0)
    assert ledger.request(in_flight=0, now=0.0) == CreditRequest(100, 3)
    ledger.forget_request()
    assert ledger.request(in_flight=1, now=1.0) == CreditRequest(100, 3), "not a second request"
    assert ledger.granted(3, now=1.1, request_id=100) and ledger.held == 3


def test_filtered_groups_add_to_a_running_total() -> None:
    ledger = CreditLedger(max_in_flight=2, timeout_s=5.0)
    ledger.redeem_without_group()
    ledger.redeem_without_group(2)
    assert ledger.filtered_total == 3  # sent in every message: the buffer redeems the increase
    ledger.redeem_without_group()
    assert ledger.filtered_total == 4


def test_an_expired_lease_drops_held_credits_and_resends_the_pending_request_at_once() -> None:
    ledger = ledger_with_ids(max_in_flight=4, timeout_s=5.0)
    assert ledger.request(in_flight=0, now=0.0) == CreditRequest(100, 4)
    assert ledger.granted(3, now=0.1, request_id=100)
    assert ledger.take() and ledger.held == 2
    assert ledger.request(in_flight=1, now=0.2) == CreditRequest(101, 1)
    assert ledger.lease_expired() == 2
    assert ledger.held == 0 and not ledger.take()
    # the request in flight goes again at once; the buffer grants it anew (expiry forgot its grants)
    assert ledger.request(in_flight=1, now=0.3) == CreditRequest(101, 1)
    assert ledger.granted(1, now=0.4, request_id=101) and ledger.held == 1
    assert ledger.request(in_flight=1, now=0.5) == CreditRequest(102, 2)


# --------------------------------------------------------------------------------------------------
# Unacknowledged groups
# --------------------------------------------------------------------------------------------------


def test_unacked_groups_are_resent_after_the_timeout_until_acknowledged() -> None:
    pending = UnackedGroups(resend_after_s=10.0)
    a, b, c = wire_group("a"), wire_group("b"), wire_group("c")
    pending.sent(a, now=0.0)
    pending.sent(b, now=5.0)
    pending.sent(c, now=5.0)
    assert len(pending) == 3
    assert pending.due(now=9.0) == []
    assert [g.group_id for g in pending.due(now=10.0)] == ["a"]
    assert pending.due(now=12.0) == [], "a resend restarts the clock"
    assert [g.group_id for g in pending.due(now=20.0)] == ["a", "b", "c"]
    assert pending.resent == 4

    result = pending.ack(accepted=["a"], duplicates=["b"], rejected=[m.Rejection("c", "wrong_group_size")])
    assert result.acked == 2 and result.rejected == [("c", "wrong_group_size")] and result.unknown == 0
    assert len(pending) == 0 and pending.due(now=100.0) == []
    assert pending.ack(["a"], [], []).unknown == 1


def test_a_reconnect_makes_every_unacked_group_due_and_allows_a_credit_request() -> None:
    pending = UnackedGroups(resend_after_s=10.0)
    pending.sent(wire_group("a"), now=0.0)
    pending.sent(wire_group("b"), now=1.0)
    pending.expire()
    assert [g.group_id for g in pending.due(now=2.0)] == ["a", "b"]
    assert pending.due(now=3.0) == []
    ledger = ledger_with_ids(max_in_flight=2, timeout_s=10.0)
    assert ledger.request(in_flight=0, now=0.0) == CreditRequest(100, 2)
    ledger.forget_request()
    assert ledger.request(in_flight=0, now=1.0) == CreditRequest(100, 2)


def test_sending_a_group_twice_keeps_its_first_send_time() -> None:
    pending = UnackedGroups(resend_after_s=10.0)
    pending.sent(wire_group("a"), now=0.0)
    pending.sent(wire_group("a"), now=8.0)
    assert len(pending) == 1 and [g.group_id for g in pending.due(now=10.0)] == ["a"]


def test_groups_are_numbered_in_send_order_and_acked_below_is_the_oldest_unacknowledged() -> None:
    pending = UnackedGroups(resend_after_s=10.0)
    assert pending.acked_below == 0
    a, b, c = (pending.number(wire_group(gid)) for gid in "abc")
    assert [(g.group_id, g.seq) for g in (a, b, c)] == [("a", 0), ("b", 1), ("c", 2)]
    for g in (a, b, c):
        pending.sent(g, now=0.0)
    assert pending.acked_below == 0
    pending.ack(["b"], [], [])
    assert pending.acked_below == 0  # a is still unacknowledged: it may be resent
    pending.ack([], ["a"], [])
    assert pending.acked_below == 2
    pending.ack([], [], [m.Rejection("c", "buffer_full")])
    assert pending.acked_below == 3  # none pending: the next number
    assert pending.number(wire_group("d")).seq == 3


# --------------------------------------------------------------------------------------------------
# Weight watcher
# --------------------------------------------------------------------------------------------------


def test_weight_watcher_hands_over_the_newest_version_and_polls_relative_to_it() -> None:
    seen: list[int] = []
    server = {"version": 3}

    def poll(have: int) -> WeightUpdate | None:
        seen.append(have)
        v = server["version"]
        return None if v == have else WeightUpdate(v, Path(f"/w/v{v}"), 10)

    watcher = WeightWatcher(poll, poll_s=60.0, have=0)
    assert watcher.take() is None
    assert watcher.poll_once() == WeightUpdate(3, Path("/w/v3"), 10)
    server["version"] = 4
    watcher.poll_once()
    assert watcher.take() == WeightUpdate(4, Path("/w/v4"), 10), "v3 was superseded"
    assert watcher.take() is None
    server["version"] = 5
    # Regression: while v4 loads nothing is fetched, so no fetch can prune v4's file under the load.
    assert watcher.poll_once() is None and seen == [0, 3]
    watcher.loaded()
    assert watcher.poll_once() == WeightUpdate(5, Path("/w/v5"), 10)
    assert seen == [0, 3, 4]
    server["version"] = 4
    watcher.take()
    watcher.reset(3)  # its file vanished before it was loaded: polling goes on relative to v3
    assert watcher.poll_once() == WeightUpdate(4, Path("/w/v4"), 10)


# --------------------------------------------------------------------------------------------------
# Heartbeat
# --------------------------------------------------------------------------------------------------


def test_heartbeats_carry_the_running_total_and_an_expired_lease_is_reported() -> None:
    import threading

    import zmq

    from stream_dapo.generator.credits import Heartbeat
    from stream_dapo.transport import messages as m
    from stream_dapo.transport.sockets import open_endpoint

    ctx: zmq.Context[Any] = zmq.Context()
    buffer = open_endpoint(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*", max_bytes=1 << 20, peer="generator")
    progressing = threading.Event()
    progressing.set()
    totals = iter(range(100))
    beat = Heartbeat(
        lambda: open_endpoint(ctx, zmq.DEALER, connect=buffer.address, max_bytes=1 << 20, peer="buffer"),
        "gen-7",
        every_s=0.01,
        filtered_total=lambda: next(totals),
        progressing=progressing.is_set,
        in_flight=lambda: [3, 5],
    ).start()
    try:
        got = [buffer.recv(5000) for _ in range(3)]
        assert all(g is not None for g in got)
        bodies = [g[1].body for g in got]  # type: ignore[index]
        assert [b.generator_id for b in bodies] == ["gen-7"] * 3
        assert [b.filtered_total for b in bodies] == [0, 1, 2]
        assert all(b.in_flight_versions == [3, 5] for b in bodies)
        answered_before = beat.last_answer
        buffer.send(m.Lease(0, True, 3), to=got[-1][0])  # type: ignore[index]
        assert beat.expired.wait(5)
        assert beat.last_answer > answered_before
        # A main loop that stopped making progress stops renewing: its credits will expire too.
        progressing.clear()
        sent = beat.sent
        while buffer.recv(300) is not None:  # give it the chance to send more
            pass
        assert beat.sent <= sent + 1  # at most the one beat that had passed the check already
    finally:
        beat.stop()
        buffer.close()
        ctx.term()
