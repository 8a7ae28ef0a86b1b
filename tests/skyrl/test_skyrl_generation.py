"""proxy.skyrl picks the generation the installed skyrl offers, and says what it supports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import proxy.skyrl
from proxy.skyrl.generation import CLIENT_MARKER, ENGINE_MODULE, offers, unsupported

pytestmark = pytest.mark.skyrl


def test_skyrl_0_2_offers_the_engine_and_not_the_0_4_client() -> None:
    assert offers(ENGINE_MODULE)
    assert not offers(CLIENT_MARKER)  # 0.2's early RemoteInferenceClient is another shape
    assert "SidecarInferenceEngine" in proxy.skyrl.__all__
    assert "SidecarInferenceClient" not in proxy.skyrl.__all__


def test_a_module_skyrl_lacks_is_not_offered() -> None:
    assert not offers("skyrl.backends.no_such_generation.client")


def test_a_dependency_missing_from_the_install_is_raised_not_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg/__init__.py").write_text("import torch_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="torch_that_is_not_installed"):
        offers("brokenpkg.client")
    sys.modules.pop("brokenpkg", None)


def test_the_error_names_the_supported_versions_and_the_installed_one() -> None:
    message = str(unsupported())
    assert "skyrl 0.2.x (RemoteInferenceEngine" in message
    assert "skyrl 0.4.x (RemoteInferenceClient" in message
    assert "skyrl 0.2.0 is installed" in message
