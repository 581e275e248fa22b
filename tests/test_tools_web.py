"""Web search behind record/replay: replay offline, misses as tool errors, and the API key never stored.

No test reaches the network: replay reads cache files the tests write, and recording goes through
an ``httpx.MockTransport`` standing in for Serper and SerpAPI (the real services cannot be reached
from here).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from workbench.tools import ToolOptionError, make_tool, run_tool
from workbench.tools.web import WebSearchTool, cache_key, normalise_request

FAKE_KEY = "sk-fake-0123456789abcdef"

SERPER_RESPONSE = {
    "searchParameters": {"q": "capital of vexland", "gl": "us", "hl": "en", "num": 10},
    "organic": [
        {
            "title": "Vexland - Wiki",
            "link": "https://example.org/vexland",
            "snippet": "The capital is Orbrook.",
        },
        {"title": "Leaked answers", "link": "https://huggingface.co/datasets/leak", "snippet": "Orbrook"},
        {"title": "Travel", "link": "https://example.com/travel", "snippet": "Visit Orbrook."},
    ],
}


def call(tool, arguments):
    return asyncio.run(run_tool(tool, arguments, timeout=10))


def test_replay_answers_from_a_cache_file_without_network_or_key(tmp_path, monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    tool = WebSearchTool("serper", cache_dir=tmp_path, gl="us", hl="en")
    request = normalise_request("serper", "Capital of  Vexland", {"gl": "us", "hl": "en", "num": 10})
    assert request == {"q": "capital of vexland", "gl": "us", "hl": "en", "num": 10}
    path = tmp_path / "serper" / cache_key("serper", request)[:2] / f"{cache_key('serper', request)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"backend": "serper", "request": request, "response": SERPER_RESPONSE}))
    result = call(tool, {"q": "capital of Vexland"})  # case and spacing do not change the key
    assert result.ok, result.error
    assert [r["url"] for r in result.content] == [
        "https://example.org/vexland",
        "https://huggingface.co/datasets/leak",
        "https://example.com/travel",
    ]
    assert result.content[0] == {
        "query": "capital of Vexland",
        "rank": 1,
        "title": "Vexland - Wiki",
        "url": "https://example.org/vexland",
        "snippet": "The capital is Orbrook.",
    }
    assert result.metadata["fetched"] == 0
    blocked = WebSearchTool(
        "serper", cache_dir=tmp_path, gl="us", hl="en", blocklist=["huggingface.co/datasets"]
    )
    assert [r["rank"] for r in call(blocked, {"q": "capital of vexland"}).content] == [1, 2]
    assert "huggingface" not in json.dumps(call(blocked, {"q": "capital of vexland"}).content)


def test_a_miss_in_replay_mode_is_a_tool_error_naming_the_key_and_how_to_record(tmp_path):
    tool = make_tool("web_search", cache_dir=str(tmp_path))
    result = call(tool, {"queries": ["never recorded"]})
    key = cache_key("serper", normalise_request("serper", "never recorded", {"num": 10}))
    assert not result.ok and result.content == ""
    assert key in result.error and "mode='record'" in result.error and "$SERPER_API_KEY" in result.error
    assert result.metadata["missing"] == [key]
    assert not any(tmp_path.rglob("*.json"))


class FakeSearchService:
    """Answers like Serper/SerpAPI and, like SerpAPI, echoes the key it was sent in the response."""

    def __init__(self, status: int = 200):
        self.requests: list[httpx.Request] = []
        self.status = status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": f"bad key {FAKE_KEY}"})
        if request.url.host == "serpapi.com":
            query = request.url.params["q"]
            return httpx.Response(
                200,
                json={
                    "search_metadata": {"json_endpoint": f"https://serpapi.com/search?api_key={FAKE_KEY}"},
                    "organic_results": [
                        {"title": query.upper(), "link": "https://example.org/a", "snippet": "s"}
                    ],
                },
            )
        body = json.loads(request.content)
        return httpx.Response(200, json={"organic": [{"title": body["q"], "link": "https://example.org/b"}]})


@pytest.mark.parametrize("backend", ["serper", "serpapi"])
def test_recording_stores_the_answer_but_never_the_key(tmp_path, monkeypatch, backend):
    env = {"serper": "SERPER_API_KEY", "serpapi": "SERPAPI_API_KEY"}[backend]
    monkeypatch.setenv(env, FAKE_KEY)
    service = FakeSearchService()
    cache = tmp_path / "cache"
    tool = WebSearchTool(backend, mode="record", cache_dir=cache, transport=httpx.MockTransport(service))
    result = call(tool, {"queries": ["alpha beta", "gamma"], "num": 3})
    assert result.ok, result.error
    assert [r["query"] for r in result.content] == ["alpha beta", "gamma"] and result.metadata["fetched"] == 2
    assert len(service.requests) == 2
    if backend == "serper":
        assert service.requests[0].headers["X-API-KEY"] == FAKE_KEY
        assert json.loads(service.requests[0].content) == {"q": "alpha beta", "num": 3}
    else:
        assert service.requests[0].url.params["api_key"] == FAKE_KEY
    files = list(cache.rglob("*"))
    assert len([f for f in files if f.is_file()]) == 2
    for f in files:
        if f.is_file():
            assert FAKE_KEY not in f.read_text()
    assert FAKE_KEY not in json.dumps(result.to_dict()) and FAKE_KEY not in repr(tool)
    # the recording now replays offline, with no key and no service
    monkeypatch.delenv(env)
    replay = WebSearchTool(backend, cache_dir=cache)
    again = call(replay, {"queries": ["Alpha  Beta", "gamma"], "num": 3})
    assert again.ok and [r["query"] for r in again.content] == ["Alpha  Beta", "gamma"]
    assert [{**r, "query": ""} for r in again.content] == [{**r, "query": ""} for r in result.content]


def test_auto_mode_calls_the_service_only_on_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", FAKE_KEY)
    service = FakeSearchService()
    tool = WebSearchTool(mode="auto", cache_dir=tmp_path, transport=httpx.MockTransport(service))
    assert call(tool, {"q": "one"}).metadata["fetched"] == 1
    assert call(tool, {"queries": ["one", "two"]}).metadata["fetched"] == 1
    assert call(tool, {"queries": ["two", "one"]}).metadata["fetched"] == 0
    assert len(service.requests) == 2


def test_the_key_can_come_from_a_file_and_a_missing_key_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    service = FakeSearchService()
    no_key = WebSearchTool(mode="record", cache_dir=tmp_path, transport=httpx.MockTransport(service))
    result = call(no_key, {"q": "x"})
    assert not result.ok and "needs an API key in $SERPER_API_KEY" in result.error and not service.requests
    key_file = tmp_path / "serper.key"
    key_file.write_text(FAKE_KEY + "\n")
    tool = WebSearchTool(
        mode="record", cache_dir=tmp_path / "c", api_key_file=key_file, transport=httpx.MockTransport(service)
    )
    assert call(tool, {"q": "x"}).ok and service.requests[0].headers["X-API-KEY"] == FAKE_KEY


def test_http_failures_are_tool_errors_that_do_not_quote_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SERPAPI_API_KEY", FAKE_KEY)
    refused = WebSearchTool(
        "serpapi", mode="record", cache_dir=tmp_path, transport=httpx.MockTransport(FakeSearchService(401))
    )
    result = call(refused, {"q": "x"})
    assert not result.ok and result.error == "web_search: serpapi answered HTTP 401: check the key"

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot connect to {request.url}", request=request)  # the URL holds the key

    down = WebSearchTool(
        "serpapi", mode="record", cache_dir=tmp_path, transport=httpx.MockTransport(unreachable)
    )
    result = call(down, {"q": "x"})
    assert not result.ok and result.error == "web_search: serpapi request failed (ConnectError)"
    assert not any(tmp_path.rglob("*.json"))


def test_bad_options_are_refused_with_the_choices():
    with pytest.raises(
        ToolOptionError, match="unknown web search backend 'bing'; use one of serper, serpapi"
    ):
        WebSearchTool("bing")
    with pytest.raises(
        ToolOptionError, match="unknown web search mode 'live'; use one of replay, record, auto"
    ):
        make_tool("web_search", mode="live")
