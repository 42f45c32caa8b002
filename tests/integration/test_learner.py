"""The DeepSpeed learner on a tiny Qwen2 model: training, checkpoints, HF export, ZeRO-3 gathering,
data parallelism over two processes, and the learner service against a stand-in buffer."""

from __future__ import annotations

import json
import math
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import zmq
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from stream_dapo.config import Config
from stream_dapo.learner.root import ConfiguredCollaborators, build_learner, learner_settings
from stream_dapo.learner.service import LearnerService
from stream_dapo.learner.trainer import Learner
from stream_dapo.runtime.ports import endpoint_port, read_bound_ports
from stream_dapo.testing.services import tiny_qwen2
from stream_dapo.transport import messages as m
from stream_dapo.transport.sockets import open_endpoint
from stream_dapo.weights import fetch_weights_zmq

LR = 1e-3


tiny_model = tiny_qwen2


def make_cfg(tmp: Path, **sections: dict[str, Any]) -> Config:
    base: dict[str, Any] = {
        "model": {"max_prompt_len": 8, "path": str(tmp / "model")},
        "algo": {"group_size": 2, "max_response_len": 32, "overlong_cache_len": 4},
        "learner": {
            "mini_batch_samples": 4,
            "rollout_batch_prompts": 2,
            "micro_batch_tokens": 64,
            "lr": LR,
            "warmup_steps": 3,
        },
        "run": {"out_dir": str(tmp / "run")},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Config.model_validate(base)


def make_groups(seed: int, n: int = 2, version: int = 0, group_size: int = 2) -> list[m.Group]:
    """``n`` groups of ``group_size`` random samples, every token produced by ``version``."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n):
        samples = []
        for i in range(group_size):
            length = int(rng.integers(4, 24))
            adv = 1.0 if i % 2 == 0 else -1.0
            samples.append(
                m.Sample(
                    tokens=rng.integers(0, 64, length).astype(np.int32),
                    logprobs=rng.uniform(-5.0, -3.5, length).astype(np.float32),
                    versions=np.full(length, version, np.int32),
                    reward=adv,
                    correct=adv > 0,
                    truncated=False,
                    advantage=adv,
                )
            )
        groups.append(
            m.Group(
                group_id=uuid.uuid4().hex,
                prompt_id=f"p{seed}-{g}",
                generator_id="g0",
                gold="1",
                prompt_tokens=rng.integers(0, 64, int(rng.integers(3, 8))).astype(np.int32),
                created_at=0.0,
                samples=samples,
            )
        )
    return groups


def params_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


# --------------------------------------------------------------------------------------------- learner


def test_a_few_steps_change_every_parameter_and_record_staleness(tmp_path: Path) -> None:
    learner = Learner(make_cfg(tmp_path), tiny_model(), source_dir=tmp_path)
    before = params_of(learner.engine.module)
    groups = make_groups(0)  # every token from version 0: staleness at step k is k
    groups[0].samples[0].truncated = True  # 1 of 4 samples
    lengths = [len(s.tokens) for g in groups for s in g.samples]
    for step in range(3):
        metrics = learner.train_step(groups)
        assert metrics.version == step + 1 == learner.version
        assert math.isfinite(metrics.loss) and math.isfinite(metrics.grad_norm) and metrics.grad_norm > 0
        assert metrics.max_staleness == step
        assert metrics.staleness_counts == {step: metrics.loss_tokens}
        assert metrics.loss_tokens == sum(len(s.tokens) for g in groups for s in g.samples)
        assert 0 < metrics.packing_efficiency <= 1 and metrics.micro_batches >= 2
        assert metrics.truncation_rate == 0.25
        assert metrics.truncated_in_loss_share == 1.0  # trained, with A = +1: the filter is off
        assert metrics.response_len_mean == pytest.approx(sum(lengths) / 4)
        assert metrics.lr == pytest.approx(LR * (step + 1) / 3)  # linear warm-up over 3 steps
    after = params_of(learner.engine.module)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert unchanged == []
    groups[0].samples[0].loss_weight = 0.0  # what the overlong filter does to a truncated sample
    assert learner.train_step(groups).truncated_in_loss_share == 0.0
    groups[0].samples[0].truncated = False
    assert learner.train_step(groups).truncated_in_loss_share is None


def test_first_mini_batch_takes_its_proximal_logprobs_from_its_own_forward(tmp_path: Path) -> None:
    """prox=None (the service's first mini-batch of a rollout batch) must train exactly as a separate
    no-grad proximal pass on the same weights would: same loss, IS weights and updated parameters."""
    cfg = make_cfg(tmp_path)
    groups = make_groups(5, version=0)
    reused = Learner(cfg, tiny_model(0), source_dir=tmp_path)
    separate = Learner(cfg, tiny_model(0), source_dir=tmp_path)
    batch_a, batch_b = reused.prepare(groups), separate.prepare(groups)
    a = reused.train_step(batch_a, None)
    b = separate.train_step(batch_b, separate.compute_logprobs(batch_b.micro_batches))
    assert a.loss == pytest.approx(b.loss, rel=1e-6, abs=1e-9)
    assert a.is_weight_mean == pytest.approx(b.is_weight_mean, rel=1e-6)
    assert a.ratio_mean == pytest.approx(1.0, abs=1e-6)  # ratio to the current weights is 1
    pa, pb = params_of(reused.engine.module), params_of(separate.engine.module)
    for name in pa:
        torch.testing.assert_close(pa[name], pb[name], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(pa[n], params_of(tiny_model(0))[n]) for n in pa)  # it did train


# The off-policy corrections of issue 40 (algo keys), each through the real learner.
CORRECTIONS = {
    "sequence-tis": {"is_level": "sequence"},
    "geometric-mask": {"is_level": "geometric", "is_mode": "mask", "is_cap": 1.1},
    "icepop": {"is_mode": "icepop"},
    "gspo": {"ratio_level": "sequence", "agg_mode": "seq-mean-token-mean", "eps_low": 0.01, "eps_high": 0.01},
    "cispo": {"surrogate": "cispo", "eps_low": 1.0, "eps_high": 0.01},
}


@pytest.mark.parametrize("algo", CORRECTIONS.values(), ids=CORRECTIONS.keys())
def test_each_correction_trains_every_parameter_against_a_stale_proximal_policy(
    tmp_path: Path, algo: dict[str, Any]
) -> None:
    """Two mini-batches of one rollout batch, as the service trains them: the second one's proximal
    log-probs come from the weights before the first step, so its ratio pi_theta / pi_prox is not 1
    and the GSPO clip and CISPO's IS weight act on it."""
    learner = Learner(make_cfg(tmp_path, algo=algo), tiny_model(), source_dir=tmp_path)
    before = params_of(learner.engine.module)
    first, second = learner.prepare(make_groups(1)), learner.prepare(make_groups(2))
    prox = learner.compute_logprobs(second.micro_batches)
    step1 = learner.train_step(first, None, 0)
    step2 = learner.train_step(second, prox, 0)
    for step in (step1, step2):
        assert math.isfinite(step.loss) and math.isfinite(step.grad_norm) and step.grad_norm > 0
        assert 0.0 <= step.masked_frac < 1.0
    assert (step1.seq_ratio_min, step1.seq_ratio_max) == pytest.approx((1.0, 1.0))
    assert step2.seq_ratio_min is not None and step2.seq_ratio_max is not None
    assert step2.seq_ratio_min < step2.seq_ratio_max  # the first step moved the policy
    after = params_of(learner.engine.module)
    assert [n for n in before if torch.equal(before[n], after[n])] == []


def test_checkpoint_resume_continues_bit_identically(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    first = Learner(cfg, tiny_model(0), source_dir=tmp_path)
    for seed in (1, 2):
        first.train_step(make_groups(seed))
    first.save_checkpoint(tmp_path / "ckpt", extra_state={"trained_groups_lines": 2})
    assert json.loads((tmp_path / "ckpt" / "learner_state.json").read_text())["version"] == 2
    continued = first.train_step(make_groups(3))

    resumed = Learner(cfg, tiny_model(seed=99), source_dir=tmp_path)  # different init: the load must win
    state = resumed.load_checkpoint(tmp_path / "ckpt")
    assert state == {"version": 2, "trained_groups_lines": 2} and resumed.version == 2
    again = resumed.train_step(make_groups(3))
    assert again.version == continued.version == 3
    assert again.lr == continued.lr  # the LR schedule resumed too
    assert again.loss == continued.loss
    a, b = params_of(first.engine.module), params_of(resumed.engine.module)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_hf_export_loads_in_transformers_with_equal_logits(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "tokenizer_config.json").write_text('{"model_max_length": 512}')
    learner = Learner(make_cfg(tmp_path), tiny_model(), source_dir=source)
    learner.train_step(make_groups(0))
    learner.export_hf(tmp_path / "hf")
    exported = tmp_path / "hf"
    assert (exported / "config.json").is_file() and (exported / "tokenizer_config.json").is_file()
    assert "lm_head.weight" not in load_file(exported / "model.safetensors")  # tied: stored once
    loaded = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5]])
    with torch.no_grad():
        expected = learner.engine.module(input_ids=ids).logits
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=0, atol=0)


def test_zero3_gather_gives_the_same_tensors_as_stage0(tmp_path: Path) -> None:
    stage0 = Learner(make_cfg(tmp_path), tiny_model(), source_dir=tmp_path)
    stage3 = Learner(make_cfg(tmp_path, learner={"zero_stage": 3}), tiny_model(), source_dir=tmp_path)
    a, b = stage0.gather_state_dict(), stage3.gather_state_dict()
    assert a is not None and b is not None
    assert list(a) == list(b) and "lm_head.weight" not in b
    assert all(torch.equal(a[n], b[n]) for n in a)
    groups = make_groups(5)
    m0, m3 = stage0.train_step(groups), stage3.train_step(groups)
    assert m3.loss == pytest.approx(m0.loss, rel=1e-6) and m3.grad_norm == pytest.approx(
        m0.grad_norm, rel=1e-5
    )
    a, b = stage0.gather_state_dict(), stage3.gather_state_dict()
    assert a is not None and b is not None
    for name in a:
        assert b[name].shape == a[name].shape  # really gathered, not a partition
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------- service


class FakeBuffer:
    """The buffer's learner-facing protocol, from a thread: hello, batches (one `empty` first, to
    exercise the back-off), commits. Fetches the weights once, while the learner waits for data.

    It binds a port of the kernel's choosing; `cfg` is the given config pointed at it, for the learner
    (whose weights port, 0, it reads from the learner's report, `stream_dapo/runtime/ports.py`)."""

    def __init__(self, cfg: Config) -> None:
        self.hellos: list[m.LearnerHello] = []
        self.commits: list[m.Commit] = []
        self.served: list[str] = []
        self.groups: list[m.Group] = []
        self.batch_requests = 0
        self.fetched: tuple[int, Path | None] | None = None
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        t = cfg.transport
        self.endpoint = open_endpoint(
            self._ctx,
            zmq.ROUTER,
            bind="tcp://127.0.0.1:*",
            max_bytes=t.max_message_bytes,
            peer="learner",
        )
        transport = t.model_copy(
            update={"batches_port": endpoint_port(self.endpoint.address), "weights_port": 0}
        )
        self.cfg = cfg.model_copy(update={"transport": transport})
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        seed = 100
        while not self._stop.is_set():
            got = self.endpoint.recv(20)
            if got is None:
                continue
            peer, msg = got
            reply: m.Body
            if msg.type == m.LEARNER_HELLO:
                self.hellos.append(msg.body)
                reply = m.Empty("ready")
            elif msg.type == m.COMMIT:
                self.commits.append(msg.body)
                reply = m.Empty("committed")
            else:
                self.batch_requests += 1
                if self.fetched is None:
                    learner = read_bound_ports(self.cfg.run.out_dir, "learner")
                    assert learner is not None, "the learner reports its ports before it asks for data"
                    weights = f"tcp://127.0.0.1:{learner['transport.weights_port']}"
                    self.fetched = fetch_weights_zmq(
                        weights, -1, timeout=10, dest_dir=Path(self.cfg.run.out_dir) / "gen"
                    )
                    reply = m.Empty("no_waiting_groups")
                else:
                    seed += 1
                    groups = make_groups(
                        seed,
                        n=msg.body.max_groups,
                        version=msg.body.learner_version,
                        group_size=self.cfg.algo.group_size,
                    )
                    self.groups.extend(groups)
                    self.served.extend(g.group_id for g in groups)
                    reply = m.Batch(groups, 0)
            self.endpoint.send(reply, to=peer, request_id=msg.request_id)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.endpoint.close()
        self._ctx.term()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_service_trains_publishes_checkpoints_drains_and_resumes(tmp_path: Path) -> None:
    initial = tiny_model(0)
    initial.save_pretrained(tmp_path / "model")
    cfg = make_cfg(
        tmp_path,
        learner={"total_steps": 4, "sync_every": 1, "checkpoint_every": 2, "mini_batch_samples": 2},
        transport={"timeout_s": 10.0},
        metrics={"learner_port": 0},
        weights={"chunk_bytes": 4096},
    )
    run_dir = tmp_path / "run"

    buffer = FakeBuffer(cfg)
    try:
        assert build_learner(buffer.cfg).run() == 0
    finally:
        buffer.close()
    # Initial weights were published before step 0 and served over ZeroMQ.
    assert buffer.fetched is not None and buffer.fetched[0] == 0 and buffer.fetched[1] is not None
    fetched = load_file(buffer.fetched[1])
    assert all(torch.equal(fetched[n], p) for n, p in params_of(initial).items() if n in fetched)
    sampling = m.Sampling.of(buffer.cfg.generator)  # the learner says its sampling settings (issue 41)
    assert buffer.hellos == [m.LearnerHello(0, 0, sampling)]
    # Two steps per rollout batch of two groups; checkpoints at 2 and 4, each followed by its commit.
    trained = read_jsonl(run_dir / "learner" / "trained_groups.jsonl")
    assert [row["version"] for row in trained] == [1, 2, 3, 4]
    assert [gid for row in trained for gid in row["group_ids"]] == buffer.served
    assert [c.learner_version for c in buffer.commits] == [2, 4]
    assert buffer.commits[0].group_ids == buffer.served[:2]
    metrics = read_jsonl(run_dir / "learner" / "metrics.jsonl")
    assert [row["version"] for row in metrics] == [1, 2, 3, 4]
    for key in (
        "loss",
        "entropy",
        "clip_frac_low",
        "clip_frac_high",
        "reward_mean",
        "accuracy",
        "response_len_mean",
        "truncation_rate",
        "grad_norm",
        "lr",
        "tokens_per_second",
        "max_staleness",
        "groups",
        "wall_time",
    ):
        assert key in metrics[0]
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_000004"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000002", "step_000004"]
    assert (ckpts / "step_000004" / "hf" / "model.safetensors").is_file()
    final = AutoModelForCausalLM.from_pretrained(str(run_dir / "final"))
    assert final.config.tie_word_embeddings

    # Resume from step 4; a stop request (SIGTERM) arrives during step 5, the first of a rollout batch
    # of two: the step finishes, a checkpoint is written, the service returns 0.
    class StopDuringStep5(LearnerService):
        def _after_step(self, metrics: Any, group_ids: list[str]) -> None:
            if metrics.version == 5:
                self.request_stop()
            super()._after_step(metrics, group_ids)

    buffer = FakeBuffer(cfg)
    try:
        stopping = StopDuringStep5(
            learner_settings(buffer.cfg, max_steps=10), ConfiguredCollaborators(buffer.cfg)
        )
        assert stopping.run() == 0
    finally:
        buffer.close()
    assert buffer.hellos == [m.LearnerHello(4, 4, m.Sampling.of(buffer.cfg.generator))]
    # The resumed checkpoint's commit is resent after the hello (it may never have arrived), then
    # the drain checkpoint commits the one group step 5 trained; the other one leased stays
    # uncommitted and goes back to the queue at the next hello.
    assert [c.learner_version for c in buffer.commits] == [4, 5]
    assert buffer.commits[1].group_ids == buffer.served[:1] and len(buffer.served) == 2
    assert (ckpts / "latest").read_text().strip() == "step_000005"
    assert [row["version"] for row in read_jsonl(run_dir / "learner" / "trained_groups.jsonl")] == [
        1,
        2,
        3,
        4,
        5,
    ]
    state = json.loads((ckpts / "step_000005" / "learner_state.json").read_text())
    assert state["version"] == 5 and state["trained_groups_lines"] == 5


def test_the_service_takes_its_settings_and_collaborators_from_its_composition_root(tmp_path: Path) -> None:
    """`build_learner(cfg)` composes; the service reads only its settings and builds its trainer and
    tracker with its collaborators (issue 39: narrow inputs), so a caller hands it a model the config
    does not name (model.path holds none), a tracker of its own and another step count."""
    import dataclasses

    cfg = make_cfg(
        tmp_path,
        learner={"total_steps": 50, "sync_every": 1, "checkpoint_every": 2, "mini_batch_samples": 2},
        transport={"timeout_s": 10.0},
        metrics={"learner_port": 0},
        weights={"chunk_bytes": 4096},
    )
    model = tiny_model(1)
    initial = params_of(model)
    rows: list[int] = []

    class Recorder:
        def log(self, step: int, row: dict[str, Any]) -> None:
            rows.append(step)

        def close(self) -> None:
            pass

    class Injected(ConfiguredCollaborators):
        def trainer(self) -> Learner:
            return Learner(self.cfg, model)

        def tracker(self, resumed_at: int | None) -> Any:
            return Recorder()

    buffer = FakeBuffer(cfg)
    try:
        settings = dataclasses.replace(learner_settings(buffer.cfg), total_steps=2)
        assert LearnerService(settings, Injected(buffer.cfg)).run() == 0
    finally:
        buffer.close()
    assert rows == [1, 2], "the injected tracker, to the injected step count (not learner.total_steps)"
    assert not (tmp_path / "run" / "learner" / "metrics.jsonl").exists(), "the config's tracker was not built"
    assert buffer.fetched is not None and buffer.fetched[0] == 0 and buffer.fetched[1] is not None
    fetched = load_file(buffer.fetched[1])  # version 0: the injected model as it started
    assert all(torch.equal(fetched[n], p) for n, p in initial.items() if n in fetched)


def _service_rank(rank: int, port: int, cfg_json: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # the store at MASTER_PORT is the parent's: only connect
        TORCHELASTIC_RESTART_COUNT="0",
        DS_ACCELERATOR="cpu",
    )
    assert build_learner(Config.model_validate_json(cfg_json), model=tiny_model()).run() == 0
    torch.distributed.destroy_process_group()


def test_two_process_zero3_service_matches_one_process(tmp_path: Path) -> None:
    """The service on two data-parallel ranks (ZeRO-3; uneven shards padded with placeholder
    micro-batches; rank 0 shares each batch with rank 1) takes the steps one process takes: the token
    count is global and DeepSpeed's averaging over ranks is undone."""
    cfg = make_cfg(
        tmp_path,
        algo={"group_size": 4},
        learner={
            "zero_stage": 3,
            "mini_batch_samples": 8,
            "rollout_batch_prompts": 4,
            "total_steps": 2,
            "checkpoint_every": 2,
        },
        transport={"timeout_s": 20.0},
        metrics={"learner_port": 0},
        weights={"chunk_bytes": 4096},
    )
    buffer = FakeBuffer(cfg)
    # The ranks meet at a store this process hosts on a port of the kernel's choosing, held for the
    # whole test (torchrun's agent store): no port is picked, released and bound later.
    store = torch.distributed.TCPStore("127.0.0.1", 0, 3, True, wait_for_workers=False)
    try:
        mp.start_processes(
            _service_rank, args=(store.port, buffer.cfg.model_dump_json()), nprocs=2, start_method="spawn"
        )
    finally:
        buffer.close()
        del store
    assert buffer.fetched is not None and buffer.fetched[0] == 0
    assert [c.learner_version for c in buffer.commits] == [2] and len(buffer.groups) == 4

    single_cfg = cfg.model_copy(deep=True)
    single_cfg.learner.zero_stage = 0
    single = Learner(single_cfg, tiny_model(), source_dir=tmp_path)
    batches = [single.prepare(buffer.groups[i : i + 2]) for i in (0, 2)]
    prox = [single.compute_logprobs(b.micro_batches) for b in batches]  # once per rollout, as the service
    rows = read_jsonl(tmp_path / "run" / "learner" / "metrics.jsonl")
    assert [r["version"] for r in rows] == [1, 2]
    for batch, batch_prox, dp in zip(batches, prox, rows, strict=True):
        one = single.train_step(batch, batch_prox)
        assert dp["loss_tokens"] == one.loss_tokens and dp["tokens"] == one.tokens
        assert dp["loss"] == pytest.approx(one.loss, rel=1e-5)
        assert dp["grad_norm"] == pytest.approx(one.grad_norm, rel=1e-5)
        assert dp["is_weight_mean"] == pytest.approx(one.is_weight_mean, rel=1e-5)
    final = load_file(tmp_path / "run" / "final" / "model.safetensors")
    expected = single.gather_state_dict()
    assert expected is not None and set(final) == set(expected)
    # Adam's g / (|g| + eps) amplifies float noise where gradients are near eps: 1e-5 absolute is
    # still a hundredth of one step of size LR.
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, rtol=1e-5, atol=1e-5)
