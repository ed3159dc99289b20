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
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=False,
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


if __name__ == "__main__":
    main()
