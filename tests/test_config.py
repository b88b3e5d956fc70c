"""Settings are parsed once, and a bad value fails at startup naming the setting."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_reliability.config import Config, SettingError


def test_defaults():
    config = Config.from_settings(Settings())
    assert config.database_url is None
    assert config.lease_seconds == 30.0
    assert config.heartbeat_seconds == pytest.approx(10.0)
    assert config.order == "bfs"
    assert config.auto_migrate is False


def test_values_are_parsed():
    config = Config.from_settings(
        Settings(
            {
                "RELIABILITY_DATABASE_URL": " postgresql+psycopg://u@h/db ",
                "RELIABILITY_LEASE_SECONDS": "12",
                "RELIABILITY_ORDER": "DFS",
                "RELIABILITY_CLAIM_BATCH": "8",
                "RELIABILITY_AUTO_MIGRATE": "true",
                "RELIABILITY_JOB": "nightly",
            }
        )
    )
    assert config.database_url == "postgresql+psycopg://u@h/db"
    assert config.lease_seconds == 12.0
    assert config.heartbeat_seconds == pytest.approx(4.0)
    assert config.order == "dfs"
    assert config.claim_batch == 8
    assert config.auto_migrate is True
    assert config.job == "nightly"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"RELIABILITY_LEASE_SECONDS": "soon"}, "RELIABILITY_LEASE_SECONDS"),
        ({"RELIABILITY_LEASE_SECONDS": 0}, "RELIABILITY_LEASE_SECONDS"),
        ({"RELIABILITY_CLAIM_BATCH": 0}, "RELIABILITY_CLAIM_BATCH"),
        ({"RELIABILITY_ORDER": "random"}, "RELIABILITY_ORDER"),
        ({"RELIABILITY_DATABASE_URL": "  "}, "RELIABILITY_DATABASE_URL"),
        (
            {"RELIABILITY_LEASE_SECONDS": 10, "RELIABILITY_HEARTBEAT_SECONDS": 20},
            "RELIABILITY_HEARTBEAT_SECONDS",
        ),
        ({"RELIABILITY_AUTO_MIGRATE": "maybe"}, "RELIABILITY_AUTO_MIGRATE"),
    ],
)
def test_bad_values_name_the_setting(settings, named):
    with pytest.raises(SettingError, match=named):
        Config.from_settings(Settings(settings))


def test_addon_sets_components_at_addon_priority():
    from scrapy_reliability import Addon

    settings = Settings({"DUPEFILTER_CLASS": "my.Filter"}, priority="project")
    Addon(crawler=None).update_settings(settings)  # type: ignore[arg-type]
    assert settings["SCHEDULER"] == "scrapy_reliability.Scheduler"
    # The user's explicit setting wins over the add-on's.
    assert settings["DUPEFILTER_CLASS"] == "my.Filter"


def test_addon_rejects_bad_settings_at_startup():
    from scrapy_reliability import Addon

    settings = Settings({"RELIABILITY_ORDER": "sideways"})
    with pytest.raises(SettingError, match="RELIABILITY_ORDER"):
        Addon(crawler=None).update_settings(settings)  # type: ignore[arg-type]
