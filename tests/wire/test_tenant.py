"""Tenant ids: an HMAC of the bearer key under a server secret that is kept in the data dir."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from proxy.wire.tenant import (
    Tenancy,
    bearer_key,
    credential,
    key_fingerprint,
    load_or_create_secret,
    raw_header_map,
    tenant_id,
)
from proxy.wire.upstream_keys import Gate


def test_the_configured_secret_wins_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("from-file\n")

    assert load_or_create_secret("from-config", tmp_path) == b"from-config"


def test_a_missing_secret_is_generated_once_and_kept_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    first = load_or_create_secret("", data_dir)
    second = load_or_create_secret("", data_dir)

    assert first == second
    assert len(first) == 64
    assert stat.S_IMODE((data_dir / "secret").stat().st_mode) == 0o600


def test_an_empty_secret_file_is_an_error_not_a_weak_secret(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("")

    with pytest.raises(ValueError, match="empty"):
        load_or_create_secret("", tmp_path)


def test_tenants_differ_per_key_and_per_secret_and_never_contain_the_key() -> None:
    t1 = tenant_id(b"s1", "sk-alpha")

    assert t1 == tenant_id(b"s1", "sk-alpha")
    assert t1 != tenant_id(b"s1", "sk-beta")
    assert t1 != tenant_id(b"s2", "sk-alpha")
    assert len(t1) == 24
    assert "alpha" not in t1
    assert key_fingerprint(b"s1", "sk-alpha") == t1[:12]


def test_no_key_is_the_anonymous_tenant() -> None:
    assert tenant_id(b"s", None) == "anonymous"
    assert tenant_id(b"s", "") == "anonymous"
    assert key_fingerprint(b"s", None) == "anonymous"


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Bearer sk-1", "sk-1"),
        ("bearer   sk-2 ", "sk-2"),
        ("Basic dXNlcg==", None),
        ("Bearer", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_key_reads_only_bearer_authorization(header: str | None, key: str | None) -> None:
    assert bearer_key(header) == key


@pytest.mark.parametrize(
    ("headers", "found"),
    [
        ({"authorization": "Bearer sk-1"}, "sk-1"),
        ({"authorization": "bearer   sk-2 "}, "sk-2"),
        ({"authorization": "Basic dXNlcjpwdw=="}, "Basic dXNlcjpwdw=="),
        ({"authorization": "Token abc"}, "Token abc"),
        ({"authorization": "sk-bare"}, "sk-bare"),
        ({"api-key": "azure-key"}, "azure-key"),
        ({"x-api-key": "sk-ant-1"}, "sk-ant-1"),
        ({"authorization": "Bearer ", "x-api-key": "sk-ant-2"}, "sk-ant-2"),
        ({"authorization": "Bearer first", "x-api-key": "second"}, "first"),
        ({"authorization": "  "}, None),
        ({}, None),
    ],
)
def test_every_credential_form_is_found(headers: dict[str, str], found: str | None) -> None:
    assert credential(headers) == found


def test_the_same_key_is_the_same_tenant_in_every_header() -> None:
    tenancy = Tenancy(b"s")
    tenants = {
        tenancy.identify(h).tenant
        for h in ({"authorization": "Bearer k"}, {"api-key": "k"}, {"x-api-key": "k"})
    }

    assert tenants == {tenant_id(b"s", "k")}


@pytest.mark.parametrize(
    "spellings",
    [
        (
            "Basic dXNlcg==",
            "basic dXNlcg==",
            "BASIC  dXNlcg==",
            "Basic\tdXNlcg==",
            " basic dXNlcg== ",
        ),
        ("Bearer sk-1", "bearer sk-1", "BEARER\tsk-1", "Bearer \t sk-1"),
        ("Token abc", "token abc", "TOKEN\tabc"),
    ],
)
def test_a_scheme_however_spelled_is_the_same_tenant(spellings: tuple[str, ...]) -> None:
    tenancy = Tenancy(b"s")
    identities = {tenancy.identify({"authorization": v}) for v in spellings}

    assert len(identities) == 1
    assert None not in {i.tenant for i in identities}


def test_the_usual_spelling_of_a_scheme_keeps_its_tenant() -> None:
    # Tenants and key ids (match_keys, allowed_keys) made before scheme case was ignored.
    assert credential({"authorization": "basic dXNlcg=="}) == "Basic dXNlcg=="
    assert credential({"authorization": "Bearer\tsk-1"}) == "sk-1"
    assert bearer_key("bearer\tsk-1") == "sk-1"


def test_only_spaces_and_tabs_separate_the_scheme() -> None:
    # "à" is C3 A0 in UTF-8: read as latin-1, its second half is U+00A0 (no-break space).
    sent = "sk-àb".encode()
    assert credential(raw_header_map([(b"authorization", sent)])) == sent.decode("latin-1")


def test_the_gate_admits_a_listed_key_however_its_scheme_is_spelled() -> None:
    tenancy = Tenancy(b"s")
    gate = Gate(tenancy, "up", frozenset({key_fingerprint(b"s", "Basic dXNlcg==")}))
    sent = [(b"authorization", b"basic\tdXNlcg=="), (b"accept", b"*/*")]

    assert gate.authorize(sent) == [(b"accept", b"*/*"), (b"authorization", b"Bearer up")]


def test_other_schemes_and_raw_values_are_tenants_of_their_own() -> None:
    tenancy = Tenancy(b"s")
    ids = [
        tenancy.identify({"authorization": v}).tenant
        for v in ("Basic dXNlcg==", "Basic b3RoZXI=", "Token dXNlcg==", "Bearer dXNlcg==")
    ]

    assert None not in ids
    assert len(set(ids)) == 4


def test_no_credential_has_no_tenant_unless_the_shared_tenant_is_on() -> None:
    assert Tenancy(b"s").identify({}).tenant is None
    assert Tenancy(b"s").identify({}).fingerprint == "anonymous"
    assert Tenancy(b"s", shared_anonymous=True).identify({}).tenant == "anonymous"


def test_only_configured_headers_are_read() -> None:
    tenancy = Tenancy(b"s", headers=("x-team-key",))

    assert tenancy.identify({"authorization": "Bearer k"}).tenant is None
    assert tenancy.identify({"x-team-key": "k"}).tenant == tenant_id(b"s", "k")


def test_upstream_key_mode_strips_every_credential_header() -> None:
    raw = [
        (b"Authorization", b"Bearer a"),
        (b"api-key", b"b"),
        (b"X-Api-Key", b"c"),
        (b"x-o", b"d"),
    ]

    assert Tenancy(b"s").without_credentials(raw) == [(b"x-o", b"d")]
