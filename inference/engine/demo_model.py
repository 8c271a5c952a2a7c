"""A small random-weight Llama in Hugging Face format, so a fresh checkout can serve something with no download.

Its weights are random, so it writes random text; what it exercises is everything around the model: a byte-level
BPE tokenizer with chat special tokens, and a chat template with ChatML turns, `<think>` blocks and tool calls.
Everything written is a pure function of the seed: the same seed gives byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import expected_hf_shapes

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Markup the model writes as text (so decoding keeps it), each still a single token.
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
# An upper bound: on this corpus training stops near 1.2k tokens, once every word is a single token.
VOCAB_LIMIT = 2048

ARCHITECTURE = {
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}

# The tokenizer's training text: varied everyday English plus the words chat and tool use need.
CORPUS = """\
Once upon a time, in a small town by the sea, there lived a girl named Mia who loved to build little boats.
Every morning she walked to the harbour with her dog, Pepper, and watched the fishermen bring in their nets.
One day the wind was very strong. The waves were tall and grey, and all the boats stayed at home.
Mia asked her grandfather, "Why can't we go out today?" He smiled and said, "The sea is resting. So should we."
They made tea, read a book about whales, and counted the seagulls on the roof: one, two, three, four, five.
The next day the sun came back. The water was calm and blue, and Mia's new boat floated for the first time.
The weather today is sunny with a light breeze. Tomorrow there is a chance of rain in the afternoon.
The temperature in Paris is 18 degrees Celsius; in New York it is 64 degrees Fahrenheit.
You are a helpful assistant. Answer the question clearly and briefly, and say so when you are not sure.
User: What is the capital of France? Assistant: The capital of France is Paris.
User: Can you help me write an email to my team? Assistant: Of course! What would you like to tell them?
Let me think about this step by step. First, we add the numbers. Then we divide by the count.
The answer is 42. The sum of 12 and 30 is 42, and 7 times 6 is also 42.
I will call a function to get the current weather for the city, then summarise the result for the user.
The function get_weather takes two arguments: location, a string, and unit, either celsius or fahrenheit.
The tool returned a result: {"temperature": 21, "condition": "cloudy", "humidity": 0.65}.
Search the web for recent news, read the first three results, and write a short summary of each one.
The parameters object has a type, a list of required properties, and a description for every property.
def add(a, b):
    return a + b

for item in items:
    print(item.name, item.price)
Numbers and dates: 2024-05-17, 3.14159, 1,000,000, 10:30 am, 50% off, $19.99, #1, page 7 of 12.
She opened the window, took a deep breath, and began to write the story she had been thinking about for years.
The children laughed and played in the garden until the stars came out and their parents called them inside.
Good morning! How are you today? I'm fine, thank you. It's a beautiful day, isn't it? Yes, it really is.
Please remember to bring your notebook, a pencil, and something to eat. We will be back before dinner.
The old library had thousands of books, and the librarian knew where every single one of them was kept.
After the meeting, the engineers wrote down the plan, tested the new design, and shared the results with everyone.
Rivers carry water from the mountains to the ocean, shaping valleys, feeding forests, and giving cities their power.
The orchestra tuned their violins, cellos, flutes, and trumpets while the audience quietly found their seats.
To bake bread, mix flour, yeast, salt, and warm water; knead the dough, let it rise, then bake it until golden.
Scientists measured the distance between the planets and published their findings in a respected journal.
Our quarterly report shows revenue growth, lower shipping costs, and strong demand across every region.
Translate the sentence into Spanish, German, and Japanese, and explain any grammar that might be confusing.
When the train arrived, passengers hurried along the platform carrying suitcases, umbrellas, and sleepy children.
The museum's newest exhibition explores ancient pottery, bronze jewellery, and handwritten maps from faraway kingdoms.
"""

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou can call these functions. Their signatures, one JSON object per line:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call one, reply with its name and arguments as JSON inside <tool_call></tool_call>"
    ' tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <arguments-object>}\\n</tool_call>'
    "<|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    # Reasoning is shown only for assistant turns after the last user turn (an ongoing tool-call exchange).
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}{{- raise_exception('Only the first message can be a system message.') }}{%- endif %}"
    "{%- elif message.role == 'user' or message.role == 'tool' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content and loop.index0 > ns.last_user %}"
    "{{- '<think>\\n' + message.reasoning_content.strip() + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function or call %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' }}"
    "{{- fn.arguments if fn.arguments is string else (fn.arguments | tojson) }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- raise_exception('Unknown role: ' + message.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def build_demo_tokenizer() -> Tokenizer:
    """Byte-level BPE trained on CORPUS; training is deterministic, so the same tokenizer every time."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_LIMIT - len(MARKUP_TOKENS),
        min_frequency=1,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tokenizer


def _random_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """The model's Hugging Face tensors (model/layout.py): normal(0, 0.02) matrices, unit RMSNorm weights."""
    generator = torch.Generator().manual_seed(seed)
    shapes = expected_hf_shapes(config)
    return {n: torch.ones(s) if len(s) == 1 else torch.randn(s, generator=generator) * 0.02 for n, s in shapes.items()}


def _added_token_entry(token: str) -> dict:
    special = token in SPECIAL_TOKENS
    return {
        "content": token,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_demo_model(directory: str | Path, seed: int = 0) -> Path:
    """Writes config.json, generation_config.json, model.safetensors and the tokenizer files into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_demo_tokenizer()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS + MARKUP_TOKENS}
    eos_ids = [ids["<|im_end|>"], ids["<|endoftext|>"]]

    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        **ARCHITECTURE,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": eos_ids,
        "pad_token_id": ids["<|endoftext|>"],
        "torch_dtype": "float32",
    }
    _write_json(directory / "config.json", config)
    _write_json(
        directory / "generation_config.json",
        {"eos_token_id": eos_ids, "pad_token_id": ids["<|endoftext|>"]},
    )
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": ARCHITECTURE["max_position_embeddings"],
            "added_tokens_decoder": {str(ids[t]): _added_token_entry(t) for t in SPECIAL_TOKENS + MARKUP_TOKENS},
            "chat_template": CHAT_TEMPLATE,
        },
    )
    weights = _random_weights(ModelConfig.from_hf_dict(config), seed)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
