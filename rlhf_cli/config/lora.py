"""LoRA settings checked before launch (the ranges of lora_r, lora_alpha and lora_dropout are in
rlhf_cli/schema/ranges.yaml): the task type, DoRA under ZeRO-3, and target modules that exist in the model.

PEFT raises only when no module at all matches, after every rank has loaded the model; a misspelt name among
others is dropped silently. Here each name, or the pattern, is checked against the model's config.json.
"""

from __future__ import annotations

import difflib
import re

from rlhf_cli.algorithms.spec import Algorithm, Values
from rlhf_cli.config.engines import tied_head_problems
from rlhf_cli.generation.choice import Gather, Generation
from rlhf_cli.models.architectures import (
    ALL_LINEAR,
    Architecture,
    architecture,
    peft_has_default,
    peft_targets,
    targeted,
)
from rlhf_cli.models.hub import ModelConfigUnavailable, read_config


def adapted_models(values: Values, entry: Algorithm) -> list[tuple[str, str, bool]]:
    """(role, name or path, loaded as a sequence classifier) of each model that gets adapters: the policy, and
    PPO's value model (rlhf_cli/rank/lora.py)."""
    policy = values("model_name_or_path")
    models = [("policy", policy, False)]
    if entry.trains_value_model:
        value = values("value_model_name_or_path") or values("reward_model_name_or_path") or policy
        models.append(("value model", value, True))
    return models


def lora_problems(values: Values, entry: Algorithm, zero3: bool) -> list[str]:
    """Every problem of a LoRA run's settings, one line each; nothing without `use_peft`."""
    if not values("use_peft"):
        return []
    problems = []
    if values("use_dora") and zero3 and Generation.from_values(values).gather != Gather.whole:
        # Checked on 2 CPU ranks (PEFT 0.21.2, DeepSpeed 0.19.8, TRL 1.16, stock or with rlhf's no-gather fix):
        # DoRA's get_lora_weight reads lora_A.weight outside lora_A's forward, where ZeRO-3 has not gathered it.
        problems.append("`use_dora`: generating from ZeRO-3 shards, PEFT's DoRA crashes at the first training step "
                        "(it reads weights ZeRO-3 has not gathered); pass --gather, or set use_dora: false")
    if values("lora_task_type") != "CAUSAL_LM":
        problems.append(f"`lora_task_type`: the policy is a causal LM, so CAUSAL_LM, got {values('lora_task_type')} "
                        "(PPO's value model gets SEQ_CLS by itself)")
    given = values("lora_target_modules")
    if isinstance(given, list) and (wrong := next((item for item in given if not isinstance(item, str)), None)) \
            is not None:
        return [*problems, f"`lora_target_modules`: {wrong!r} is not a module name; give names like [q_proj, v_proj], "
                           f"a pattern, or {ALL_LINEAR}"]
    targets = peft_targets(given)
    if isinstance(targets, str) and targets.lower() != ALL_LINEAR:
        try:
            re.compile(targets)
        except re.error as error:
            return [*problems, f"`lora_target_modules`: {targets!r} is not a regular expression ({error}); a single "
                               "entry that is not a plain module name is one, matched against whole module paths"]
    configs = [(role, path, classifier, config) for role, path, classifier in adapted_models(values, entry)
               if (config := _config(path, values("model_revision"), values("env"))) is not None]
    if targets is None:
        return problems + _default_target_problems(configs) + tied_head_problems(values, targets)
    models = [(role, path, arch) for role, path, classifier, config in configs
              if (arch := architecture(config, sequence_classifier=classifier)) is not None]
    return problems + _target_problems(models, targets, entry) + tied_head_problems(values, targets)


def _config(path: object, revision: str | None, env: dict[str, str] | None) -> dict | None:
    """The config.json of a model that is here; None for a hub model not downloaded yet (PEFT checks it when it
    loads)."""
    if not isinstance(path, str):
        return None
    try:
        return read_config(path, revision, env)  # the ranks' HF_HUB_CACHE / HF_HOME
    except ModelConfigUnavailable:
        return None


def _default_target_problems(configs: list[tuple[str, str, bool, dict]]) -> list[str]:
    """An adapted model PEFT has no default targets for (any architecture: PEFT stops every rank after loading)."""
    return [f"`lora_target_modules`: PEFT has no default for {config.get('model_type')} ({role} {path}); name the "
            f"modules to adapt (--set 'lora_target_modules=[NAME, ...]', names of its linear modules), or {ALL_LINEAR}"
            for role, path, _, config in configs if not peft_has_default(config.get("model_type", ""))]


def _target_problems(models: list[tuple[str, str, Architecture]], targets: str | list[str] | None,
                     entry: Algorithm) -> list[str]:
    """A name (or the pattern) that selects a module of no adapted model; an adapted model in which nothing is
    selected (PEFT stops there). A name one model lacks is fine: PEFT skips it (`lm_head` in PPO's value model)."""
    if not models:
        return []
    role, path, policy = models[0]
    problems = []
    for target in [targets] if isinstance(targets, str) else targets:
        selection = target if isinstance(targets, str) else [target]
        if not any(targeted(arch, selection) for _, _, arch in models):
            close = difflib.get_close_matches(target, policy.names(), n=1, cutoff=0.6)
            hint = f"did you mean `{close[0]}`? " if close else ""
            what = "matches no module" if isinstance(targets, str) else "is no module"
            problems.append(f"`lora_target_modules`: `{target}` {what} of the {role}'s {policy.model_type} ({path}); "
                            f"{hint}LoRA can adapt: {', '.join(policy.names())}, or {ALL_LINEAR}")
    if problems:
        return problems
    problems = [f"`lora_target_modules` selects no module of the {role}'s {arch.model_type} ({path}), and PEFT "
                f"needs one; add one of: {', '.join(arch.names())}"
                for role, path, arch in models if not targeted(arch, targets)]
    if entry.logits is not None and entry.logits.fused_head and role == "policy" \
            and any(module.path == policy.output_layer for module, _ in targeted(policy, targets)):
        problems.append(f"`lora_target_modules`: {entry.command} scores tokens with `{policy.output_layer}.weight` "
                        f"directly (TRL's fused LM head), so an adapter on `{policy.output_layer}` would never train; "
                        "remove it")
    return problems
