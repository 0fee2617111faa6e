"""One retryability decision for every HTTP client: the status and transport-error classifier."""

from __future__ import annotations

import aiohttp
import httpx
from hypothesis import given
from hypothesis import strategies as st

from bot.retry import classify_error, classify_status

_REQUEST = httpx.Request("POST", "https://events.pagerduty.com/v2/enqueue")


@given(st.integers(500, 599))
def test_a_server_error_is_retried(status: int) -> None:
    assert classify_status(status).retry
    assert classify_status(status).reason == f"http_{status}"


@given(st.sampled_from([408, 425, 429]))
def test_rate_limited_and_too_early_answers_are_retried(status: int) -> None:
    assert classify_status(status).retry


@given(st.integers(400, 499).filter(lambda status: status not in (408, 425, 429)))
def test_any_other_client_error_is_not_retried(status: int) -> None:
    verdict = classify_status(status)
    assert not verdict.retry and verdict.reason == f"http_{status}"


@given(
    st.sampled_from(
        [
            httpx.ConnectTimeout("connect", request=_REQUEST),
            httpx.ReadTimeout("read", request=_REQUEST),
            httpx.PoolTimeout("pool", request=_REQUEST),
            TimeoutError(),
            aiohttp.ServerTimeoutError("read"),
        ]
    )
)
def test_a_transport_timeout_is_retried(error: BaseException) -> None:
    assert (classify_error(error).retry, classify_error(error).reason) == (True, "timeout")


@given(st.sampled_from([httpx.ConnectError("refused", request=_REQUEST), ConnectionRefusedError()]))
def test_a_refused_connection_is_retried(error: BaseException) -> None:
    assert (classify_error(error).retry, classify_error(error).reason) == (True, "connection_refused")


@given(
    st.sampled_from(
        [
            httpx.ReadError("reset", request=_REQUEST),
            httpx.RemoteProtocolError("closed", request=_REQUEST),
            aiohttp.ServerDisconnectedError(),
            aiohttp.ClientPayloadError("truncated"),
            ConnectionResetError(),
        ]
    )
)
def test_a_lost_connection_is_retried(error: BaseException) -> None:
    assert (classify_error(error).retry, classify_error(error).reason) == (True, "connection_lost")


@given(st.sampled_from([httpx.DecodingError("bad gzip", request=_REQUEST), ValueError("ours"), KeyError("x")]))
def test_an_undecodable_answer_or_our_own_error_is_not_retried(error: BaseException) -> None:
    assert not classify_error(error).retry
