"""The reconciler's configuration takes the defaults of its settings from Settings."""

from __future__ import annotations

from app.config import Settings
from app.pass_config import ReconcilerConfig


def test_the_defaults_are_those_of_the_settings() -> None:
    assert ReconcilerConfig() == ReconcilerConfig.from_settings(Settings(database_url="x"))


def test_a_setting_reaches_the_config_in_the_config_s_unit() -> None:
    settings = Settings(
        database_url="x",
        retry_base_delay_ms=50,
        idempotency_retention_hours=2,
        finished_task_retention_hours=3,
        batch_size=7,
    )
    config = ReconcilerConfig.from_settings(settings)
    assert config.retry_base_delay_seconds == 0.05
    assert config.idempotency_retention_seconds == 7200
    assert config.finished_retention_seconds == 10800
    assert config.batch_size == 7
