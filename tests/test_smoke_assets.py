"""The shipped smoke models are what recipes/smoke/build.py makes from the bundled text."""

from __future__ import annotations

import importlib.util
import json

from helpers import RECIPES


def load_builder():
    spec = importlib.util.spec_from_file_location("smoke_build", RECIPES / "smoke" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokenizer_is_trained_on_the_bundled_corpus() -> None:
    tokenizer = load_builder().build_tokenizer(RECIPES / "smoke" / "corpus.txt")
    shipped = json.loads((RECIPES / "smoke" / "policy" / "tokenizer.json").read_text())
    assert json.loads(tokenizer.backend_tokenizer.to_str())["model"]["vocab"] == shipped["model"]["vocab"]


def test_models_load_offline_and_fit_their_tokenizer() -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(RECIPES / "smoke" / "policy")
    policy = AutoModelForCausalLM.from_pretrained(RECIPES / "smoke" / "policy")
    reward = AutoModelForSequenceClassification.from_pretrained(RECIPES / "smoke" / "reward")
    assert policy.config.vocab_size == len(tokenizer) and reward.config.num_labels == 1
    assert tokenizer.pad_token and tokenizer.eos_token and tokenizer.chat_template
    ids = tokenizer("Describe the big tree.", return_tensors="pt").input_ids
    assert policy(ids).logits.shape[-1] == len(tokenizer)


def test_the_agent_stand_in_is_rebuilt_from_its_sums_and_calls_its_tool() -> None:
    """The agent's tokenizer comes from the conversations build.py renders; the shipped stand-in, asked a sum it
    was never shown, answers with a call to `calculate` that TRL's parser reads (so GRPO's tool loop runs)."""
    builder = load_builder()
    shipped = json.loads((RECIPES / "smoke" / "agent" / "tokenizer.json").read_text())
    rebuilt = json.loads(builder.agent_tokenizer().backend_tokenizer.to_str())
    assert rebuilt["model"]["vocab"] == shipped["model"]["vocab"]
    assert_calls_its_tool(RECIPES / "smoke" / "agent", builder._calculator().calculate)


def assert_calls_its_tool(directory, calculate) -> None:
    """Asked a sum it was never shown, the stand-in in `directory` answers with a well-formed `calculate` call."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import add_response_schema, parse_response

    tokenizer = add_response_schema(AutoTokenizer.from_pretrained(directory))
    policy = AutoModelForCausalLM.from_pretrained(directory)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 17 * 3?"}], tools=[calculate],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    generated = policy.generate(**prompt, max_new_tokens=40, do_sample=False)[0, prompt["input_ids"].shape[1]:]
    parsed = parse_response(tokenizer, generated.tolist(), prefix=prompt["input_ids"][0].tolist(), tools=[calculate])
    (call,) = parsed["tool_calls"]
    assert call["function"]["name"] == "calculate"
    calculate(**call["function"]["arguments"])  # well formed: two whole numbers and an operator


def test_the_shipped_agent_stand_in_is_what_build_py_makes(tmp_path) -> None:
    """Config, tokenizer and prompts of recipes/smoke/agent as build.py makes them now (its 200 taught steps: about
    a minute on one core), and a stand-in that calls its tool as the shipped one does; head_dim 32, which vLLM's CPU
    attention needs, comes with them. The weights themselves are compared by shape: their last digits depend on the
    CPU's kernels (one thread, one order of sums, yet 1e-2 apart between two machines after 200 steps)."""
    from safetensors.torch import load_file

    builder = load_builder()
    builder.build_agent(tmp_path)
    shipped, built = RECIPES / "smoke" / "agent", tmp_path / "agent"
    assert json.loads((built / "config.json").read_text()) == json.loads((shipped / "config.json").read_text())
    assert json.loads((shipped / "config.json").read_text())["head_dim"] % 32 == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (built / name).read_text() == (shipped / name).read_text(), name
    assert (tmp_path / "agent-prompts.jsonl").read_text() == (RECIPES / "smoke" / "agent-prompts.jsonl").read_text()
    weights, rebuilt = load_file(shipped / "model.safetensors"), load_file(built / "model.safetensors")
    assert {name: tensor.shape for name, tensor in weights.items()} == \
        {name: tensor.shape for name, tensor in rebuilt.items()}
    assert_calls_its_tool(built, builder._calculator().calculate)
