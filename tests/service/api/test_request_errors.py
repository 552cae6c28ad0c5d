"""A body that is no JSON object at all: one error saying what was wrong and where, in the client's terms."""

from __future__ import annotations

import pytest

ROUTES = ["/v1/stats", "/v1/plans", "/v1/sweeps"]


def _one_error(r, loc: list[str]) -> dict:
    """The answer's single error; its msg is the detail; every error keeps loc, msg and input."""
    assert r.status_code == 422, r.text
    body = r.json()
    [error] = body["errors"]
    assert set(error) == {"loc", "msg", "input"} and error["loc"] == loc
    assert error["msg"] == body["detail"]
    return error


@pytest.mark.parametrize("route", ROUTES)
def test_malformed_json_names_line_and_column(client, count_rows, route):
    body = b'{"stats_id": 1,\n "memory_budget_gib": 4.5,, "x": 1}'
    r = client.post(route, content=body, headers={"content-type": "application/json"})
    error = _one_error(r, ["body"])
    assert r.json()["detail"] == ("the request body is not valid JSON: Expecting property name enclosed in double "
                                  "quotes at line 2, column 27 (character 42)")
    assert ',, "x"' in error["input"]  # the text around the error
    truncated = client.post(route, content=b'{"stats_id": 1,\n "memory', headers={"content-type": "application/json"})
    _one_error(truncated, ["body"])
    assert truncated.json()["detail"] == ("the request body is not valid JSON: Unterminated string starting at "
                                          "line 2, column 2 (character 17)")
    assert count_rows()["stats"] == 0 and count_rows()["plans"] == 0


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("content_type", "sent"), [("text/plain", "content-type: text/plain"),
                                                    ("application/x-www-form-urlencoded",
                                                     "content-type: application/x-www-form-urlencoded"),
                                                    (None, "no content-type")])
def test_wrong_or_missing_content_type_says_to_send_json(client, route, content_type, sent):
    headers = {"content-type": content_type} if content_type else {}
    r = client.post(route, content=b'{"stats_id": 1, "memory_budget_gib": 4.5}', headers=headers)
    error = _one_error(r, ["header", "content-type"])
    assert r.json()["detail"] == ("the request body must be JSON sent with content-type: application/json; "
                                  f"this request sent {sent}")
    assert error["input"] == content_type


@pytest.mark.parametrize("route", ROUTES)
def test_empty_body_and_non_objects(client, route):
    empty = client.post(route, content=b"", headers={"content-type": "application/json"})
    _one_error(empty, ["body"])
    assert empty.json()["detail"] == "the request body is empty: send a JSON object with content-type: application/json"
    for sent, kind in ((b"[1, 2]", "an array"), (b'"stats"', "a string"), (b"4.5", "a number"), (b"null", "null")):
        r = client.post(route, content=sent, headers={"content-type": "application/json"})
        _one_error(r, ["body"])
        assert r.json()["detail"] == f"the request body must be a JSON object ({{...}}), got {kind}", sent


def test_unreadable_json_is_400_saying_why(client):
    deep = client.post("/v1/stats", content=b"[" * 100_000 + b"]" * 100_000,
                       headers={"content-type": "application/json"})
    assert deep.status_code == 400
    assert deep.json() == {"detail": "the request body nests JSON arrays or objects too deeply to be read"}
    bad_utf8 = client.post("/v1/plans", content=b'{"stats_id": "\xff"}', headers={"content-type": "application/json"})
    assert bad_utf8.status_code == 400
    assert bad_utf8.json()["detail"].startswith("the request body is not valid JSON: it is not UTF-8 text (byte 0xff")
