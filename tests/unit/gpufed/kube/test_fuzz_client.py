"""Generated bad kubeconfigs: garbage YAML, missing contexts, bad base64, wrong types.

Owns the property that `gpufed.kube.client.api_client` (kubeconfig files: `gpufed peer`, `info`,
`controller`, ...) and `client_from_dict` (credentials read from a Secret) answer every malformed
kubeconfig with `KubeError` and a message naming the problem, never a KeyError, TypeError,
AttributeError or a bare `assert` from the client library. Generated kubeconfigs never carry `exec`
or `auth-provider` users (the library would run commands). Hypothesis runs derandomized with explicit
`max_examples`; counts are in docs/reliability.md.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from gpufed.kube.client import KubeError, api_client, check_kubeconfig, client_from_dict

#: Never generated, never accepted in generated text: these make the client library run programs.
_DANGEROUS = ("exec", "auth-provider", "cmd")
_CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
GOOD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Config",
    "current-context": "a",
    "clusters": [{"name": "a", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "contexts": [{"name": "a", "context": {"cluster": "a", "user": "u"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
}


def bounded(n: int) -> settings:
    """Deterministic, bounded hypothesis settings: `n` generated cases, no deadline, no database."""
    return settings(max_examples=n, derandomize=True, deadline=None, database=None)


_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=12),
    st.sampled_from(["", "a", "u", "https://127.0.0.1:1", "!!notbase64", "QUJD", "QUJD=", _CA]),
)
_value: st.SearchStrategy[Any] = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
_names = st.one_of(st.sampled_from(["a", "b", "u", ""]), _value)
_cluster = st.fixed_dictionaries(
    {},
    optional={
        "server": st.one_of(st.just("https://127.0.0.1:6443"), _value),
        "certificate-authority-data": st.one_of(st.just(_CA), _value),
        "insecure-skip-tls-verify": _value,
    },
)
_user = st.fixed_dictionaries(
    {},
    optional={
        "token": _value,
        "client-certificate-data": st.one_of(st.sampled_from(["QUJD", "@@", "QUJD="]), _value),
        "client-key-data": st.one_of(st.sampled_from(["QUJD", "@@"]), _value),
        "username": _value,
        "password": _value,
    },
)
_context = st.fixed_dictionaries({}, optional={"cluster": _names, "user": _names, "namespace": _value})


def _entries(item: str, body: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    entry = st.fixed_dictionaries({}, optional={"name": _names, item: st.one_of(body, _value)})
    return st.one_of(st.lists(entry, max_size=3), _value)


_kubeconfig = st.one_of(
    _value,
    st.fixed_dictionaries(
        {},
        optional={
            "current-context": _names,
            "clusters": _entries("cluster", _cluster),
            "contexts": _entries("context", _context),
            "users": _entries("user", _user),
        },
    ),
)
_context_arg = st.sampled_from([None, "a", "b", "missing"])


def _safe(kc: Any) -> bool:
    return not any(word in repr(kc) for word in _DANGEROUS)


def _check_message(e: KubeError) -> None:
    text = str(e)
    assert "invalid kubeconfig" in text or "cannot load kubeconfig" in text, text
    for leaked in ("object has no attribute", "not subscriptable", "NoneType", "AssertionError"):
        assert leaked not in text, text


@bounded(150)
@given(_kubeconfig, _context_arg)
@example(None, None)  # regression: TypeError from the library ('NoneType' object does not support item assignment)
@example({**GOOD, "contexts": "x"}, None)  # regression: AttributeError 'str' object has no attribute 'get_with_name'
@example({**GOOD, "contexts": [{"name": "a", "context": "s"}]}, "a")  # regression: AttributeError (safe_get)
@example({**GOOD, "clusters": [{"name": "a", "cluster": {"server": 12}}]}, "a")  # regression: bare assert
@example({**GOOD, "clusters": [{"name": "a", "cluster": {}}]}, None)  # regression: bare assert (no server)
@example({**GOOD, "users": [{"name": "u", "user": {"client-key-data": "@@"}}]}, None)  # regression: binascii
@example({**GOOD, "users": [{"name": "u", "user": {"tokenFile": "/nonexistent"}}]}, None)  # FileNotFoundError
@example(GOOD, "missing")
async def test_client_from_dict_raises_only_kube_error(kc: Any, context: str | None) -> None:
    assume(_safe(kc))
    try:
        api = await client_from_dict(kc, context)
    except KubeError as e:
        _check_message(e)
        return
    await api.close()
    check_kubeconfig(kc, context)  # what the library accepted, our check accepts too


_yaml_text = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    _kubeconfig.map(lambda kc: yaml.safe_dump(kc, allow_unicode=True)),
    st.sampled_from(["{", ": :", "a: [", "\x00", "!!python/object/apply:os.getpid []", "- - -", "*x", "&a [*a]"]),
)


@bounded(100)
@given(_yaml_text, _context_arg)
@example("", None)  # regression: TypeError
@example("[]", "a")  # regression: TypeError
@example("!!python/object/apply:os.getpid []", None)  # never executed: safe_load refuses the tag
async def test_api_client_raises_only_kube_error(text: str, context: str | None) -> None:
    assume(_safe(text))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kubeconfig"
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        try:
            async with api_client(path, context) as api:
                assert api.configuration.host
        except KubeError as e:
            _check_message(e)
            assert str(path) in str(e)  # the user learns which file


@pytest.mark.parametrize(
    ("kc", "context", "words"),
    [
        ({**GOOD, "contexts": []}, None, "context 'a' not found"),
        ({**GOOD, "current-context": ""}, None, "no current-context"),
        (GOOD, "other", "context 'other' not found (contexts: a)"),
        ({**GOOD, "clusters": []}, None, "names cluster 'a', which is not in clusters"),
        ({**GOOD, "users": []}, None, "names user 'u', which is not in users"),
        ({**GOOD, "clusters": [{"name": "a", "cluster": {"server": "https://x", "certificate-authority-data": "%%"}}]},
         None, "clusters[0].cluster.certificate-authority-data is not valid base64"),
        ({**GOOD, "users": [{"name": "u", "user": {"token": ["t"]}}]}, None, "users[0].user.token must be a string"),
        ({**GOOD, "users": {"u": {}}}, None, "users must be a list"),
        ([GOOD], None, "expected a mapping"),
    ],
)  # fmt: skip
def test_the_message_names_the_problem(kc: Any, context: str | None, words: str) -> None:
    with pytest.raises(KubeError, match="invalid kubeconfig") as caught:
        check_kubeconfig(kc, context)
    assert words in str(caught.value)


async def test_a_good_kubeconfig_still_loads(tmp_path: Path) -> None:
    check_kubeconfig(GOOD)
    (tmp_path / "kc").write_text(yaml.safe_dump(GOOD))
    async with api_client(tmp_path / "kc", "a") as api:
        assert api.configuration.host == "https://127.0.0.1:6443"
    api = await client_from_dict(GOOD)
    await api.close()


async def test_clients_ignore_the_environment_and_keep_their_connection_pool(tmp_path: Path) -> None:
    """No netrc or proxy lookups per request (trust_env off), over the library's own connector."""
    (tmp_path / "kc").write_text(yaml.safe_dump(GOOD))
    async with api_client(tmp_path / "kc", "a") as api:
        session = api.rest_client.pool_manager
        assert session.trust_env is False
        assert session.connector is not None and not session.connector.closed
    assert session.closed and session.connector is None, "closing the client closes its pool"
    api = await client_from_dict(GOOD)
    assert api.rest_client.pool_manager.trust_env is False
    await api.close()
