"""RLHF PPO on transformers' Trainer machinery (optimizer, scheduler, DeepSpeed, checkpoints, logging).

TRL deleted its PPOTrainer in 1.13; this is the same algorithm, written against today's
transformers, accelerate, DeepSpeed and TRL helpers, with ZeRO-3 gather/no-gather generation,
reward functions, and checkpoints that resume.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase, Trainer, TrainerState, set_seed
from trl.models import prepare_deepspeed

from rlhf_cli import compat
from rlhf_cli.generation.choice import Generation
from rlhf_cli.output.run_dir import TRAINER_STATE
from rlhf_cli.rank.engines.importance_sampling import sampling_weights_seen
from rlhf_cli.rank.ppo import core, saving
from rlhf_cli.rank.ppo.config import PPOConfig
from rlhf_cli.rank.ppo.modules import PolicyAndValue, disable_dropout, model_inputs, sequence_scores
from rlhf_cli.rank.ppo.rollouts import rollouts_for

RANK_SEED_STRIDE = 100003  # rank r samples with seed + r x this prime, as TRL's PPOTrainer did
GENERATE = Generation()  # `generate` inside the trainer, gathering the whole policy: TRL's default


class PPOTrainer(Trainer):
    def __init__(self, args: PPOConfig, processing_class: PreTrainedTokenizerBase, policy: nn.Module,
                 ref_policy: nn.Module | None, value_model: nn.Module, reward_model: nn.Module | None,
                 reward_funcs: list[Callable], train_dataset: Any, generation: Generation = GENERATE,
                 sync_check_steps: int = 0, sync_delta: bool = True) -> None:
        if args.stop_token is not None and args.stop_token_id is not None:
            raise ValueError(f"`stop_token` ({args.stop_token}) and `stop_token_id` ({args.stop_token_id}) are both "
                             "set; keep one")
        for model in (policy, ref_policy, value_model, reward_model):
            if model is not None:
                disable_dropout(model)
        self.policy_and_value = PolicyAndValue(policy, value_model)
        super().__init__(model=self.policy_and_value, args=args, train_dataset=train_dataset,
                         processing_class=processing_class)
        # As TRL 1.12: rollouts per process = per_device_train_batch_size x gradient_accumulation_steps, split
        # into num_mini_batches; each mini-batch is one optimizer step over micro-batches of at most
        # per_device_train_batch_size (a mini-batch smaller than that is one micro-batch of its own size).
        self.local_batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps
        if self.local_batch_size % args.num_mini_batches:
            raise ValueError(f"num_mini_batches ({args.num_mini_batches}) must divide the rollouts per process "
                             f"(per_device_train_batch_size x gradient_accumulation_steps = {self.local_batch_size})")
        self.batch_size = self.local_batch_size * self.accelerator.num_processes
        self.local_mini_batch_size = self.local_batch_size // args.num_mini_batches
        self.micro_batch_size = min(args.per_device_train_batch_size, self.local_mini_batch_size)
        self.micro_batches_per_step = math.ceil(self.local_mini_batch_size / self.micro_batch_size)
        # transformers leaves accumulation to its own loop (1 here); ours uses `accelerator.accumulate`. Without
        # sync_with_dataloader off, accelerate steps at every micro-batch while the loader is at its last batch.
        self.accelerator.gradient_accumulation_steps = self.micro_batches_per_step
        compat.stop_sync_with_dataloader(self.accelerator)
        if self.is_deepspeed_enabled:  # DeepSpeed divides each micro-batch's loss by its own accumulation count
            self.accelerator.state.deepspeed_plugin.deepspeed_config.update(
                gradient_accumulation_steps=self.micro_batches_per_step,
                train_micro_batch_size_per_gpu=self.micro_batch_size,
                train_batch_size=self.micro_batch_size * self.micro_batches_per_step * self.accelerator.num_processes)
        # The run's length: max_steps updates when set (`--max-steps`, as for every algorithm; it wins over the
        # episodes as transformers' max_steps wins over epochs), else TRL's former total_episodes, else
        # num_train_epochs passes over the prompts.
        total = args.total_episodes or int(args.num_train_epochs * len(train_dataset))
        self.num_updates = args.max_steps if args.max_steps > 0 else max(1, math.ceil(total / self.batch_size))
        self.stop_token_id = processing_class.eos_token_id if args.stop_token == "eos" else args.stop_token_id
        self.reward_funcs = reward_funcs
        self.ref_policy = None  # under LoRA: the policy with its adapters disabled (`_reference_logits`)
        if ref_policy is not None:
            self.ref_policy = prepare_deepspeed(ref_policy, self.accelerator) if self.is_deepspeed_enabled \
                else ref_policy.to(self.accelerator.device)
        self.reward_model = None
        if reward_model is not None:
            self.reward_model = prepare_deepspeed(reward_model, self.accelerator) if self.is_deepspeed_enabled \
                else reward_model.to(self.accelerator.device)
        for frozen in (self.ref_policy, self.reward_model):
            if frozen is not None:
                frozen.eval()
        # what samples the responses (the policy's `generate`, or an engine whose weights follow every update)
        self.rollouts = rollouts_for(self, generation, sync_check_steps, sync_delta)

    # -- data ---------------------------------------------------------------------------------
    def _prompt_loader(self) -> DataLoader:
        tokenizer = self.processing_class

        def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
            return tokenizer.pad([{"input_ids": row["input_ids"]} for row in rows], return_tensors="pt")

        generator = torch.Generator().manual_seed(self.args.seed)
        loader = DataLoader(self.train_dataset, batch_size=self.local_batch_size, shuffle=True, drop_last=True,
                            collate_fn=collate, generator=generator)
        return self.accelerator.prepare(loader)

    def _batches(self, loader: DataLoader, skip: int):
        """Endless prompt batches, starting after the `skip` already trained on."""
        seen = 0
        while True:
            for batch in loader:
                if seen >= skip:
                    yield batch
                seen += 1

    # -- rollouts -------------------------------------------------------------------------------
    @torch.no_grad()
    def _rollout(self, queries: torch.Tensor) -> dict[str, torch.Tensor]:
        args, tokenizer = self.args, self.processing_class
        pad_id = tokenizer.pad_token_id
        context_length = queries.size(1)
        chunk = args.local_rollout_forward_batch_size
        responses, sampling_logprobs = self.rollouts.generate(queries)
        query_responses = torch.cat([queries, responses], 1)

        logprobs, ref_logprobs, values, scores = [], [], [], []
        postprocessed = responses if self.stop_token_id is None else \
            core.truncate_after_stop(responses, self.stop_token_id, pad_id)
        for start in range(0, queries.size(0), chunk):
            part = slice(start, start + chunk)
            output, value = self.model_wrapped(**model_inputs(query_responses[part], pad_id))
            logits = output.logits[:, context_length - 1:-1] / (args.temperature + 1e-7)
            logprobs.append(torch.gather(logits.log_softmax(-1), 2, responses[part].unsqueeze(-1)).squeeze(-1))
            values.append(value[:, context_length - 1:-1].squeeze(-1))
            ref_logits = self._reference_logits(model_inputs(query_responses[part], pad_id))
            ref_logits = ref_logits[:, context_length - 1:-1] / (args.temperature + 1e-7)
            ref_logprobs.append(torch.gather(ref_logits.log_softmax(-1), 2,
                                             responses[part].unsqueeze(-1)).squeeze(-1))
            scored = torch.cat([queries[part], postprocessed[part]], 1)
            scores.append(self._score(scored, postprocessed[part], context_length))
        return {"queries": queries, "responses": responses, "query_responses": query_responses,
                "postprocessed": postprocessed, "logprobs": torch.cat(logprobs),
                "ref_logprobs": torch.cat(ref_logprobs),
                "values": torch.cat(values), "scores": torch.cat(scores), "context_length": context_length,
                "sampling_logprobs": sampling_logprobs}

    def _reference_logits(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The reference policy's logits: the frozen copy's, or under LoRA the policy's with its adapters off."""
        if self.ref_policy is not None:
            return self.ref_policy(**inputs).logits
        with self.policy_and_value.policy.disable_adapter():
            return self.policy_and_value.policy(**inputs).logits

    def _score(self, query_responses: torch.Tensor, responses: torch.Tensor, context_length: int) -> torch.Tensor:
        """Reward model score plus every reward function's, per response."""
        tokenizer = self.processing_class
        score = torch.zeros(responses.size(0), device=responses.device)
        if self.reward_model is not None:
            score = score + sequence_scores(self.reward_model, query_responses, tokenizer.pad_token_id,
                                            context_length).float()
        if self.reward_funcs:
            prompts = tokenizer.batch_decode(query_responses[:, :context_length], skip_special_tokens=True)
            completions = tokenizer.batch_decode(responses, skip_special_tokens=True)
            # Each completion's own tokens, as TRL's trainers pass them: up to its first pad
            lengths = core.first_true_indices(responses == tokenizer.pad_token_id).tolist()
            completion_ids = [row[:length] for row, length in zip(responses.tolist(), lengths, strict=True)]
            for func in self.reward_funcs:
                values = list(func(prompts=prompts, completions=completions, completion_ids=completion_ids))
                if None in values:  # as NaN it would spread through whitening and the all-reduce to every rank
                    sample = values.index(None)
                    name = getattr(func, "__name__", type(func).__name__)
                    raise ValueError(f"reward function `{name}` returned None for sample {sample} of {len(values)} "
                                     f"(prompt {prompts[sample][-60:]!r}, completion {completions[sample][:60]!r}); "
                                     "PPO needs a number for every sample")
                score = score + torch.tensor(values, device=responses.device, dtype=score.dtype)
        return score

    # -- training -------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | None = None, **_: Any) -> None:
        args = self.args
        loader = self._prompt_loader()
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_world_process_zero(),
            stateful_callbacks=[cb for cb in [*self.callback_handler.callbacks, self.control]
                                if isinstance(cb, compat.exportable_state_class())])
        if args.activation_checkpointing:  # transformers turns it on only in its own train loop, replaced here
            self.policy_and_value.gradient_checkpointing_enable(args.activation_checkpointing_kwargs)
        if resume_from_checkpoint and not self.is_deepspeed_enabled:  # DeepSpeed's own checkpoint holds both
            saving.load_trained_state(self.policy_and_value, resume_from_checkpoint)
        model, loader = compat.prepare_for_training(self, self.num_updates, loader, resume_from_checkpoint)
        # Every rank samples its own random numbers (one seed for all made their samples agree on most tokens).
        set_seed(args.seed + self.accelerator.process_index * RANK_SEED_STRIDE)
        if resume_from_checkpoint:
            self.state = TrainerState.load_from_json(f"{resume_from_checkpoint}/{TRAINER_STATE}")
            compat.load_rng_state(self, resume_from_checkpoint)
        self.state.max_steps = self.num_updates
        # A fraction below 1 is a share of the run, as in TrainingArguments and TRL 1.12
        self.state.logging_steps, self.state.save_steps = (math.ceil(self.num_updates * steps) if steps < 1 else steps
                                                           for steps in (args.logging_steps, args.save_steps))
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        batches = self._batches(loader, skip=self.state.global_step)
        self.rollouts.start(resumed=self.state.global_step > 0)
        started = time.time()
        while self.state.global_step < self.num_updates:
            queries = next(batches)["input_ids"]
            rollout = self._rollout(queries)
            stats = self._optimise(model, rollout)
            stats["lr"] = self.lr_scheduler.get_last_lr()[0]  # the rate this update used
            stats.update(self.rollouts.sync())
            self.lr_scheduler.step()
            self.state.global_step += 1
            self.state.epoch = self.state.global_step * self.batch_size / len(self.train_dataset)
            self.control = self.callback_handler.on_step_end(args, self.state, self.control)
            if self.control.should_log:
                stats["episode"] = self.state.global_step * self.batch_size
                stats["eps"] = int(stats["episode"] / (time.time() - started))
                self.log(stats)
            if self.control.should_save:
                compat.save_checkpoint(self, model)
                self.control = self.callback_handler.on_save(args, self.state, self.control)
            if self.control.should_training_stop:
                break
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)

    def _optimise(self, model: nn.Module, rollout: dict[str, torch.Tensor]) -> dict[str, float]:
        """One PPO update on a batch of rollouts: advantages, num_ppo_epochs passes of mini-batches, statistics."""
        targets = self._advantages(rollout)
        collected = self._epochs(model, rollout, targets)
        return self._statistics(rollout, targets, collected)

    @torch.no_grad()
    def _advantages(self, rollout: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Scores, masks, KL, per-token rewards, whitened GAE advantages and returns of the rollouts."""
        args, tokenizer = self.args, self.processing_class
        responses, postprocessed = rollout["responses"], rollout["postprocessed"]
        scores = core.penalise_missing_eos(rollout["scores"], postprocessed, tokenizer.eos_token_id,
                                           args.missing_eos_penalty)
        lengths = core.first_true_indices(postprocessed == tokenizer.pad_token_id) - 1
        padding, padding_p1 = core.response_masks(lengths, responses.size(1))
        logprobs = torch.masked_fill(rollout["logprobs"], padding, core.INVALID_LOGPROB)
        ref_logprobs = torch.masked_fill(rollout["ref_logprobs"], padding, core.INVALID_LOGPROB)
        values = torch.masked_fill(rollout["values"], padding_p1, 0)
        kl = core.kl_estimate(logprobs, ref_logprobs, args.kl_estimator)
        rewards, non_score = core.token_rewards(scores, kl, args.kl_coef, lengths)
        if args.whiten_rewards:
            rewards = torch.masked_fill(core.masked_whiten(rewards, ~padding_p1, shift_mean=False), padding_p1, 0)
        advantages, returns = core.gae(rewards, values, args.gamma, args.lam)
        advantages = torch.masked_fill(core.masked_whiten(advantages, ~padding), padding, 0)
        targets = {"scores": scores, "padding": padding, "padding_p1": padding_p1, "logprobs": logprobs, "kl": kl,
                   "non_score": non_score, "values": values, "advantages": advantages, "returns": returns}
        if rollout["sampling_logprobs"] is not None:  # a separate engine sampled: TRL's mismatch, its correction
            correction = args.sampling_correction()
            ratio, targets["sampling_difference"] = correction.ratios(rollout["logprobs"],
                                                                      rollout["sampling_logprobs"], ~padding)
            if correction.weighs:
                targets["importance_sampling_ratio"] = ratio
        return targets

    def _epochs(self, model: nn.Module, rollout: dict[str, torch.Tensor],
                targets: dict[str, torch.Tensor]) -> dict[str, list[torch.Tensor]]:
        """num_ppo_epochs passes over the rollouts in shuffled mini-batches, one optimizer step each; the
        statistics of every micro-batch."""
        args = self.args
        collected: dict[str, list[torch.Tensor]] = defaultdict(list)
        model.train()
        for _ in range(args.num_ppo_epochs):
            order = torch.randperm(self.local_batch_size, device=rollout["responses"].device)
            for mini_start in range(0, self.local_batch_size, self.local_mini_batch_size):
                mini = order[mini_start:mini_start + self.local_mini_batch_size]
                for micro_start in range(0, self.local_mini_batch_size, self.micro_batch_size):
                    micro = mini[micro_start:micro_start + self.micro_batch_size]
                    with self.accelerator.accumulate(model):
                        for name, value in self._micro_batch(model, rollout, targets, micro).items():
                            collected[name].append(value)
        return collected

    def _micro_batch(self, model: nn.Module, rollout: dict[str, torch.Tensor], targets: dict[str, torch.Tensor],
                     micro: torch.Tensor) -> dict[str, torch.Tensor]:
        """Forward, clipped losses and backward on one micro-batch (the optimizer steps when accelerate syncs)."""
        args, context_length = self.args, rollout["context_length"]
        padding, padding_p1 = targets["padding"][micro], targets["padding_p1"][micro]
        old_logprobs = targets["logprobs"][micro]
        output, predicted = model(**model_inputs(rollout["query_responses"][micro], self.processing_class.pad_token_id))
        logits = output.logits[:, context_length - 1:-1] / (args.temperature + 1e-7)
        all_logprobs = logits.log_softmax(-1)
        new_logprobs = torch.gather(all_logprobs, 2, rollout["responses"][micro].unsqueeze(-1)).squeeze(-1)
        new_logprobs = torch.masked_fill(new_logprobs, padding, core.INVALID_LOGPROB)
        predicted = torch.masked_fill(predicted[:, context_length - 1:-1].squeeze(-1), padding_p1, 0)
        vf_loss, vf_clipfrac = core.value_loss(predicted, targets["values"][micro], targets["returns"][micro],
                                               args.cliprange_value, ~padding_p1)
        weights = targets["importance_sampling_ratio"][micro] if "importance_sampling_ratio" in targets else None
        pg_loss, pg_clipfrac, approxkl = core.policy_loss(new_logprobs, old_logprobs, targets["advantages"][micro],
                                                          args.cliprange, ~padding, weights)
        self.accelerator.backward(pg_loss + args.vf_coef * vf_loss)
        if self.accelerator.sync_gradients and args.max_grad_norm:  # DeepSpeed clips in its own step (a no-op here)
            self.accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        with torch.no_grad():
            entropy = -(all_logprobs.exp() * all_logprobs).sum(-1)
            return {"policy/approxkl_avg": approxkl, "policy/clipfrac_avg": pg_clipfrac, "loss/policy_avg": pg_loss,
                    "loss/value_avg": vf_loss, "val/clipfrac_avg": vf_clipfrac,
                    "policy/entropy_avg": core.masked_mean(entropy, ~padding),
                    "val/ratio": core.masked_mean((new_logprobs - old_logprobs).exp(), ~padding)}

    @torch.no_grad()
    def _statistics(self, rollout: dict[str, torch.Tensor], targets: dict[str, torch.Tensor],
                    collected: dict[str, list[torch.Tensor]]) -> dict[str, float]:
        """The update's logged numbers, averaged over every rank."""
        gather = self.accelerator.gather_for_metrics
        real = ~targets["padding"]
        scores, mean_kl = targets["scores"], (targets["kl"] * real).sum(1)
        stats = {
            "objective/kl": gather(mean_kl).mean(),
            "objective/entropy": gather((-targets["logprobs"] * real).sum(1)).mean(),
            "objective/non_score_reward": gather((targets["non_score"] * real).sum(1)).mean(),
            "objective/rlhf_reward": gather(scores - self.args.kl_coef * mean_kl).mean(),
            "objective/scores": gather(scores).mean(),
            "val/num_eos_tokens": (rollout["postprocessed"] == self.processing_class.eos_token_id).sum().float(),
        }
        stats.update({name: gather(torch.stack(values)).mean() for name, values in collected.items()})
        ratios = gather(torch.stack(collected["val/ratio"]))  # one per micro-batch, on every rank
        stats["val/ratio_var"] = ratios.var(correction=1 if ratios.numel() > 1 else 0)
        if "sampling_difference" in targets:
            stats.update(self._sampling_statistics(targets))
        return {name: value.item() for name, value in stats.items()}

    def _sampling_statistics(self, targets: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """TRL's sampling mismatch metrics, as GRPO logs them: |policy - engine| log-prob of the sampled tokens (each
        rank's mean, averaged; the largest), and the importance-sampling weights when they correct the loss."""
        gather, zero = self.accelerator.gather, torch.zeros((), device=targets["padding"].device)
        delta = targets["sampling_difference"]
        stats = {"sampling/sampling_logp_difference/mean": gather(delta.mean() if delta.numel() else zero).mean(),
                 "sampling/sampling_logp_difference/max": gather(delta.max() if delta.numel() else zero).max()}
        if "importance_sampling_ratio" in targets:  # the correction weighs the loss
            ratio = sampling_weights_seen(targets["importance_sampling_ratio"], ~targets["padding"])
            empty = not ratio.numel()
            stats["sampling/importance_sampling_ratio/min"] = gather(zero if empty else ratio.min()).min()
            stats["sampling/importance_sampling_ratio/mean"] = gather(zero if empty else ratio.mean()).mean()
            stats["sampling/importance_sampling_ratio/max"] = gather(zero if empty else ratio.max()).max()
        return stats

    # -- saving ---------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The policy, whole or under LoRA its adapters only, loadable with from_pretrained (rlhf_cli/rank/ppo/
        saving.py); in a checkpoint without DeepSpeed also the trained weights of the policy and value model."""
        output_dir = output_dir or self.args.output_dir
        state = saving.policy_state(self)
        if self.accelerator.is_main_process:
            self.policy_and_value.policy.save_pretrained(output_dir, state_dict=state)
            self.processing_class.save_pretrained(output_dir)
            if _internal_call and not self.is_deepspeed_enabled:
                saving.save_trained_state(self.policy_and_value, output_dir)
