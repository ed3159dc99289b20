"""Rank 0's progress: a live bar in a terminal, plain lines in a log, with each algorithm's headline metrics."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from rlhf_cli.output.run_dir import PLANNED_SAVE_ENV, PLANNED_STEP_ENV
from rlhf_cli.rank.progress import TrainingProgress

# What each trainer really logs per step (names from TRL 1.16's trainers and ours), with made-up values.
LOGGED = {
    "rloo": {"reward": 0.41, "kl": 0.0031, "loss": -0.05, "step_time": 1.25, "entropy": 6.2},
    "online_dpo": {"objective/scores": 0.12, "objective/kl": 0.02, "loss": 0.69, "beta": 0.1},
    "ppo": {"objective/scores": 0.52, "objective/kl": 0.4, "loss/policy_avg": -0.01, "loss/value_avg": 0.3,
            "policy/clipfrac_avg": 0.1},
}
SHOWN = {"rloo": ("reward 0.41", "kl 0.0031", "loss -0.05", "s/step 1.25"),
         "online_dpo": ("score 0.12", "kl 0.02", "loss 0.69"),
         "ppo": ("score 0.52", "kl 0.4", "loss -0.01", "value loss 0.3")}


def train(progress: TrainingProgress, logs: dict, steps: int = 3, total: int = 10, start: int = 0) -> None:
    state = SimpleNamespace(global_step=start, max_steps=total)
    progress.on_train_begin(None, state, None)
    for step in range(start + 1, start + steps + 1):
        state.global_step = step
        progress.on_step_end(None, state, None)
        progress.on_log(None, state, None, logs=logs)
    progress.on_log(None, state, None, logs={"train_runtime": 3.0})  # the end-of-training entry shows nothing
    progress.on_train_end(None, state, None)


@pytest.mark.parametrize("algorithm", sorted(LOGGED))
def test_plain_log_gets_one_line_per_logged_step(algorithm: str) -> None:
    out = io.StringIO()
    train(TrainingProgress(algorithm, Console(file=out, force_terminal=False)), LOGGED[algorithm])
    phase, *lines = out.getvalue().splitlines()
    assert phase.startswith("generating the first completions  elapsed ")  # until the first step ends
    assert [line.split("  ")[0] for line in lines] == ["step 1/10", "step 2/10", "step 3/10"]
    assert all(shown in lines[-1] for shown in SHOWN[algorithm])
    assert "elapsed 0:00:0" in lines[-1] and "eta 0:00:0" in lines[-1]
    assert "\x1b[" not in out.getvalue()  # no terminal codes in a SLURM log


@pytest.mark.parametrize("algorithm", sorted(LOGGED))
def test_terminal_gets_a_live_bar_with_step_eta_and_metrics(algorithm: str) -> None:
    out = io.StringIO()
    train(TrainingProgress(algorithm, Console(file=out, force_terminal=True, width=160)), LOGGED[algorithm])
    screen = out.getvalue()
    assert "\x1b[" in screen and "━" in screen  # drawn and redrawn in place, not printed line by line
    assert "3/10" in screen and "eta" in screen
    assert all(shown in screen for shown in SHOWN[algorithm])
    assert "step 1/10" not in screen
    assert "generating the first completions" in screen  # in the bar until the first log


def test_a_resumed_run_counts_its_eta_from_where_it_resumed() -> None:
    out = io.StringIO()
    train(TrainingProgress("rloo", Console(file=out, force_terminal=False)), LOGGED["rloo"], steps=2, start=6)
    assert out.getvalue().splitlines()[1].startswith("step 7/10")


def test_generation_seconds_per_step_since_the_last_log() -> None:
    from rlhf_cli.rank.zero3 import GenerationClock

    out = io.StringIO()
    progress = TrainingProgress("ppo", Console(file=out, force_terminal=False))
    state = SimpleNamespace(global_step=0, max_steps=10)
    progress.on_train_begin(None, state, None)
    GenerationClock.seconds = 3.0  # two steps of generating since training began
    state.global_step = 2
    progress.on_log(None, state, None, logs=LOGGED["ppo"])
    state.global_step = 3
    progress.on_log(None, state, None, logs=LOGGED["ppo"])  # nothing generated since
    _, first, second = out.getvalue().splitlines()
    assert "gen 1.5 s/step" in first and "gen" not in second


def _timed_steps(monkeypatch, steps: list[tuple[float, float]], total: int = 12,
                 save_strategy: str = "no") -> tuple[TrainingProgress, SimpleNamespace, SimpleNamespace]:
    """A progress callback after `steps` (seconds generating, seconds training each) on a fake clock."""
    from rlhf_cli.phases import StepPhase
    from rlhf_cli.rank.phases import PeakMeter, StepPhases

    now = [0.0]
    monkeypatch.delenv(PLANNED_STEP_ENV, raising=False)  # a test that weighs a plan sets it afterwards
    phases = StepPhases(PeakMeter("rss", lambda: {}, lambda: True), clock=lambda: now[0])
    monkeypatch.setattr(StepPhases, "active", phases)
    monkeypatch.setattr("rlhf_cli.rank.progress.time.monotonic", lambda: now[0])
    progress = TrainingProgress("rloo", Console(file=io.StringIO(), force_terminal=False))
    state = SimpleNamespace(global_step=0, max_steps=total)
    args = SimpleNamespace(save_strategy=save_strategy, save_steps=500)
    progress.on_train_begin(args, state, None)
    for step, (generating, training) in enumerate(steps, start=1):
        for phase, seconds in ((StepPhase.GENERATION, generating), (StepPhase.TRAIN, training)):
            phases.begin(phase)
            now[0] += seconds
            phases.end(phase)
        state.global_step = step
        progress.on_step_end(args, state, None)
    return progress, args, state


def test_the_eta_comes_from_the_runs_own_phases_not_a_line_through_its_start_up(monkeypatch) -> None:
    """A first step slowed by start-up (15 s), then steps of 1 s generating and 1 s training: at step 3 of 12 the
    rest is 9 steps of 2 s, as the phases measured since the first step say, where a straight line through the
    elapsed time would say 57 s."""
    monkeypatch.delenv(PLANNED_SAVE_ENV, raising=False)
    progress, args, state = _timed_steps(monkeypatch, [(10.0, 5.0), (1.0, 1.0), (1.0, 1.0)])
    assert progress.eta(args, state) == pytest.approx(18.0)


def test_the_eta_follows_the_steady_steps_as_the_warm_up_fades(monkeypatch) -> None:
    """Steps 2 and 3 still warming up (4 s, then 3 s), then 2 s steps: at step 5 of 12 the ETA takes the later half
    of the steps after the first (4 and 5: 2 s each), 7 x 2 s, not the 2.75 s average of steps 2 to 5."""
    monkeypatch.delenv(PLANNED_SAVE_ENV, raising=False)
    warming = [(10.0, 5.0), (2.0, 2.0), (1.5, 1.5), (1.0, 1.0), (1.0, 1.0)]
    progress, args, state = _timed_steps(monkeypatch, warming)
    assert progress.eta(args, state) == pytest.approx(14.0)
    assert progress.steady_phases() == ({"generation": 1.0, "sync": 0.0, "train": 1.0}, 2)


def test_the_eta_counts_the_final_save_at_the_plans_seconds_until_one_is_measured(monkeypatch) -> None:
    """The final model's save is left at every step: at the plan's seconds of a save (handed down by the launcher)
    while the run has measured none, then at what its own saves took."""
    from rlhf_cli.phases import StepPhase
    from rlhf_cli.rank.phases import StepPhases

    monkeypatch.setenv(PLANNED_SAVE_ENV, "0.5")
    progress, args, state = _timed_steps(monkeypatch, [(10.0, 5.0), (1.0, 1.0), (1.0, 1.0)])
    assert progress.eta(args, state) == pytest.approx(18.5)
    phases = StepPhases.current()
    phases.begin(StepPhase.SAVING)
    phases.clock = lambda: phases.mark + 3.0  # a checkpoint that took 3 s
    phases.end(StepPhase.SAVING)
    progress.on_save(args, state, None)
    assert progress.eta(args, state) == pytest.approx(18.0 + 3.0)



def test_the_eta_weighs_a_plan_of_this_machine_against_the_few_steps_measured(monkeypatch) -> None:
    """Step 3 of 12 at 2.5 s, where the plan says 2 s (within PLAN_AGREES): its one steady step and the plan counted
    as one more give 2.25 s a step for the 9 left; at step 21 of 30, ten steady steps of 2.5 s and the plan's 2 s give
    2.45 s a step. A step twice the plan's says the plan is stale (the machine slowed since its calibration): the
    steps alone. Before a second step the plan alone gives the rate, not the start-up."""
    import json

    from rlhf_cli.machine.corrections import PLAN_AGREES, PLAN_WEIGHT_STEPS

    assert PLAN_WEIGHT_STEPS == 1 and 0.25 < PLAN_AGREES < 1  # the numbers below are worked out for them
    plan = json.dumps({"generation": 1.0, "sync": 0.0, "train": 1.0})
    progress, args, state = _timed_steps(monkeypatch, [(10.0, 5.0), (1.0, 1.0), (1.25, 1.25)])
    monkeypatch.delenv(PLANNED_SAVE_ENV, raising=False)
    assert progress.eta(args, state) == pytest.approx(9 * 2.5)  # the measured step alone, without a plan
    monkeypatch.setenv(PLANNED_STEP_ENV, plan)
    assert progress.eta(args, state) == pytest.approx(9 * 2.25)
    progress, args, state = _timed_steps(monkeypatch, [(10.0, 5.0), (1.0, 1.0), (2.0, 2.0)])
    monkeypatch.setenv(PLANNED_STEP_ENV, plan)
    assert progress.eta(args, state) == pytest.approx(9 * 4.0)
    progress, args, state = _timed_steps(monkeypatch, [(10.0, 5.0)] + [(1.25, 1.25)] * 20, total=30)
    monkeypatch.setenv(PLANNED_STEP_ENV, plan)
    assert progress.eta(args, state) == pytest.approx(9 * (2.5 * 10 + 2.0) / 11)
    progress, args, state = _timed_steps(monkeypatch, [(10.0, 5.0)])
    monkeypatch.setenv(PLANNED_STEP_ENV, json.dumps({"generation": 1.5, "sync": 0.25, "train": 1.0}))
    assert progress.eta(args, state) == pytest.approx(11 * 2.75)


def test_one_slow_step_does_not_carry_the_eta_for_as_long_as_the_window(monkeypatch) -> None:
    """GRPO with vLLM colocated on the CPU: step 5 took 1.38 s against 0.14 s for the others (vLLM's first new
    shape), and the ETA stayed high for 3-4 steps after it. Here step 5 takes 20 s among 2 s steps: at step 6 of
    12 the rate is the 2 s steps' (6 x 2 s), not their mean with it (6 x 8 s)."""
    monkeypatch.delenv(PLANNED_SAVE_ENV, raising=False)
    steps = [(10.0, 5.0), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (10.0, 10.0), (1.0, 1.0)]
    progress, args, state = _timed_steps(monkeypatch, steps)
    assert progress.steady_phases() == ({"generation": 1.0, "sync": 0.0, "train": 1.0}, 2)
    assert progress.eta(args, state) == pytest.approx(12.0)


def test_a_slow_step_that_comes_every_generation_round_is_counted() -> None:
    """RLOO and GRPO generate every steps_per_generation x num_iterations micro-batches: with 2 optimizer steps a
    round, the slow step is the round's generation and stays in the rate; with 1, a step 10 times the others is a
    one-off; two steps are too few to tell."""
    from rlhf_cli.rank.progress import _generation_period, _without_one_off

    assert _generation_period(SimpleNamespace(gradient_accumulation_steps=4, steps_per_generation=None,
                                              num_iterations=1)) == 1
    assert _generation_period(SimpleNamespace(gradient_accumulation_steps=2, steps_per_generation=4,
                                              num_iterations=2)) == 4
    assert _generation_period(SimpleNamespace(gradient_accumulation_steps=1, num_ppo_epochs=4)) == 1  # PPO
    window = [(1, {"generation": 0.1, "train": 0.1}), (1, {"generation": 2.0, "train": 0.1}),
              (1, {"generation": 0.1, "train": 0.1})]
    assert _without_one_off(window, 2) == window
    assert _without_one_off(window, 1) == [window[0], window[2]]
    assert _without_one_off(window[:2], 1) == window[:2]


def test_a_planned_step_that_cannot_be_read_is_no_plan(monkeypatch) -> None:
    from rlhf_cli.rank.progress import _planned_steps

    for unreadable in ("", "not json", "[1, 2]"):
        monkeypatch.setenv(PLANNED_STEP_ENV, unreadable)
        assert _planned_steps() is None
    monkeypatch.setenv(PLANNED_STEP_ENV, '{"generation": 0.5, "sync": "x", "train": -1, "saving": 2}')
    assert _planned_steps() == {"generation": 0.5, "saving": 2.0}


def test_a_planned_save_that_is_not_a_number_counts_nothing(monkeypatch) -> None:
    from rlhf_cli.rank.progress import _planned_save

    monkeypatch.setenv(PLANNED_SAVE_ENV, "not a number")
    assert _planned_save() == 0.0
    monkeypatch.setenv(PLANNED_SAVE_ENV, "0.25")
    assert _planned_save() == 0.25


def test_the_sync_log_shows_the_syncs_since_the_last_line() -> None:
    """Seconds summed, the largest gathered bytes, the last sync's kind and bytes sent, the worst self-check; each
    sync shown once."""
    from rlhf_cli.rank.engines.sync_log import SyncLog

    log = SyncLog()
    assert log.progress_text() == ""
    log.add({"seconds": 0.25, "peak_bytes": 4 << 20, "mode": "dense", "bytes_sent": 8 << 20,
             "check_logp_difference": 2e-7})
    log.add({"seconds": 0.5, "peak_bytes": 1 << 20, "mode": "sparse", "changed_share": 0.008, "bytes_sent": 96 << 10})
    text = log.progress_text()
    assert text.startswith("  sync 0.75 s 4") and " sparse 0.80% 96" in text and text.endswith(" check 2e-07")
    assert log.progress_text() == "" and len(log.records()) == 2


def test_the_eta_is_rounded_and_to_a_tenth_of_a_second_under_a_minute() -> None:
    """A short run's whole seconds, cut, would be its error: 3.96 s left showed as 3."""
    from rlhf_cli.rank.progress import _eta_clock

    assert [_eta_clock(seconds) for seconds in (3.96, 0.0, 59.97, 125.6, 3599.6)] == [
        "0:00:04.0", "0:00:00.0", "0:01:00", "0:02:06", "1:00:00"]


def test_a_long_run_keeps_a_bounded_number_of_step_marks_and_its_eta_follows_its_recent_steps(monkeypatch) -> None:
    """1000 steps of 2 s, then 300 of 1 s: the callback holds at most MARKS_KEPT marks, and the rate is the
    recent steps' (1 s), not an average reaching back to the slow ones."""
    from rlhf_cli.rank.progress import MARKS_KEPT

    monkeypatch.delenv(PLANNED_SAVE_ENV, raising=False)
    progress, args, state = _timed_steps(monkeypatch, [(1.0, 1.0)] * 1000 + [(0.5, 0.5)] * 300, total=1400)
    assert len(progress.marks) == MARKS_KEPT
    assert progress.steady_phases() == ({"generation": 0.5, "sync": 0.0, "train": 0.5}, 200)
    assert progress.eta(args, state) == pytest.approx(100.0)
