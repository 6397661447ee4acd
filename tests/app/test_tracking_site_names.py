"""Names that become folder names cannot leave their state folder."""

from __future__ import annotations

import pytest

from app.config.site_config import SiteConfig, SiteConfigError


@pytest.mark.parametrize("name", ["..", ".", "a/b", "../x", "a\\b", "a\0b"])
def test_dot_only_or_separator_site_names_are_refused(tmp_path, name):
    with pytest.raises(SiteConfigError, match="site-name"):
        SiteConfig.from_node_config({"data-path": str(tmp_path), "site-name": name}, "")
    assert SiteConfig.from_node_config({"data-path": str(tmp_path), "site-name": "h.a-1"},
                                       "").name == "h.a-1"
