"""How a connector reaches a Schema Registry: the options both directions of ``kafka-eos`` take (the source's
decoding, the sink's encoding), declared once; a connector's options class derives from ``RegistryOptions``."""

from __future__ import annotations

from dataclasses import dataclass

from eos_core.options import option
from eos_core.registry_avro import DEFAULT_TIMEOUT_MS, RegistryConf

__all__ = ["RegistryOptions"]


@dataclass(frozen=True, kw_only=True)
class RegistryOptions:
    schema_registry_url: str | None = option(
        "schema.registry.url",
        "str",
        description="The Schema Registry (Confluent's REST API: Confluent, Karapace, Redpanda; Apicurio at .../apis/ccompat/v7) of the avro formats.",
    )
    schema_registry_user_info: str | None = option(
        "schema.registry.basic.auth.user.info",
        "str",
        secret=True,
        description="user:password of the registry's basic authentication (redacted everywhere).",
    )
    schema_registry_ca: str | None = option(
        "schema.registry.ssl.ca.location",
        "str",
        description="A CA file (PEM) that signed an https registry's certificate.",
    )
    schema_registry_timeout_ms: int = option(
        "schema.registry.request.timeout.ms",
        "int",
        default=DEFAULT_TIMEOUT_MS,
        min=1,
        description="Longest wait for one answer of the Schema Registry; the client tries 4 times with backoff, then the read or write fails naming the registry.",
    )

    def registry_conf(self) -> RegistryConf:
        return RegistryConf(
            url=(self.schema_registry_url or "").strip(),
            user_info=self.schema_registry_user_info,
            ca_location=self.schema_registry_ca,
            timeout_ms=self.schema_registry_timeout_ms,
        )
