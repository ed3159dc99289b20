"""Loading real checkpoints as RLHF needs them: a pad token that is not EOS, and causal LMs as reward models.

Many families ship no pad token (GPT-NeoX/pythia, GPT-2, Llama 3, Mistral), and users often save
`pad_token = eos_token`. PPO finds where a response ends by its first pad token, so pad must be a
token of its own. And the seed's reward model, pythia-70m, is a plain causal LM: it is loaded as a
sequence classifier whose score head starts untrained, as TRL's PPO example did.
"""

from __future__ import annotations

from typing import Any

PAD_TOKEN = "<|pad|>"


def say(message: str) -> None:
    """One line on stderr, from global rank 0 only."""
    from rlhf_cli.rank import terminal
    from rlhf_cli.rank.watch import global_rank

    if global_rank() == 0:
        print(f"rlhf: {message}", file=terminal.stderr(), flush=True)


def add_pad_token(tokenizer: Any) -> bool:
    """Give `tokenizer` a pad token of its own when it has none or pads with EOS; True when one was added."""
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        return False
    tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return True


def fit_embeddings(model: Any, tokenizer: Any, seed: int) -> None:
    """Make room for every token of `tokenizer` in `model`: resize only when the embedding has no spare row
    (pythia's has 27, GPT-2's and Llama 3's none). New rows are drawn around the others' mean (transformers'
    mean resizing) after reseeding, so that a policy and its reference get the same ones."""
    from transformers import set_seed

    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        set_seed(seed)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id


def note_untrained_head(path: str, role: str, revision: str | None = None, trust_remote_code: bool = False) -> None:
    """Say so when the checkpoint at `path` (local or on the hub) is not a sequence classifier: loaded as one,
    its score head starts from random weights."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    architectures = config.architectures or [config.model_type]
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        say(f"the {role} {path} is a {architectures[0]}: loaded as a sequence classifier whose score head "
            "starts untrained")
