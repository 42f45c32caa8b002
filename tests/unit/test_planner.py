"""`stream-dapo plan`: the throughput model against hand-computed numbers, and the command.

The small recipe used throughout: G = 4, 8 prompts per rollout batch, 8 samples per optimizer step,
so B_v = 2 groups per step and S = 4 steps per rollout batch; max_staleness 9 and sync_every 1 give
an admission line of C = (9 - 4 - 0 + 1) * 2 = 12 groups. Rates: responses of 100 tokens, prompts of
25, half the groups kept, 400 response tokens/s per replica, 500 trained tokens/s. The engine
scaling is the default a = 1 (tokens/s in proportion to the groups in flight) unless a test says.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stream_dapo.cli import main
from stream_dapo.config import load_config
from stream_dapo.tools.plan import (
    ENGINE_SCALING,
    PlanError,
    Rates,
    Recipe,
    capacity_for_step,
    engine_groups,
    group_residence_seconds,
    line_step_seconds,
    max_staleness_for_capacity,
    measure_from_prometheus,
    plan,
    token_age_from_counts,
)

PAPER = Path(__file__).resolve().parents[2] / "configs" / "dapo-qwen2.5-32b.toml"

RECIPE = Recipe(
    group_size=4,
    rollout_batch_prompts=8,
    mini_batch_samples=8,
    max_response_len=400,
    max_prompt_len=200,
    max_staleness=9,
    sync_every=1,
    num_generators=4,
    max_groups_in_flight=2,
)
RATES = Rates(gen_tps=400, learn_tps=500, mean_response_len=100, prompt_len=25, keep_fraction=0.5)


def test_learner_bound_recipe_matches_hand_computation() -> None:
    p = plan(RECIPE, RATES)
    assert p.over_generation == 2.0
    assert p.learner_tokens == 8 * (25 + 100) == 1000
    assert p.generator_tokens == 8 * 100 * 2 == 1600
    assert p.learner_s == pytest.approx(2.0)  # 1000 / 500
    assert p.replica_s == pytest.approx(4.0)  # 1600 / 400
    assert p.generators_s == pytest.approx(1.0)  # 4.0 / 4 replicas
    assert p.group_s == pytest.approx(2.0)  # 2 groups x 4 samples x 100 tokens / 400
    # 16 x^2 + 8 x = 12 with x = 1/t: x = (-8 + sqrt(832)) / 32
    assert p.line_s == pytest.approx(32 / (-8 + 832**0.5))
    assert p.bottleneck == "learner" and p.step_s == pytest.approx(2.0)
    assert p.replicas_to_match == pytest.approx(2.0) and p.replicas_needed == 2
    assert p.learner_busy == pytest.approx(1.0) and p.generators_busy == pytest.approx(0.5)
    # in flight: B_v D / (k t) = 2 * 2 / (0.5 * 2) = 4; the rest of the full line waits
    assert p.in_flight_groups == pytest.approx(4.0) and p.waiting_groups == pytest.approx(8.0)
    st = p.staleness
    assert (st.weight_lag, st.in_flight, st.queue, st.batch_position) == pytest.approx((0.0, 0.5, 4.0, 1.5))
    assert st.total == pytest.approx(6.0)
    # line needed at t = 2: 4 in flight + (8/2)(2/2)^2 = 8 groups -> ceil(8/2) + 4 + 1 - 2 = 7
    assert p.max_staleness_needed == 7
    assert len(p.warnings) == 1 and "4 generators where 2 keep the learner busy" in p.warnings[0]


def test_tokens_that_wait_longer_for_their_group_are_staler_by_that_share() -> None:
    # Learner-bound recipe above: D = 2 s, t = 2 s. rho = 0.75 instead of 0.5: in flight 0.75 D/t.
    st = plan(RECIPE, replace(RATES, token_age=0.75)).staleness
    assert st.in_flight == pytest.approx(0.75)
    assert st.total == pytest.approx(6.25)  # only that part moves


def test_token_age_from_counts_is_mean_wait_over_mean_group_length() -> None:
    # Groups [3, 1, 2] and [4, 4] (see FinishedGroup.tail_tokens): tails 8 and 12 over 14 tokens;
    # longest 3 and 4 over 2 groups. (20 / 14) / 3.5 = 0.408...
    assert token_age_from_counts(20, 14, 7, 2) == pytest.approx((20 / 14) / 3.5)
    # Equal lengths L: (L - 1) / 2 steps per token over L steps, just under one half.
    assert token_age_from_counts(12, 8, 4, 1) == pytest.approx(3 / 8)
    with pytest.raises(PlanError, match="--token-age"):
        token_age_from_counts(0, 0, 0, 0)


def test_generator_bound_recipe_matches_hand_computation() -> None:
    p = plan(replace(RECIPE, num_generators=1), RATES)
    assert p.bottleneck == "generators" and p.step_s == pytest.approx(4.0)
    assert p.learner_busy == pytest.approx(0.5) and p.generators_busy == pytest.approx(1.0)
    # in flight B_v D / (k t) = 2 * 2 / (0.5 * 4) = 2; waiting (8/2)(2/4)^2 = 1
    assert p.in_flight_groups == pytest.approx(2.0) and p.waiting_groups == pytest.approx(1.0)
    st = p.staleness
    # D/(2t) = 2/8; queue = (t_L/t) S/2 = 0.5 * 2
    assert (st.in_flight, st.queue, st.batch_position) == pytest.approx((0.25, 1.0, 1.5))
    assert st.total == pytest.approx(2.75)
    assert "set generator.num_generators >= 2" in p.warnings[0]


def test_admission_line_bound_recipe_matches_hand_computation() -> None:
    # 11 groups in flight per replica: D = 11 * 4 * 100 / 400 = 11 s. a = B_v D / k = 44, b = 16:
    # 16 x^2 + 44 x = 12 -> x = 1/4, so the line sustains one step per 4 s while the learner needs 2.
    p = plan(replace(RECIPE, max_groups_in_flight=11), RATES)
    assert p.group_s == pytest.approx(11.0)
    assert p.line_s == pytest.approx(4.0)
    assert p.bottleneck == "admission line" and p.step_s == pytest.approx(4.0)
    assert p.learner_busy == pytest.approx(0.5) and p.generators_busy == pytest.approx(0.25)
    assert p.in_flight_groups + p.waiting_groups == pytest.approx(12.0)  # the line is full
    assert p.staleness.total == pytest.approx(11 / 8 + 1.0 + 1.5)
    # at t = 2: 44 / 2 + 4 = 26 groups -> ceil(26 / 2) + 4 + 1 - 2 = 16
    assert p.max_staleness_needed == 16
    assert "100.0% slower" in p.warnings[0] and "algo.max_staleness >= 16" in p.warnings[0]


def test_adding_generators_names_the_staleness_bound_their_line_needs() -> None:
    # D = 11 s; a busy learner (t = 2) needs 44/2 + 4 = 26 groups in line: max_staleness 16, not 15
    p = plan(
        replace(RECIPE, max_groups_in_flight=11, num_generators=1, max_staleness=15),
        RATES,
    )
    assert p.bottleneck == "generators" and p.step_s == pytest.approx(4.0)
    assert "num_generators >= 2 and algo.max_staleness >= 16 so the line holds" in p.warnings[0]


def test_weight_sync_pauses_both_sides_and_lags_generators() -> None:
    # sync_every 2, max_staleness 10 keeps C = (10 - 4 - 1 + 1) * 2 = 12; 1 s per publication
    recipe = replace(RECIPE, sync_every=2, max_staleness=10)
    p = plan(recipe, replace(RATES, weight_sync_s=1.0))
    assert p.learner_s == pytest.approx(2.5)  # 2.0 + 1.0 / 2
    assert p.generators_s == pytest.approx(1.5)  # 4.0 / 4 + 0.5
    assert p.replicas_to_match == pytest.approx(2.0)  # 4.0 / (2.5 - 0.5)
    st = p.staleness
    # weight lag (2-1)/2; in flight 2/(2*2.5); queue 12/2 - 2/(0.5*2.5)
    assert (st.weight_lag, st.in_flight, st.queue) == pytest.approx((0.5, 0.4, 4.4))


def test_line_step_is_where_the_line_is_exactly_full() -> None:
    for scaling in (1.0, 0.5, 0.1, 0.0):
        rates = replace(RATES, gen_scaling=scaling)
        t = line_step_seconds(RECIPE, rates, learner_s=3.0)
        assert capacity_for_step(RECIPE, rates, t, 3.0) == pytest.approx(12.0)


# Engine scaling: M = 8 groups per replica, so D_M = 8 x 4 x 100 / 400 = 8 s in a full engine.
# max_staleness 10 gives C = (10 - 4 + 1) x 2 = 14. t_L = 2 s, t_1 = 4 s, t_G = 1 s as above.
WIDE = replace(RECIPE, max_groups_in_flight=8, max_staleness=10)


def test_an_engine_whose_throughput_grows_with_the_batch_makes_the_line_the_bottleneck() -> None:
    # a = 1: D = 8 s at any load. 32/t + 16/t^2 = 14 -> 14 t^2 - 32 t - 16 = 0
    p = plan(WIDE, RATES)
    t = (32 + (32**2 + 4 * 14 * 16) ** 0.5) / 28
    assert p.group_s == pytest.approx(8.0) and p.full_group_s == pytest.approx(8.0)
    assert p.bottleneck == "admission line" and p.step_s == pytest.approx(t)  # 2.708 s
    assert p.learner_busy == pytest.approx(2 / t)


def test_a_flatter_engine_holds_fewer_groups_that_finish_sooner() -> None:
    # a = 0.5 at t = t_L = 2: u = t_1 / (N t) = 4 / 8 = 1/2 of a replica's full rate, which
    # m = 8 (1/2)^2 = 2 groups make (400 (2/8)^0.5 = 200 tokens/s = 0.5 groups/s x 400 tokens);
    # D(2) = 8 (2/8)^0.5 = 4 s. The line at step t: 4 replicas x 8 (1/t)^2 in flight + 16/t^2
    # waiting = 48/t^2 = 14 at t = 1.85 < t_L, so the learner is the bottleneck.
    p = plan(WIDE, replace(RATES, gen_scaling=0.5))
    assert p.line_s == pytest.approx((48 / 14) ** 0.5)
    assert p.bottleneck == "learner" and p.step_s == pytest.approx(2.0)
    assert p.engine_groups == pytest.approx(2.0) and p.group_s == pytest.approx(4.0)
    assert p.full_group_s == pytest.approx(8.0)
    # in flight B_v D / (k t) = 2 x 4 / (0.5 x 2) = 8 = 4 replicas x 2; the line's other 6 wait
    assert p.in_flight_groups == pytest.approx(8.0) and p.waiting_groups == pytest.approx(6.0)
    st = p.staleness
    # D/(2t) = 1; queue C/B_v - D/(k t_L) = 7 - 4; position (4 - 1)/2
    assert (st.in_flight, st.queue, st.batch_position) == pytest.approx((1.0, 3.0, 1.5))
    # the line a busy learner needs: 8 + (8/2)(2/2)^2 = 12 groups -> ceil(12/2) + 4 + 1 - 2 = 9
    assert p.max_staleness_needed == 9


def test_a_flat_engine_runs_one_group_at_a_time() -> None:
    # a = 0: tokens/s is 400 at any load, so a replica needing half of it runs one group at a
    # time, D(1) = 4 x 100 / 400 = 1 s, and idles half the time: 2 attempts/s x 1 s = 2 in flight.
    rates = replace(RATES, gen_scaling=0.0)
    assert engine_groups(WIDE, rates, 2.0) == 1.0
    assert group_residence_seconds(WIDE, rates, 1.0) == pytest.approx(1.0)
    p = plan(WIDE, rates)
    assert p.bottleneck == "learner" and p.group_s == pytest.approx(1.0)
    assert p.in_flight_groups == pytest.approx(2.0) and p.waiting_groups == pytest.approx(12.0)
    assert p.staleness.queue == pytest.approx(7 - 1)  # C/B_v - D/(k t_L)
    # a generator-bound replica is full whatever a: t = t_G = 4 s with one replica
    one = plan(replace(WIDE, num_generators=1), rates)
    assert one.bottleneck == "generators" and one.engine_groups == 8.0 and one.group_s == pytest.approx(8.0)


def test_engine_scaling_one_is_the_full_engine_at_any_load() -> None:
    for step in (1.0, 2.0, 8.0):
        m = engine_groups(WIDE, RATES, step)
        assert m == pytest.approx(min(8.0, max(1.0, 8 * 4 / (4 * step))))
        assert group_residence_seconds(WIDE, RATES, m) == pytest.approx(8.0)


def test_max_staleness_for_capacity_inverts_the_config_formula() -> None:
    cfg = load_config([PAPER], environ={})
    recipe = Recipe.from_config(cfg)
    assert (recipe.groups_per_version, recipe.steps_per_rollout, recipe.capacity) == (32, 16, 544)
    assert max_staleness_for_capacity(recipe, 544) == 32
    assert max_staleness_for_capacity(recipe, 545) == 33
    bigger = load_config([PAPER], ["algo.max_staleness=33"], environ={})
    assert bigger.admission.capacity == 576 >= 545


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"keep_fraction": 0.0}, "--keep-fraction"),
        ({"keep_fraction": 1.5}, "--keep-fraction"),
        ({"gen_tps": 0.0}, "--gen-tps"),
        ({"learn_tps": -1.0}, "--learn-tps"),
        ({"mean_response_len": 401.0}, "--mean-response-len"),
        ({"gen_scaling": 1.5}, "--gen-scaling"),
        ({"gen_scaling": -0.1}, "--gen-scaling"),
        ({"token_age": 1.0}, "--token-age"),
        ({"token_age": -0.1}, "--token-age"),
    ],
)
def test_bad_rates_name_the_flag(change: dict[str, float], flag: str) -> None:
    with pytest.raises(PlanError, match=flag):
        plan(RECIPE, replace(RATES, **change))


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def test_plan_prints_the_paper_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--config", str(PAPER), "--gen-tps", "6000", "--learn-tps", "15000"]
    assert main([*argv, "--weight-sync-seconds", "10"]) == 0
    out = capsys.readouterr().out
    # 512 x 5120 / 0.5 / 6000 = 873.8 s per replica; 512 x 5376 / 15000 = 183.5 s + 10 s sync
    assert "2.00 x" in out and "5,242,880" in out and "2,752,512" in out
    assert "193.5 s" in out and "873.8 s" in out
    assert "4.76 -> 5 keep the learner busy (configured: 8)" in out
    assert "default: 0.25 x algo.max_response_len" in out


def test_gen_scaling_takes_a_number_or_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--config", str(PAPER), "--gen-tps", "6000", "--learn-tps", "15000", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rates"]["gen_scaling"] == 1.0 and data["sources"]["gen_scaling"].startswith("default: gpu")
    assert main([*argv, "--gen-scaling", "cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["rates"]["gen_scaling"] == ENGINE_SCALING["cpu"]
        and data["sources"]["gen_scaling"] == "--gen-scaling"
    )
    assert main([*argv, "--gen-scaling", "0.25"]) == 0
    assert json.loads(capsys.readouterr().out)["rates"]["gen_scaling"] == 0.25
    with pytest.raises(SystemExit):
        main([*argv, "--gen-scaling", "tpu"])
    assert "neither a number in [0, 1] nor one of gpu, cpu" in capsys.readouterr().err
    assert main([*argv, "--gen-scaling", "2"]) == 2
    assert "pass --gen-scaling" in capsys.readouterr().err


def test_plan_without_rates_says_what_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(PAPER)]) == 2
    err = capsys.readouterr().err
    assert "--gen-tps" in err and "--from-prometheus" in err


def test_dynamic_sampling_off_keeps_every_group(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--set", "algo.dynamic_sampling=false", "--gen-tps", "300", "--learn-tps", "2000"]
    assert main([*argv, "--keep-fraction", "0.2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rates"]["keep_fraction"] == 1.0 and data["over_generation"] == 1.0
    assert data["sources"]["keep_fraction"] == "algo.dynamic_sampling = false"


# Prometheus: a canned HTTP API on a free local port.

W = "30m"
CANNED = {
    f"avg(rate(stream_dapo_generator_tokens_total[{W}]))": 6000.0,
    f"sum(rate(stream_dapo_learner_tokens_total[{W}]))": 12000.0,
    f"sum(rate(stream_dapo_learner_batch_wait_seconds_sum[{W}]))": 0.1,
    f"sum(rate(stream_dapo_learner_weight_sync_seconds_sum[{W}]))": 0.1,
    f"sum(rate(stream_dapo_learner_weight_sync_seconds_count[{W}]))": 0.01,
    f"sum(rate(stream_dapo_generator_response_length_tokens_sum[{W}]))": 512.0,
    f"sum(rate(stream_dapo_generator_response_length_tokens_count[{W}]))": 0.1,
    f'sum(rate(stream_dapo_generator_groups_total{{outcome="mixed"}}[{W}]))': 0.5,
    f"sum(rate(stream_dapo_generator_groups_total[{W}]))": 1.0,
}


class FakePrometheus:
    def __init__(self, series: dict[str, float]) -> None:
        self.series = series
        self.queries: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                promql = urllib.parse.parse_qs(url.query).get("query", [""])[0]
                fake.queries.append(promql)
                result = (
                    [{"metric": {}, "value": [1.7e9, str(fake.series[promql])]}]
                    if promql in fake.series
                    else []
                )
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
                self.send_response(200 if url.path == "/api/v1/query" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus(dict(CANNED))
    yield fake
    fake.close()


def test_measure_from_prometheus_combines_rates(prometheus: FakePrometheus) -> None:
    wanted = ["gen_tps", "learn_tps", "mean_response_len", "keep_fraction", "weight_sync_s"]
    got = measure_from_prometheus(prometheus.url, W, wanted)
    assert got == pytest.approx(
        {
            "gen_tps": 6000.0,
            "learn_tps": 15000.0,  # 12000 tokens/s over the 80% of the time not waiting or syncing
            "mean_response_len": 5120.0,
            "keep_fraction": 0.5,
            "weight_sync_s": 10.0,
        }
    )


def test_plan_from_prometheus_gives_the_documented_example(
    prometheus: FakePrometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--config", str(PAPER), "--from-prometheus", prometheus.url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sources"]["gen_tps"] == "Prometheus, rate over 30m"
    assert data["learner_s"] == pytest.approx(2_752_512 / 15000 + 10)
    assert data["replicas_needed"] == 5 and data["recipe"]["num_generators"] == 8


def test_prometheus_rate_is_scaled_to_a_full_engine_by_the_groups_held(
    prometheus: FakePrometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    # The paper recipe's engines hold up to 64 groups; these held 16 on average while making 6,000
    # tokens/s. a = 1: a full engine makes 6000 x 64/16 = 24,000; a = 0.5: 6000 x 2 = 12,000.
    prometheus.series[f"avg(avg_over_time(stream_dapo_generator_groups_in_flight[{W}]))"] = 16.0
    argv = ["plan", "--config", str(PAPER), "--from-prometheus", prometheus.url, "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rates"]["gen_tps"] == pytest.approx(24000.0)
    assert data["sources"]["gen_tps"] == "Prometheus, rate over 30m x (64 / 16.0 groups held)^1"
    assert main([*argv, "--gen-scaling", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["rates"]["gen_tps"] == pytest.approx(12000.0)
    # without the gauge the average rate is taken as it is (the documented example above)
    del prometheus.series[f"avg(avg_over_time(stream_dapo_generator_groups_in_flight[{W}]))"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["rates"]["gen_tps"] == pytest.approx(6000.0)


def test_token_age_comes_from_the_generators_counters_when_they_have_them(
    prometheus: FakePrometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--config", str(PAPER), "--from-prometheus", prometheus.url, "--json"]
    assert main(argv) == 0  # generators without the counters: the default, said so
    data = json.loads(capsys.readouterr().out)
    assert data["rates"]["token_age"] == 0.5 and data["sources"]["token_age"].startswith("default")
    # 640 tail steps per second over 512 tokens per second; groups of 1,600 steps on average.
    prometheus.series[f"sum(rate(stream_dapo_generator_group_tail_tokens_total[{W}]))"] = 640.0
    prometheus.series[f"sum(rate(stream_dapo_generator_group_longest_tokens_sum[{W}]))"] = 40.0
    prometheus.series[f"sum(rate(stream_dapo_generator_group_longest_tokens_count[{W}]))"] = 0.025
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rates"]["token_age"] == pytest.approx((640 / 512) / 1600)
    assert data["sources"]["token_age"] == "Prometheus, rate over 30m"
    assert main([*argv, "--token-age", "0.6"]) == 0  # the flag wins
    assert json.loads(capsys.readouterr().out)["rates"]["token_age"] == 0.6


def test_flags_win_over_prometheus(prometheus: FakePrometheus, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--config", str(PAPER), "--from-prometheus", prometheus.url, "--gen-tps", "3000"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rates"]["gen_tps"] == 3000.0
    assert not any("generator_tokens_total" in q for q in prometheus.queries)


def test_missing_series_names_the_flag(
    prometheus: FakePrometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    del prometheus.series[f"avg(rate(stream_dapo_generator_tokens_total[{W}]))"]
    assert main(["plan", "--config", str(PAPER), "--from-prometheus", prometheus.url]) == 2
    err = capsys.readouterr().err
    assert "no data for generator tokens" in err and "pass --gen-tps" in err


def test_unreachable_prometheus_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # bound, never listening, held: nobody listens on it meanwhile
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        assert main(["plan", "--config", str(PAPER), "--from-prometheus", url, "--timeout", "2"]) == 2
        err = capsys.readouterr().err
        assert f"cannot reach Prometheus at {url}" in err and "--gen-tps X --learn-tps Y" in err


def test_url_without_scheme_and_bad_window_are_named() -> None:
    with pytest.raises(PlanError, match="with its scheme"):
        measure_from_prometheus("prometheus:9090", W, ["gen_tps"])
    with pytest.raises(PlanError, match="--window"):
        measure_from_prometheus("http://prometheus:9090", "30 minutes", ["gen_tps"])
