"""The playground page as the server renders it: its controls and script, the select without an engine, a tools
example that parses, and the sign-in fence. The streaming itself runs in the browser
(tests/ui/test_browser.py)."""

import html
import json
import re

import pytest
from django.templatetags.static import static
from django.test import Client
from django.urls import reverse

from inference.runtime.router import installed_router

pytestmark = pytest.mark.django_db

CONTROLS = ["model", "temperature", "max-tokens", "json", "tools", "tools-json", "token", "message", "send", "stop",
            "transcript"]  # fmt: skip


def test_the_page_has_every_control_and_loads_its_script(operator):
    response = operator.get(reverse("ui:playground"))
    assert response.status_code == 200
    text = response.content.decode()
    for control in CONTROLS:
        assert f'id="pg-{control}"' in text, control
    assert f'<script src="{static("admin_ui/playground.js")}"' in text
    assert f'href="{static("admin_ui/playground.css")}"' in text
    assert 'aria-current="page">Playground</a>' in text


def test_without_an_engine_the_select_says_no_model_is_served(operator):
    assert installed_router() is None  # the real list is the browser test's (tests/ui/test_browser.py)
    text = operator.get(reverse("ui:playground")).content.decode()
    assert '<option value="">no model is served</option>' in text


def test_the_tools_example_is_a_valid_function_tool(operator):
    text = operator.get(reverse("ui:playground")).content.decode()
    example = re.search(r'<textarea id="pg-tools-json"[^>]*>(.*?)</textarea>', text, re.S).group(1)
    tools = json.loads(html.unescape(example))
    assert [(t["type"], t["function"]["name"]) for t in tools] == [("function", "get_weather")]
    assert tools[0]["function"]["parameters"]["required"] == ["city"]


def test_anonymous_users_are_sent_to_sign_in():
    response = Client().get(reverse("ui:playground"))
    assert response.status_code == 302
    assert response["Location"] == "/ui/login/?next=/ui/playground/"
