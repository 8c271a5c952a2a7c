"""The README's examples as a new user copies them: every request in them that generates text names `max_tokens`,
so the demo model's random text stops after a line instead of running to the end of its window."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def generating_calls() -> list[str]:
    """Each curl call to a generating route and each `.create(` call of the openai package, as written."""
    text = README.read_text()
    blocks = re.findall(r"```(?:sh|python)\n(.*?)```", text, flags=re.S)
    calls = []
    for block in blocks:
        calls += re.findall(r"curl [^\n]*/v1/(?:chat/)?completions[^\n]*\\\n[^\n]*", block)
        calls += re.findall(r"\.(?:chat\.)?completions\.create\((?:[^()]|\([^()]*\))*\)", block, flags=re.S)
    return calls


def test_the_readmes_generating_examples_are_bounded():
    calls = generating_calls()
    assert len(calls) >= 4  # two with curl, two with the openai package
    assert [call for call in calls if "max_tokens" not in call] == []
