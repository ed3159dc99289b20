"""The private internals rlhf relies on still exist in the installed TRL, transformers, DeepSpeed, accelerate and
torch. Seconds, no launch: an upgrade that moves one fails here, not in a run on a GPU node."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import needs_vllm
from rlhf_cli import compat
from rlhf_cli.compat import vllm as vllm_compat
from rlhf_cli.compat import vllm_lora


@pytest.mark.parametrize("internal", compat.INTERNALS, ids=[internal.path for internal in compat.INTERNALS])
def test_internal_is_where_rlhf_expects_it(internal: compat.Internal) -> None:
    compat.check(internal)
    assert internal.why and internal.until


@pytest.mark.parametrize("internal", vllm_compat.TRL_VLLM_INTERNALS,
                         ids=[i.path for i in vllm_compat.TRL_VLLM_INTERNALS])
def test_trls_vllm_sync_is_where_rlhf_replaces_it(internal: compat.Internal) -> None:
    compat.check(internal)
    assert internal.why and internal.until


@needs_vllm
@pytest.mark.parametrize("internal", vllm_compat.VLLM_INTERNALS + vllm_lora.VLLM_LORA_INTERNALS,
                         ids=[i.path for i in vllm_compat.VLLM_INTERNALS + vllm_lora.VLLM_LORA_INTERNALS])
def test_vllm_internal_is_where_rlhf_expects_it(internal: compat.Internal) -> None:
    compat.check(internal)
    assert internal.why and internal.until


def test_trls_vllm_syncs_through_rlhf_colocated_and_served(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Colocated, the weights go into the rank's vLLM; served, into the run's weight directory, with the client TRL
    built (rank 0's), and TRL's NCCL communicator is never set up; the recipe's `weight_sync_delta` reaches every
    sync."""
    import torch
    from trl.experimental.online_dpo import OnlineDPOTrainer
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    from rlhf_cli.algorithms import ALGORITHMS
    from rlhf_cli.generation.choice import Gather
    from rlhf_cli.generation.sync_buckets import PER_UNIT
    from rlhf_cli.rank.engines.vllm import sync as vllm_sync

    originals = (VLLMGeneration.sync_weights, OnlineDPOTrainer._move_model_to_vllm, VLLMClient.init_communicator,
                 VLLMClient.generate, VLLMClient.chat, VLLMGeneration.generate, OnlineDPOTrainer.__init__,
                 OnlineDPOTrainer._generate_vllm)
    for owner, name, original in ((VLLMGeneration, "generate", originals[5]),
                                  (OnlineDPOTrainer, "_generate_vllm", originals[7]),
                                  (VLLMGeneration, "sync_weights", originals[0]),
                                  (OnlineDPOTrainer, "_move_model_to_vllm", originals[1]),
                                  (VLLMClient, "init_communicator", originals[2]),
                                  (VLLMClient, "generate", originals[3]), (VLLMClient, "chat", originals[4]),
                                  (OnlineDPOTrainer, "__init__", originals[6])):
        monkeypatch.setattr(owner, name, original)  # restored after the test
    monkeypatch.setattr(vllm_compat, "replace_trl_vllm_engine", lambda factory: None)  # TRL imports LLM only with vLLM
    synced = []
    monkeypatch.setattr(vllm_sync.ColocatedVLLM, "of", lambda llm, check: (llm, check))
    monkeypatch.setattr(vllm_sync, "sync_weights", lambda model, target, limit, woke=False, delta=True: synced.append(
        (model, target, limit, delta)))
    for hook in sorted({entry.sync_hooks["vllm"] for entry in ALGORITHMS.values()}):  # each trainer's sync replaced
        vllm_sync.install_vllm(Gather.shards, dtype="float32", seed=0, check="the check", output_dir=str(tmp_path),
                               sync_hook=hook, delta=False)
    assert VLLMGeneration.sync_weights.__wrapped__ is originals[0]
    assert OnlineDPOTrainer._move_model_to_vllm.__wrapped__ is originals[1]
    assert VLLMClient.init_communicator.__wrapped__ is originals[2]
    assert VLLMClient.init_communicator(object(), device="cpu") is None  # no NCCL group, no server call

    class Generation:
        mode, enable_sleep_mode, model, llm = "colocate", False, torch.nn.Linear(2, 2), object()

    VLLMGeneration.sync_weights(Generation())
    assert synced[0][1] == (Generation.llm, "the check") and synced[0][2].numel == PER_UNIT
    served = Generation()
    served.mode, served.vllm_client = "server", object.__new__(VLLMClient)
    VLLMGeneration.sync_weights(served)
    target = synced[1][1]
    assert isinstance(target, vllm_sync.ServerTarget) and target.client is served.vllm_client
    assert target.weight_dir == tmp_path / "vllm-weights" and served.vllm_client.rlhf_server_target is target
    VLLMGeneration.sync_weights(served)
    assert synced[2][1] is target  # one target a generator: it counts the syncs it sent
    assert [delta for *_, delta in synced] == [False] * 3  # dense syncs, colocated and served


def test_trls_vllm_generation_is_timed_as_the_steps_generation_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL calls vLLM outside the context HF generation is timed in: without the wrapper its seconds were the
    `train` phase's."""
    from trl.generation.vllm_generation import VLLMGeneration

    from rlhf_cli.phases import StepPhase
    from rlhf_cli.rank.phases import PeakMeter, StepPhases

    now = [0.0]

    def generate(self, prompts, images, num_generations):
        now[0] += 2.0
        return prompts, num_generations

    monkeypatch.setattr(VLLMGeneration, "generate", generate)
    phases = StepPhases(PeakMeter("rss", lambda: {}, lambda: True), clock=lambda: now[0])
    monkeypatch.setattr(StepPhases, "active", phases)
    vllm_compat.replace_trl_vllm_generate(lambda: StepPhases.current().during(StepPhase.GENERATION))
    phases.begin(StepPhase.TRAIN)
    assert VLLMGeneration.generate(object(), [[1]], None, 2) == ([[1]], 2)
    now[0] += 1.0
    assert phases.snapshot()[StepPhase.GENERATION] == 2.0 and phases.snapshot()[StepPhase.TRAIN] == 1.0
    assert VLLMGeneration.generate.__wrapped__ is generate


def test_online_dpos_vllm_generation_is_timed_as_the_steps_generation_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """Online DPO's training step calls vLLM outside the generation context, as RLOO's and GRPO's do; the sync it
    runs first (inside `_generate_vllm`) stays the `sync` phase's, the innermost open one."""
    from trl.experimental.online_dpo import OnlineDPOTrainer

    from rlhf_cli.phases import StepPhase
    from rlhf_cli.rank.phases import PeakMeter, StepPhases

    now = [0.0]
    phases = StepPhases(PeakMeter("rss", lambda: {}, lambda: True), clock=lambda: now[0])

    def generate_vllm(self, prompts, images=None):
        with phases.during(StepPhase.SYNC):
            now[0] += 0.5
        now[0] += 2.0
        return prompts

    monkeypatch.setattr(OnlineDPOTrainer, "_generate_vllm", generate_vllm)
    monkeypatch.setattr(StepPhases, "active", phases)
    vllm_compat.replace_trl_online_dpo_generate(lambda: StepPhases.current().during(StepPhase.GENERATION))
    phases.begin(StepPhase.TRAIN)
    assert OnlineDPOTrainer._generate_vllm(object(), ["a prompt"]) == ["a prompt"]
    now[0] += 1.0
    assert phases.snapshot() == {StepPhase.GENERATION: 2.0, StepPhase.SYNC: 0.5, StepPhase.SAVING: 0.0,
                                 StepPhase.TRAIN: 1.0}
    assert OnlineDPOTrainer._generate_vllm.__wrapped__ is generate_vllm


def test_online_dpo_builds_its_server_mode_without_an_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's OnlineDPOTrainer asks the current accelerator in server mode (for the communicator rlhf skips): while
    it is built for a server, a process without one is told the CPU; colocated, and afterwards, the answer is
    torch's own."""
    import inspect
    from types import SimpleNamespace

    import torch
    from trl.experimental.online_dpo import OnlineDPOTrainer

    trls = getattr(OnlineDPOTrainer.__init__, "__wrapped__", OnlineDPOTrainer.__init__)
    assert "torch.accelerator.current_accelerator().type" in inspect.getsource(trls)  # the shim's reason is still
    own = torch.accelerator.current_accelerator()
    told = []

    def init(self: object, model: object, ref_model: object = None, reward_funcs: object = None,
             args: object = None) -> None:  # TRL's parameters up to `args`
        told.append(torch.accelerator.current_accelerator())

    monkeypatch.setattr(OnlineDPOTrainer, "__init__", init)
    vllm_compat.replace_trl_online_dpo_server_device()
    assert OnlineDPOTrainer.__init__.__wrapped__ is init
    server, colocated = (SimpleNamespace(use_vllm=True, vllm_mode=mode) for mode in ("server", "colocate"))
    OnlineDPOTrainer("policy", None, None, server)
    OnlineDPOTrainer(model="policy", args=colocated)
    OnlineDPOTrainer(model="policy", args=server)
    assert told == [own or torch.device("cpu"), own, own or torch.device("cpu")]
    assert torch.accelerator.current_accelerator() == own


def test_a_server_holding_other_weights_is_refused_before_the_first_generation() -> None:
    """The server's workers say which weights they hold (the version the last reload carried): a run generates only
    once the server holds the weights this run last sent."""
    from rlhf_cli.rank.engines.vllm.server import ServerTarget
    from rlhf_cli.rank.engines.vllm.worker_extension import ReloadWithTiedLayers

    worker = ReloadWithTiedLayers()
    worker.model_runner = type("Runner", (), {"reload_weights": lambda self, **kwargs: None,
                                              "get_model": lambda self: torch_module()})()

    class Session:
        def post(self, url: str, json: dict) -> object:
            method = getattr(worker, json["method"]) if json else None
            result = method(**json.get("kwargs", {})) if method else None
            body = b"" if json is None or json["method"] != "rlhf_weight_version" else b"x"
            return type("Response", (), {"status_code": 200, "text": "", "content": body,
                                         "json": lambda self: {"results": [result]}})()

    client = type("Client", (), {"base_url": "http://server", "session": Session()})()
    accelerator = type("Accelerator", (), {"wait_for_everyone": lambda self: None})()
    earlier, run = (ServerTarget(client, accelerator, Path("weights")) for _ in range(2))
    earlier.reset()  # an earlier run's sync: the server holds its weights
    with pytest.raises(RuntimeError, match=r"holds weights this run did not send \(version .*:1, this run's none"):
        run.check_version()
    run.reset()
    run.check_version()  # this run's weights: it may generate
    earlier.checked = False
    with pytest.raises(RuntimeError, match="holds weights this run did not send"):
        earlier.check_version()


def torch_module() -> object:
    import torch

    return torch.nn.Linear(1, 1)


def test_a_moved_internal_is_reported_with_the_tested_versions() -> None:
    with pytest.raises(compat.InternalsChanged, match="gone.*tested with torch"):
        compat.locate("transformers:Trainer._no_such_method")
    renamed = compat.Internal("transformers:Trainer._save_checkpoint", "why", "until", ("model", "no_such_argument"))
    with pytest.raises(compat.InternalsChanged, match="no longer takes no_such_argument"):
        compat.check(renamed)


def test_every_function_here_uses_a_listed_internal() -> None:
    """A new shim must be listed, so that the test above checks it."""
    import inspect
    import re

    listed = " ".join(internal.path.replace(":", ".") for internal in
                      (*compat.INTERNALS, *vllm_compat.VLLM_INTERNALS, *vllm_compat.TRL_VLLM_INTERNALS))
    source = inspect.getsource(compat).split("# -- TRL's generation context")[1] + \
        inspect.getsource(vllm_compat).split("TRL_VLLM_INTERNALS = (")[1]
    for private in set(re.findall(r"\.(_[a-z]\w+)\b", source)):
        assert private in listed, f"{private} is used in rlhf_cli/compat/ but not listed in its INTERNALS"


def test_the_no_gather_fix_wraps_trls_generation_context() -> None:
    from rlhf_cli.generation.budget import Budget
    from rlhf_cli.rank.zero3 import install_generation_context

    original = compat.trl_generation_context()
    try:
        install_generation_context(required=True)
        wrapped = compat.trl_generation_context()
        assert wrapped is not original and wrapped.rlhf_no_gather_fix and wrapped.__wrapped__ is original
        install_generation_context(required=True, budget=Budget(fraction=0.5))  # twice: still wrapped once
        assert compat.trl_generation_context().__wrapped__ is original
    finally:
        compat.replace_trl_generation_context(original)


@needs_vllm
def test_a_run_without_vllm_never_imports_it() -> None:
    """TRL imports vLLM wherever it is installed (about 9 s of CPU per rank); a rank or pre-launch check of a run
    that does not use it imports every trainer, ours included, without it."""
    import subprocess
    import sys

    script = ("import sys; from rlhf_cli.rank.inputs import RankInputs; RankInputs.from_values('grpo', {})"
              ".hide_unused_engines(); from trl import GRPOTrainer, RLOOTrainer, GRPOConfig; "
              "from trl.experimental.online_dpo import OnlineDPOTrainer; import rlhf_cli.rank.ppo.trainer; "
              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
