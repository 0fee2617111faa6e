"""Property: whatever values an alert's labels hold, target selection either refuses or names a host from the
configuration with a GPU index made of digits; no value ever gets through as something else."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from bot.actions.targets import TargetRefused, select_target
from bot.config import RemediationConfig

CONFIG = RemediationConfig.model_validate({"hosts": {"gpu01": {}, "gpu02": {}}})
LABEL_NAMES = st.sampled_from(["host", "Hostname", "hostname", "node", "instance", "gpu", "container", "job"])
VALUES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["gpu01", "gpu02", "gpu01:9400", "0", "7", "0; reboot", "../../etc", "$(id)", "gpu01\n"]),
)


@given(st.dictionaries(LABEL_NAMES, VALUES, max_size=6))
def test_label_values_select_a_configured_host_or_are_refused(labels: dict[str, str]) -> None:
    try:
        target = select_target(labels, CONFIG)
    except TargetRefused:
        return
    assert target.host in CONFIG.hosts
    assert target.gpu is None or re.fullmatch(r"[0-9]{1,2}", target.gpu)
