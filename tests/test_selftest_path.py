"""Reading Alertmanager's configuration for the receivers that post to the bot: any text it may report."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.selftest.path import bot_receivers

CONFIG = {
    "receivers": [
        {"name": "bot", "webhook_configs": [{"url": "http://gpu-alert-bot:9095/alertmanager"}]},
        {"name": "bot-trailing-slash", "webhook_configs": [{"url": "http://10.0.0.5:9095/alertmanager/"}]},
        {"name": "other", "webhook_configs": [{"url": "http://hooks.example.com/alertmanager-relay"}]},
        {"name": "secret-url", "webhook_configs": [{"url_file": "/run/secrets/url"}]},
        {"name": "mail", "email_configs": [{"to": "oncall@example.com"}]},
    ]
}


def test_receivers_posting_to_the_webhook_path_are_the_bots() -> None:
    assert bot_receivers(yaml.safe_dump(CONFIG), None) == {"bot", "bot-trailing-slash"}


def test_with_the_bots_url_only_receivers_posting_to_that_host_and_port_count() -> None:
    assert bot_receivers(yaml.safe_dump(CONFIG), "http://10.0.0.5:9095") == {"bot-trailing-slash"}


def test_a_configuration_that_is_not_yaml_names_no_receiver() -> None:
    assert bot_receivers("receivers: [unclosed", None) == set()


_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=30)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
# Dumping and parsing YAML takes its time on a loaded machine: no per-example deadline.
_PROPERTY = settings(deadline=None)
_webhook = st.dictionaries(st.sampled_from(["url", "url_file", "send_resolved"]), _values | st.text(), max_size=3)
_receiver = st.dictionaries(
    st.sampled_from(["name", "webhook_configs"]), _values | st.lists(_webhook | _values, max_size=3), max_size=2
)


@_PROPERTY
@given(st.dictionaries(st.sampled_from(["receivers", "route"]), _values | st.lists(_receiver | _values), max_size=2))
def test_any_configuration_shape_gives_a_set_of_names_never_an_error(config: dict[str, Any]) -> None:
    assert isinstance(bot_receivers(yaml.safe_dump(config), None), set)


@_PROPERTY
@given(st.text(max_size=200))
def test_any_text_gives_a_set_of_names_never_an_error(text: str) -> None:
    assert isinstance(bot_receivers(text, "http://127.0.0.1:9095"), set)
