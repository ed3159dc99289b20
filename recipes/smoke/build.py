"""Build the smoke recipes' models: a tokenizer trained on corpus.txt and random-weight tiny Llamas.

The outputs are committed, so nothing is downloaded or built when a smoke recipe runs; this
script says how they were made and rebuilds them (deterministically) when they must change:

    python recipes/smoke/build.py
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 1234
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tokenizer(corpus: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=512, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus.read_text().splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:], padding_side="left", model_max_length=256)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama_config(tokenizer, **overrides):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, **overrides)


def main(out: Path = HERE) -> None:
    import torch
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    tokenizer = build_tokenizer(HERE / "corpus.txt")
    torch.manual_seed(SEED)
    policy = LlamaForCausalLM(llama_config(tokenizer))
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(SEED + 1)
    reward = LlamaForSequenceClassification(llama_config(tokenizer, num_labels=1))
    for name, model in (("policy", policy), ("reward", reward)):
        model.save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)
        print(f"{out / name}: {sum(p.numel() for p in model.parameters()):,} parameters")


# -- The agent stand-in (recipes/grpo/agent-smoke.yaml) ---------------------------------------------------------
# A tiny Llama with TRL's copy of Qwen 2.5's chat template (tool calls as <tool_call> JSON, a response parser TRL
# knows), taught by a few hundred supervised steps to call calculator.py's `calculate` and then say its result.
AGENT_SPECIAL_TOKENS = ["<pad>", "<|im_start|>", "<|im_end|>"]
AGENT_TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
AGENT_STEPS = 200
AGENT_BATCH = 8
AGENT_PROMPTS = 32


def _calculator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("smoke_calculator", HERE / "calculator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sums(rng, count: int) -> list[str]:
    return [f"{rng.randint(0, 20)} {rng.choice('+-*')} {rng.randint(1, 20)}" for _ in range(count)]


def _conversation(expression: str, calculate) -> list[dict]:
    """Ask, call the tool, read its result, answer with it: the turns the stand-in is taught."""
    result = calculate(expression)
    call = {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}
    return [{"role": "user", "content": f"What is {expression}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculate", "content": result},
            {"role": "assistant", "content": result}]


def build_agent_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=512, min_frequency=2, special_tokens=AGENT_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<pad>",
                                   additional_special_tokens=AGENT_TOOL_TOKENS, padding_side="left",
                                   model_max_length=512)
    fast.chat_template = qwen2_5_chat_template
    return fast


def _rendering_tokenizer():
    """Any tokenizer with the chat template: rendering conversations to train the real one on needs no vocabulary."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template

    renderer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    renderer.chat_template = qwen2_5_chat_template
    return renderer


def agent_tokenizer():
    """The agent stand-in's tokenizer, trained on conversations rendered with the tool's schema."""
    import random

    calculate = _calculator().calculate
    renderer = _rendering_tokenizer()
    texts = [renderer.apply_chat_template(_conversation(expression, calculate), tools=[calculate], tokenize=False)
             for expression in _sums(random.Random(SEED), 16)]
    return build_agent_tokenizer(texts)


def _shared_prefix(rows: list[list[int]]) -> int:
    """Tokens every row starts with: the system turn with the tool's schema, the same in every conversation."""
    first = rows[0]
    return next((i for i in range(len(first)) if any(len(row) <= i or row[i] != first[i] for row in rows)), len(first))


def _teach(model, tokenizer, calculate) -> float:
    """Supervised steps on whole conversations, the loss on what follows the shared system turn."""
    import random

    import torch

    rng = random.Random(SEED + 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss = torch.tensor(0.0)
    for _ in range(AGENT_STEPS):
        rows = [tokenizer.apply_chat_template(_conversation(expression, calculate), tools=[calculate],
                                              return_dict=False) for expression in _sums(rng, AGENT_BATCH)]
        width = max(map(len, rows))
        ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
        labels = ids.masked_fill(ids == tokenizer.pad_token_id, -100)
        labels[:, :_shared_prefix(rows)] = -100
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return loss.item()


def build_agent(out: Path = HERE) -> None:
    """recipes/smoke/agent (the taught stand-in) and agent-prompts.jsonl (questions with their answers)."""
    import json
    import random

    import torch
    from transformers import LlamaForCausalLM

    calculate = _calculator().calculate
    tokenizer = agent_tokenizer()
    torch.set_num_threads(1)  # the same sums in the same order: the same weights on every machine
    torch.manual_seed(SEED + 3)
    config = llama_config(tokenizer)
    config.max_position_embeddings = tokenizer.model_max_length  # the tool schema makes long prompts
    policy = LlamaForCausalLM(config)
    loss = _teach(policy, tokenizer, calculate)
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    policy.save_pretrained(out / "agent")
    tokenizer.save_pretrained(out / "agent")
    rows = [{"prompt": [{"role": "user", "content": f"What is {expression}?"}], "answer": calculate(expression)}
            for expression in _sums(random.Random(SEED + 4), AGENT_PROMPTS)]
    (out / "agent-prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{out / 'agent'}: {sum(p.numel() for p in policy.parameters()):,} parameters, final loss {loss:.3f}")


if __name__ == "__main__":
    main()
    build_agent()
