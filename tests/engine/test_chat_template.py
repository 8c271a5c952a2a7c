"""Chat templates render exactly as transformers' apply_chat_template renders them."""

import datetime

import gguf
import pytest
from transformers import AutoTokenizer

from inference.engine.demo_model import write_demo_model
from inference.engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate, TemplateError
from inference.engine.text.tokenizer import Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city <in °C>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

CONVERSATIONS = {
    "single user turn": [{"role": "user", "content": "Tell me about a cat."}],
    "system and turns": [
        {"role": "system", "content": "You tell short stories."},
        {"role": "user", "content": "Tell me about a cat."},
        {"role": "assistant", "content": "The cat sat.\nThe end."},
        {"role": "user", "content": "Another, with ünïcödé and 日本 😀"},
    ],
    "tool exchange": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I need the tool for both cities.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
            ],
        },
        {"role": "tool", "content": '{"temperature": 21}'},
        {"role": "tool", "content": '{"temperature": 19}'},
    ],
    "finished tool exchange": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning": "old reasoning is dropped once a new user turn starts",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "21"},
        {"role": "assistant", "content": "It is 21 °C."},
        {"role": "user", "content": "Thanks!"},
    ],
}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return write_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def demo_template(demo_dir):
    tokenizer = Tokenizer.from_hf_dir(demo_dir)
    return ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)


@pytest.fixture(scope="module")
def demo_reference(demo_dir):
    return AutoTokenizer.from_pretrained(demo_dir)


@pytest.fixture(scope="module")
def stories_reference(stories_hf_dir):
    return AutoTokenizer.from_pretrained(stories_hf_dir)


def test_stories_gguf_template_matches_transformers(stories_gguf_path, stories_reference):
    tokenizer = Tokenizer.from_gguf(gguf.GGUFReader(stories_gguf_path), stories_gguf_path)
    template = ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
    for messages in CONVERSATIONS.values():
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        for add_generation_prompt in (True, False):
            expected = stories_reference.apply_chat_template(
                plain, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert template.render(plain, add_generation_prompt=add_generation_prompt) == expected
    example = [CONVERSATIONS["system and turns"][0], CONVERSATIONS["system and turns"][1]]
    assert template.render(example) == "<s>You tell short stories.\n\nUser: Tell me about a cat.\nAssistant:"


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("enable_thinking", [None, True, False])
@pytest.mark.parametrize("with_tools", [False, True])
def test_demo_template_matches_transformers(demo_template, demo_reference, name, enable_thinking, with_tools):
    tools = [WEATHER_TOOL] if with_tools else None
    thinking = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    for add_generation_prompt in (True, False):
        expected = demo_reference.apply_chat_template(
            CONVERSATIONS[name], tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **thinking
        )
        rendered = demo_template.render(
            CONVERSATIONS[name], tools=tools, add_generation_prompt=add_generation_prompt, **thinking
        )
        assert rendered == expected


def test_demo_template_thinking_switch(demo_template):
    messages = CONVERSATIONS["single user turn"]
    assert demo_template.render(messages).endswith("<|im_start|>assistant\n")
    assert demo_template.render(messages, enable_thinking=True).endswith("<|im_start|>assistant\n")
    assert demo_template.render(messages, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_demo_template_tools(demo_template):
    no_tools = demo_template.render(CONVERSATIONS["tool exchange"])
    rendered = demo_template.render(CONVERSATIONS["tool exchange"], tools=[WEATHER_TOOL])
    assert "<tools>" not in no_tools
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert (
        '\n{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city <in °C>"'
        in rendered
    )
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' in rendered
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call><|im_end|>' in rendered
    assert '<|im_start|>tool\n{"temperature": 21}<|im_end|>\n<|im_start|>tool\n{"temperature": 19}' in rendered
    # Reasoning of the ongoing exchange is kept; that of a finished one is not.
    assert "<think>\nI need the tool for both cities.\n</think>\n\n<tool_call>" in rendered
    assert "old reasoning" not in demo_template.render(CONVERSATIONS["finished tool exchange"])


def test_chatml_fallback(stories_reference):
    template = ChatTemplate(None)
    messages = CONVERSATIONS["system and turns"][:2]
    expected = (
        "<|im_start|>system\nYou tell short stories.<|im_end|>\n"
        "<|im_start|>user\nTell me about a cat.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(messages) == expected
    assert template.render(messages, add_generation_prompt=False) == expected.removesuffix("<|im_start|>assistant\n")
    for messages in CONVERSATIONS.values():
        reference = stories_reference.apply_chat_template(
            messages, chat_template=CHATML_TEMPLATE, tokenize=False, add_generation_prompt=True
        )
        assert template.render(messages) == reference
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert template.render(parts, add_generation_prompt=False) == "<|im_start|>user\nab<|im_end|>\n"


def test_raise_exception_becomes_template_error(demo_template):
    template = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('user first, please') }}{% endif %}")
    with pytest.raises(TemplateError, match="user first, please"):
        template.render([{"role": "system", "content": "x"}])
    with pytest.raises(TemplateError, match="Only the first message can be a system message"):
        demo_template.render([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
    assert issubclass(TemplateError, ValueError)


def test_broken_and_unsafe_templates_raise_template_error():
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for message in messages %}")
    with pytest.raises(TemplateError, match="unsafe"):
        ChatTemplate("{{ messages.append(1) }}").render([])
    with pytest.raises(TemplateError, match="unsafe"):
        ChatTemplate("{{ ''.__class__.__mro__ }}").render([])
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages[0].content + 1 }}").render([{"role": "user", "content": "a"}])


def test_helpers_like_transformers(stories_reference):
    source = (
        "{{ bos_token }}|{{ eos_token }}|{{ tools | tojson }}|{{ tools | tojson(indent=2) }}|"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}|"
        "{% generation %}{{ extra_var }}{% endgeneration %}"
    )
    messages = [{"role": "user", "content": "first"}, {"role": "user", "content": "second"}]
    tools = [{"name": "<b>é & ü</b>"}]
    expected = stories_reference.apply_chat_template(
        messages, tools=tools, chat_template=source, tokenize=False, extra_var="x"
    )
    assert ChatTemplate(source, "<s>", "</s>").render(messages, tools=tools, extra_var="x") == expected
    assert ChatTemplate("{{ strftime_now('%Y') }}").render([]) == str(datetime.date.today().year)
    assert ChatTemplate("[{{ bos_token }}]").render([]) == "[]"  # an unset token renders as nothing
