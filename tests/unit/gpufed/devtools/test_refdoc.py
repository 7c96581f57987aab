"""The generated references (docs/reference/cli.md, docs/reference/crds.md): drift against the code
and the CRDs, and what the generators promise (every command, no terminal effects, literal text)."""

from __future__ import annotations

import pytest
import typer.main
from typer.core import TyperGroup

from gpufed.cli import app
from gpufed.devtools import crdref, refdoc
from tests.paths import REPO


def test_the_cli_reference_matches_the_code() -> None:
    committed = (REPO / refdoc.DEFAULT_PATH).read_text()
    assert committed == refdoc.render(), (
        f"{refdoc.DEFAULT_PATH} is out of date with the gpufed commands and flags: "
        f"regenerate it with `{refdoc.REGENERATE}` and commit the result"
    )


def test_the_crd_reference_matches_the_crds() -> None:
    committed = (REPO / crdref.DEFAULT_PATH).read_text()
    assert committed == crdref.render(REPO / crdref.CRD_DIR), (
        f"{crdref.DEFAULT_PATH} is out of date with deploy/crds/: "
        f"regenerate it with `{crdref.REGENERATE}` and commit the result"
    )


def test_every_visible_command_is_documented_with_its_options() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    ctx = root.context_class(root, info_name="gpufed")
    docs = {c.path: c for c in refdoc.commands()}
    top = set(root.list_commands(ctx))
    assert {f"gpufed {name}" for name in top} <= set(docs)
    peer = docs["gpufed peer"]
    options = {o.names[0]: o for o in peer.options}
    # kubectl's resolution: no kubeconfig flag is required, KUBECONFIG is read as kubectl reads it
    assert not options["--remote-kubeconfig"].required and not options["--kubeconfig"].required
    assert "KUBECONFIG" in options["--kubeconfig"].help
    assert options["--pods"].default == "110" and options["--pods"].type == "int"
    assert options["--masquerade"].type == "flag"
    assert "--help" not in options
    wait = {o.names[0]: o for o in docs["gpufed network connect"].options}["--wait"]
    assert wait.names == ("--wait", "--no-wait") and wait.default == "--no-wait"
    assert docs["gpufed network expose"].usage == "gpufed network expose [OPTIONS] ADDRESS"
    assert docs["gpufed network"].subcommands == ("connect", "disconnect", "expose", "status")


def test_the_cli_reference_ignores_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    wide = refdoc.render()
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert refdoc.render() == wide
    assert "\x1b[" not in wide


def test_help_text_is_shown_literally_in_markdown() -> None:
    assert refdoc._cell("DefaultName (<ns>-<id>) a|b *x*") == "DefaultName (&lt;ns&gt;-&lt;id&gt;) a\\|b \\*x\\*"
    assert refdoc._md("run `gpufed <verb>` here <x>") == "run `gpufed <verb>` here &lt;x&gt;"


def test_every_crd_file_is_documented_with_its_fields() -> None:
    docs = {c.kind: c for c in crdref.crds(REPO / crdref.CRD_DIR)}
    assert len(docs) == len(list((REPO / crdref.CRD_DIR).glob("*.yaml")))
    rslice = docs["ResourceSlice"]
    assert (rslice.group, rslice.scope, rslice.short_names) == ("gpufed.io", "Namespaced", ("rslice",))
    (v,) = rslice.versions
    fields = {f.path: f for f in v.fields}
    assert fields["spec.resources"].type == "map[string]string" and fields["spec.resources"].required
    assert fields["status.conditions[].reason"].required
    assert "one of `True`, `False`, `Unknown`" in fields["status.conditions[].status"].validation
    assert any(r.path == "spec.resources" for r in v.rules)


def test_the_crd_reference_does_not_depend_on_the_working_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = crdref.render(REPO / crdref.CRD_DIR)
    monkeypatch.chdir(REPO / "docs")
    assert crdref.render(REPO / crdref.CRD_DIR) == expected


def test_the_crd_reference_says_how_to_address_kinds_whose_name_is_shared() -> None:
    page = crdref.render(REPO / crdref.CRD_DIR)
    naming = page.split("\n## Naming\n", 1)[1].split("\n## ", 1)[0]
    assert "| ResourceSlice | DRA's `ResourceSlice` (`resource.k8s.io`" in naming
    assert "`kubectl get resourceslices.gpufed.io` / `kubectl get rslice`" in naming
    assert "`kubectl get gateways.gpufed.io` / `kubectl get gfgw`" in naming
    assert "no stored object needs a migration" in naming
    # every kind named there is one of gpufed's
    assert set(crdref.SHARED_KIND_NAMES) <= {c.kind for c in crdref.crds(REPO / crdref.CRD_DIR)}
